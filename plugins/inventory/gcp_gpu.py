# Copyright: forja contributors
# Apache-2.0
"""Dynamic inventory of Compute Engine GPU VMs for forja."""

from __future__ import annotations

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    GcpClient,
    GcpConfig,
    GcpError,
    short_name,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import (
    instance_facts,
    metadata_dict,
)

DOCUMENTATION = r"""
name: gcp_gpu
short_description: Compute Engine GPU VMs as an Ansible inventory
description:
  - Lists the VMs of one or more GCP projects with one authenticated session per run (one token request),
    and makes them Ansible hosts with short hostvars (zone, machine_type, gpu_type, gpu_count,
    provisioning_model, status, ip...) and C(ansible_host) set to the public IP, else the private one.
  - Without O(zones), a project costs one C(instances.aggregatedList) request per 500 VMs. With exactly one
    zone, that zone is listed with C(instances.list) (server-side, never more requests); with several zones,
    one aggregated listing is filtered on the client, which never costs more than ⌈n/500⌉ requests.
  - Groups every VM carrying the managed label (C(forja=managed) by default) into C(forja_gpu), and every
    VM into C(gpu_<type>) (or C(gpu_none)) and C(status_<status>).
  - The VM's name and network tags are the hostvars C(instance_name) and C(network_tags), because
    C(name) and C(tags) are reserved play keywords.
  - Metadata values are not exposed by default, because they hold C(ssh-keys) and startup scripts. Only
    the keys
    are (C(metadata_keys)).
  - Never silently empty. Authentication, permission, unknown-project (404) and network errors fail with
    a message naming the project and the cause. Make Ansible treat that as fatal with
    C(ANSIBLE_INVENTORY_UNPARSED_FAILED=true) (forja's C(ansible.cfg) should set it).
  - The configuration file name must end in C(gcp_gpu.yml) or C(gcp_gpu.yaml).
version_added: "0.1.0"
author: forja contributors
extends_documentation_fragment:
  - constructed
  - inventory_cache
  - forja.gpu.gcp_auth
options:
  plugin:
    description: Marks this as an instance of the gcp_gpu plugin.
    required: true
    choices: [forja.gpu.gcp_gpu]
  projects:
    description: Project IDs to list. Defaults to E(FORJA_GCP_PROJECT).
    type: list
    elements: str
    default: []
  zones:
    description: Only VMs in these zones (all zones if empty).
    type: list
    elements: str
    default: []
  filters:
    description:
      - Compute API filter expressions, each wrapped in parentheses and ANDed, sent to the server.
      - For example C(status = RUNNING) or C(name = forja-*).
    type: list
    elements: str
    default: []
  labels:
    description: Only VMs with all these labels (sent to the server as C(labels.KEY = VALUE) filters).
    type: dict
    default: {}
  managed_label:
    description: The label (key and value) that puts a VM into O(managed_group).
    type: dict
    default: {forja: managed}
  managed_group:
    description: Group of the VMs that carry O(managed_label); forja's plays target it.
    type: str
    default: forja_gpu
  hostnames:
    description: Inventory hostname of each VM; the first set wins (C(name), C(public_ip), C(private_ip)).
    type: list
    elements: str
    default: [name]
  ansible_host_preference:
    description: Which address becomes C(ansible_host), in order of preference.
    type: list
    elements: str
    default: [public_ip, private_ip]
  expose_metadata:
    description: Also expose metadata values as the hostvar C(metadata). Off because they hold secrets.
    type: bool
    default: false
  guest_attributes:
    description:
      - Guest-attribute namespaces (C(NAMESPACE/)) read for every VM that is not RUNNING and exposed as the
        hostvar C(guest_attributes), a mapping of C(NAMESPACE/KEY) to value (only when some are set).
      - forja's autostop agent records why it stopped the VM under C(forja/autostop); with C([forja/]) here
        forja can say so while the VM is stopped. One API call per stopped VM and namespace.
    type: list
    elements: str
    default: []
  max_results:
    description: Page size of list calls (the API allows up to 500).
    type: int
    default: 500
  retries:
    description: Retries (with exponential backoff) of a request that met a 429, a 5xx or a network error.
    type: int
    default: 5
"""

