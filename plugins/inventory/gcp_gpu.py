# Copyright: forja contributors
# Apache-2.0
"""Dynamic inventory of Compute Engine GPU VMs for forja."""

from __future__ import annotations

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
  - The VMs of one cluster (the C(forja.gpu.gcp_instance) role's C(gcp_instance_count) > 1, with labels
    C(forja-cluster), C(forja-rank), C(forja-cluster-size)) form the group C(cluster_<name>), and each
    gets C(forja_cluster), C(forja_node_rank), C(forja_node_count), C(forja_rendezvous_host) (the
    rank-0 VM's private IP, which the cluster's firewall rule admits) and C(forja_rendezvous_port)
    (torchrun's c10d port, 29400), which is what C(torchrun --node-rank --nnodes --rdzv-endpoint) takes.
  - The VM's name and network tags are the hostvars C(instance_name) and C(network_tags), because
    C(name) and C(tags) are reserved play keywords.
  - Metadata values are not exposed by default, because they hold C(ssh-keys) and startup scripts. Only
    the keys
    are (C(metadata_keys)).
  - Never silently empty. Authentication, permission, unknown-project (404) and network errors fail with
    a message naming the project and the cause. Make Ansible treat that as fatal with
    C(ANSIBLE_INVENTORY_UNPARSED_FAILED=true) (forja's C(ansible.cfg) should set it).
  - The configuration file name must end in C(gcp_gpu.yml) or C(gcp_gpu.yaml). An option this plugin does
    not have (C(zone) for O(zones), C(credential_file)) is an error naming the closest option, never
    silently ignored, because a misspelt filter would widen the inventory to VMs nobody meant.
  - When a source puts no VM into O(managed_group), it publishes what it listed as the variable
    C(gcp_gpu_searched) of the C(all) group (which the controller's C(localhost) sees too), one entry per
    project, with C(source), C(project), C(zones), C(all_zones), C(filter) and C(summary), a sentence
    naming them. forja's C(playbooks/require_hosts.yml) quotes it when a play finds no host.
version_added: "0.1.0"
author: forja contributors (@forja)
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
  managed_only:
    description:
      - Only VMs carrying O(managed_label), filtered on the server like O(labels).
      - With no O(zones) this lists every zone of the project in one C(aggregatedList) call per 500 VMs,
        so a VM that a stock-out moved to a fallback zone (or that C(-e gcp_instance_zone=...) put
        anywhere else) is still found, without this file repeating the zones.
    type: bool
    default: false
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
# Smallest useful config; project and key from FORJA_GCP_PROJECT and FORJA_GCP_CREDENTIALS_FILE.
plugin: forja.gpu.gcp_gpu

---
# forja's VMs in every zone of the project (inventory/gcp_gpu.yml): wherever a stock-out put them.
plugin: forja.gpu.gcp_gpu
managed_only: true

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

import difflib
import hashlib
import json
from collections.abc import Iterable

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    GcpClient,
    GcpConfig,
    GcpError,
    short_name,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import (
    CLUSTER_LABEL,
    RANK_LABEL,
    RENDEZVOUS_PORT,
    SIZE_LABEL,
    instance_facts,
    metadata_dict,
)

HOSTNAME_SOURCES = ("name", "public_ip", "private_ip")
#: The all-group variable that says what each gcp_gpu source listed (read by playbooks/require_hosts.yml).
SEARCHED_VAR = "gcp_gpu_searched"
#: Bumped when the cached form changes; an entry of another version is a cache miss.
CACHE_VERSION = 2


def unknown_options(given: Iterable[str], known: Iterable[str]) -> list[str]:
    """One message per option of the file that the plugin does not have, naming the closest one.

    Ansible ignores unknown keys of a plugin's configuration; a misspelt ``zones`` or ``filters``
    would silently widen the inventory, a misspelt ``credentials_file`` end in "no credentials".
    """
    names = sorted(set(known))
    problems = []
    for key in sorted(set(map(str, given)) - set(names)):
        close = difflib.get_close_matches(key, names, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"the options are: {', '.join(names)}"
        problems.append(f"'{key}' is not an option of forja.gpu.gcp_gpu; {hint}")
    return problems


def searched(source: str, project: str, zones: list[str], all_zones: bool, filter_expr: str | None) -> dict:
    """What one listing looked at, with a sentence for a message that says where a VM was not found."""
    where = f"every zone ({len(zones)}: {', '.join(zones)})" if all_zones else f"zones {', '.join(zones)}"
    summary = f"{source} listed project '{project}' in {where}"
    if filter_expr:
        summary += f" with filter {filter_expr}"
    return {
        "source": source,
        "project": project,
        "zones": zones,
        "all_zones": all_zones,
        "filter": filter_expr or "",
        "summary": summary,
    }


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


def cluster_vars(records: list[dict]) -> dict[str, dict]:
    """Per cluster member (by instance name): its cluster, rank, node count and rendezvous address.

    A cluster is the VMs of one project with the same ``forja-cluster`` label; the node count is
    the size the role declared (``forja-cluster-size``), so a lost member still counts; the
    rendezvous host is rank 0's private address (None while rank 0 is missing).
    """
    rank0: dict[tuple[str, str], str | None] = {}
    members: list[tuple[dict, tuple[str, str], int]] = []
    for record in records:
        labels = record.get("labels") or {}
        name, rank = labels.get(CLUSTER_LABEL), labels.get(RANK_LABEL)
        if not name or rank is None or not str(rank).isdigit():
            continue
        key = (str(record.get("project")), str(name))
        members.append((record, key, int(rank)))
        if int(rank) == 0:
            rank0[key] = record.get("private_ip")
    found: dict[str, dict] = {}
    for record, key, rank in members:
        size = str((record.get("labels") or {}).get(SIZE_LABEL) or "")
        found[str(record.get("instance_name"))] = {
            "forja_cluster": key[1],
            "forja_node_rank": rank,
            "forja_node_count": int(size) if size.isdigit() else sum(1 for m in members if m[1] == key),
            "forja_rendezvous_host": rank0.get(key),
            "forja_rendezvous_port": RENDEZVOUS_PORT,
        }
    return found


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

    def _read_config_data(self, path):
        """The base reader, then: every key of the file must be an option (with a "did you mean")."""
        config = super()._read_config_data(path)
        problems = unknown_options(config, self._options)
        if problems:
            raise AnsibleParserError(f"{path}: " + "; ".join(problems))
        self._config_digest = hashlib.sha256(
            json.dumps(config, sort_keys=True, default=str).encode()
        ).hexdigest()
        return config

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
        entry = None
        if use_cache:
            try:
                entry = self._cache[cache_key]
            except KeyError:
                update_cache = True
            # An entry from an older forja, or from this file before it was edited, is a miss.
            if entry is not None and not (
                isinstance(entry, dict)
                and entry.get("version") == CACHE_VERSION
                and entry.get("config") == self._config_digest
            ):
                entry, update_cache = None, True
        if entry is None:
            records, looked_at = self._list_records(path)
            entry = {
                "version": CACHE_VERSION,
                "config": self._config_digest,
                "records": records,
                "searched": looked_at,
            }
        if not self._populate(entry["records"]):
            self._publish_searched(entry["searched"])
        if update_cache:
            self._cache[cache_key] = entry

    def _publish_searched(self, looked_at: list[dict]) -> None:
        """Add this source's listings to the all-group variable (several sources add up).

        Only from a source that found no managed VM: that is when a play has no host and says where
        the inventory looked. An all-group variable reaches every host's variables, so publishing it
        always would grow every host's record (and `ansible-inventory --list`) for nothing.
        """
        before = self.inventory.groups["all"].vars.get(SEARCHED_VAR) or []
        self.inventory.set_variable("all", SEARCHED_VAR, [*before, *looked_at])

    def _projects(self) -> list[str]:
        projects = list(self.get_option("projects") or [])
        if not projects:
            config = GcpConfig()
            if config.resolved_project():
                projects = [config.resolved_project()]
        if not projects:
            raise AnsibleParserError(
                "projects: no project given; set FORJA_GCP_PROJECT to your project ID (export "
                "FORJA_GCP_PROJECT=my-project), or list it as projects: [my-project] in this file"
            )
        return projects

    def _list_records(self, source: str) -> tuple[list[dict], list[dict]]:
        """The VMs' records and what was looked at; one client (one token, one HTTP session) for all."""
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
        labels = dict(self.get_option("labels") or {})
        if self.get_option("managed_only"):
            labels.update({k: str(v) for k, v in (self.get_option("managed_label") or {}).items()})
        filter_expr = build_filter(self.get_option("filters") or [], labels)
        size = max(1, min(500, int(self.get_option("max_results"))))
        preference = tuple(self.get_option("ansible_host_preference"))
        expose = bool(self.get_option("expose_metadata"))
        records: list[dict] = []
        looked_at: list[dict] = []
        for project in self._projects():
            try:
                if len(zones) == 1:
                    instances = client.zone_instances(project, zones[0], filter_expr, size)
                    looked_at.append(searched(source, project, zones, False, filter_expr))
                else:
                    instances, listed = client.aggregated_instances_and_zones(project, filter_expr, size)
                    looked_at.append(
                        searched(source, project, zones or sorted(listed), not zones, filter_expr)
                    )
                    if zones:
                        instances = [i for i in instances if short_name(i.get("zone")) in zones]
                        for zone in sorted(set(zones) - listed):
                            self.display.warning(
                                f"gcp_gpu: zones: '{zone}' is not a zone of project '{project}' (the API "
                                "listed no such zone); check its spelling"
                            )
            except GcpError as exc:
                # The cause first, in its own words (it names its field and fix). Not chained: Ansible
                # would append the cause's text to the message a second time.
                raise AnsibleParserError(
                    f"{exc.message} (while listing the VMs of project '{project}')"
                ) from None
            records.extend(host_record(i, preference, expose) for i in instances)
        paths = self.get_option("guest_attributes") or []
        for record in records:
            if record.get("status") != "RUNNING":
                found: dict[str, str] = {}
                for path in paths:
                    found.update(self._guest_attributes(client, record, path))
                if found:
                    record["guest_attributes"] = found
        return records, looked_at

    def _guest_attributes(self, client: GcpClient, record: dict, path: str) -> dict[str, str]:
        """What the stopped VM left under a namespace (e.g. autostop's reason); nothing when unset.

        A VM without guest attributes (never written, or not enabled) answers 404; any other error
        only costs the enrichment, never the inventory.
        """
        link = f"projects/{record['project']}/zones/{record['zone']}/instances/{record['instance_name']}"
        try:
            found = client.request(
                "GET", f"{link}/getGuestAttributes", params={"queryPath": path}, allow_404=True
            )
        except GcpError as exc:
            self.display.vvv(f"gcp_gpu: guest attributes of {record['instance_name']}: {exc.message}")
            return {}
        items = ((found or {}).get("queryValue") or {}).get("items") or []
        return {f"{i.get('namespace')}/{i.get('key')}": str(i.get("value", "")) for i in items}

    def _populate(self, records: list[dict]) -> int:
        """Add the hosts, their variables and groups; return how many joined the managed group."""
        managed_count = 0
        strict = self.get_option("strict")
        managed = self.get_option("managed_label") or {}
        managed_group = self.inventory.add_group(self.get_option("managed_group"))
        sources = self.get_option("hostnames")
        clusters = cluster_vars(records)
        for record in records:
            hostname = hostname_of(record, sources)
            if not hostname:
                continue
            self.inventory.add_host(hostname)
            for key, value in record.items():
                self.inventory.set_variable(hostname, key, value)
            cluster = clusters.get(str(record.get("instance_name")))
            if cluster:
                for key, value in cluster.items():
                    self.inventory.set_variable(hostname, key, value)
                group = self.inventory.add_group(f"cluster_{sanitize(cluster['forja_cluster'])}")
                self.inventory.add_child(group, hostname)
            labels = record.get("labels") or {}
            if managed and all(labels.get(k) == str(v) for k, v in managed.items()):
                self.inventory.add_child(managed_group, hostname)
                managed_count += 1
            gpu_group = self.inventory.add_group(f"gpu_{sanitize(record.get('gpu_type') or 'none')}")
            self.inventory.add_child(gpu_group, hostname)
            status_group = self.inventory.add_group(f"status_{sanitize(record.get('status') or 'unknown')}")
            self.inventory.add_child(status_group, hostname)
            self._set_composite_vars(self.get_option("compose"), record, hostname, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), record, hostname, strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), record, hostname, strict=strict)
        return managed_count