EXAMPLES = r"""
# Smallest useful config (inventory/gcp_gpu.yml); project and key from FORJA_GCP_PROJECT and
# FORJA_GCP_CREDENTIALS_FILE.
plugin: forja.gpu.gcp_gpu

---
# One project, one zone, only running VMs, cached for ten minutes.
plugin: forja.gpu.gcp_gpu
projects: [my-project]
zones: [us-east1-d]
filters:
  - status = RUNNING
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: ~/.cache/forja/inventory
cache_timeout: 600

---
# Everything: labels filtered on the server, private addresses, extra groups and variables.
plugin: forja.gpu.gcp_gpu
projects: [my-project, other-project]
labels:
  team: research
ansible_host_preference: [private_ip, public_ip]
hostnames: [name]
compose:
  ansible_user: "'ansible'"
  hourly_usd: "0.85 if provisioning_model == 'STANDARD' else 0.30"
groups:
  spot: provisioning_model == 'SPOT'
keyed_groups:
  - key: zone
    prefix: zone
  - key: labels.owner | default('nobody')
    prefix: owner
"""

HOSTNAME_SOURCES = ("name", "public_ip", "private_ip")


def sanitize(text: str) -> str:
    """Group-name safe, lowercase: ``nvidia-l4`` -> ``nvidia_l4``."""
    return "".join(c if c.isalnum() else "_" for c in str(text).lower())


def build_filter(filters: list[str], labels: dict[str, str]) -> str | None:
    """Filter expressions and label matches, ANDed the way the Compute API reads several expressions."""
    parts = [f"({f})" for f in filters]
    parts += [f"(labels.{key} = {value})" for key, value in sorted(labels.items())]
    return " ".join(parts) or None


def host_record(instance: dict, host_preference: tuple[str, ...], expose_metadata: bool) -> dict:
    """Hostvars of one VM: the short facts, ansible_host, and metadata values only when asked."""
    facts = instance_facts(instance, host_preference)
    # "name" and "tags" are play keywords: Ansible warns once per host for variables so named.
    facts["instance_name"] = facts.pop("name")
    facts["network_tags"] = facts.pop("tags")
    facts["ansible_host"] = facts["ip"]
    if expose_metadata:
        facts["metadata"] = metadata_dict(instance)
    return facts


def hostname_of(record: dict, sources: list[str]) -> str | None:
    """The first configured source that is set (``name`` is the instance name)."""
    for source in sources:
        source = "instance_name" if source == "name" else source
        if record.get(source):
            return str(record[source])
    return None


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    """Read config -> cached or listed -> populate -> update cache."""

    NAME = "forja.gpu.gcp_gpu"

    def verify_file(self, path: str) -> bool:
        return super().verify_file(path) and path.endswith(("gcp_gpu.yml", "gcp_gpu.yaml"))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        for source in self.get_option("hostnames"):
            if source not in HOSTNAME_SOURCES:
                raise AnsibleParserError(
                    f"hostnames: '{source}' must be one of {', '.join(HOSTNAME_SOURCES)}"
                )
        for source in self.get_option("ansible_host_preference"):
            if source not in ("public_ip", "private_ip"):
                raise AnsibleParserError(
                    f"ansible_host_preference: '{source}' must be public_ip or private_ip"
                )
        cache_key = self.get_cache_key(path)
        use_cache = self.get_option("cache") and cache
        update_cache = self.get_option("cache") and not cache
        records = None
        if use_cache:
            try:
                records = self._cache[cache_key]
            except KeyError:
                update_cache = True
        if records is None:
            records = self._list_records()
        self._populate(records)
        if update_cache:
            self._cache[cache_key] = records

    def _projects(self) -> list[str]:
        projects = list(self.get_option("projects") or [])
        if not projects:
            config = GcpConfig()
            if config.resolved_project():
                projects = [config.resolved_project()]
        if not projects:
            raise AnsibleParserError(
                "projects: no project given; set projects in the gcp_gpu.yml file or FORJA_GCP_PROJECT"
            )
        return projects

    def _list_records(self) -> list[dict]:
        """One client (one token, one HTTP session) for every project of this run."""
        client = GcpClient(
            GcpConfig(
                api_url=self.get_option("api_url"),
                auth_kind=self.get_option("auth_kind"),
                credentials_file=self.get_option("credentials_file"),
                access_token=self.get_option("access_token"),
                request_timeout_s=float(self.get_option("request_timeout")),
                max_retries=int(self.get_option("retries")),
                user_agent="forja-gcp-inventory/0.1",
            )
        )
        zones = list(self.get_option("zones") or [])
        filter_expr = build_filter(self.get_option("filters") or [], self.get_option("labels") or {})
        size = max(1, min(500, int(self.get_option("max_results"))))
        preference = tuple(self.get_option("ansible_host_preference"))
        expose = bool(self.get_option("expose_metadata"))
        records: list[dict] = []
        for project in self._projects():
            try:
                if len(zones) == 1:
                    instances = client.zone_instances(project, zones[0], filter_expr, size)
                else:
                    instances, listed = client.aggregated_instances_and_zones(project, filter_expr, size)
                    if zones:
                        instances = [i for i in instances if short_name(i.get("zone")) in zones]
                        for zone in sorted(set(zones) - listed):
                            self.display.warning(
                                f"gcp_gpu: zones: '{zone}' is not a zone of project '{project}' (the API "
                                "listed no such zone); check its spelling"
                            )
            except GcpError as exc:
                raise AnsibleParserError(
                    f"gcp_gpu: listing VMs of project '{project}' failed: {exc.message}", orig_exc=exc
                ) from exc
            records.extend(host_record(i, preference, expose) for i in instances)
        paths = self.get_option("guest_attributes") or []
        for record in records:
            if record.get("status") != "RUNNING":
                found: dict[str, str] = {}
                for path in paths:
                    found.update(self._guest_attributes(client, record, path))
                if found:
                    record["guest_attributes"] = found
        return records

    def _guest_attributes(self, client: GcpClient, record: dict, path: str) -> dict[str, str]:
        """What the stopped VM left under a namespace (e.g. autostop's reason); nothing when unset.

        A VM without guest attributes (never written, or not enabled) answers 404; any other error
        only costs the enrichment, never the inventory.
        """
        link = f"projects/{record['project']}/zones/{record['zone']}/instances/{record['instance_name']}"
        try:
            found = client.request("GET", f"{link}/getGuestAttributes", params={"queryPath": path},
                                   allow_404=True)
        except GcpError as exc:
            self.display.vvv(f"gcp_gpu: guest attributes of {record['instance_name']}: {exc.message}")
            return {}
        items = ((found or {}).get("queryValue") or {}).get("items") or []
        return {f"{i.get('namespace')}/{i.get('key')}": str(i.get("value", "")) for i in items}

    def _populate(self, records: list[dict]) -> None:
        strict = self.get_option("strict")
        managed = self.get_option("managed_label") or {}
        managed_group = self.inventory.add_group(self.get_option("managed_group"))
        sources = self.get_option("hostnames")
        for record in records:
            hostname = hostname_of(record, sources)
            if not hostname:
                continue
            self.inventory.add_host(hostname)
            for key, value in record.items():
                self.inventory.set_variable(hostname, key, value)
            labels = record.get("labels") or {}
            if managed and all(labels.get(k) == str(v) for k, v in managed.items()):
                self.inventory.add_child(managed_group, hostname)
            gpu_group = self.inventory.add_group(f"gpu_{sanitize(record.get('gpu_type') or 'none')}")
            self.inventory.add_child(gpu_group, hostname)
            status_group = self.inventory.add_group(f"status_{sanitize(record.get('status') or 'unknown')}")
            self.inventory.add_child(status_group, hostname)
            self._set_composite_vars(self.get_option("compose"), record, hostname, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), record, hostname, strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), record, hostname, strict=strict)
