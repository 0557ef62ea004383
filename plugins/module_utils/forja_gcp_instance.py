# Copyright: forja contributors
# Apache-2.0
"""Pure functions between the Compute API's Instance JSON and what forja asks for or reports.

Kept free of I/O so they can be tested with tables: the facts the inventory and the module
expose, the insert body, and the normalised view used to decide "changed". Normalising is what
makes a second run report ok: the API answers with full URLs where we sent partial ones, fills
in defaults (``provisioningModel: STANDARD``, Spot's ``instanceTerminationAction: STOP``), and
lists the G2 GPU that the machine type attaches by itself.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ansible_collections.forja.gpu.plugins.module_utils.forja_durations import seconds as duration_seconds
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import GcpClient, short_name
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_machines import (
    FLEX_START_SERIES,
    GpuSpec,
    gpus_of_machine_type,
    qualifies_for_flex_start,
)

NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
METADATA_KEY_RE = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
TAG_RE = NAME_RE
IP_PREFERENCES = ("public_ip", "private_ip")
DISK_TYPES = ("pd-balanced", "pd-ssd", "pd-standard", "pd-extreme", "hyperdisk-balanced")
DISK_INTERFACES = ("NVME", "SCSI")
TERMINATION_ACTIONS = ("STOP", "DELETE")
#: The provisioning models forja offers, as the user writes them, and as the API spells them.
PROVISIONING_MODELS = {"standard": "STANDARD", "spot": "SPOT", "flex_start": "FLEX_START"}
#: A Flex-start VM runs at most 7 days (cloud.google.com/compute/docs/instances/about-flex-start-vms).
FLEX_START_MAX_RUN_S = 7 * 24 * 3600
#: How long a Flex-start request may wait in Google's queue: "up to two hours" (Google's GA blog post,
#: "Introducing Flex-start VMs", 2025-09-25; the field is `params.requestValidForDuration`).
FLEX_START_MAX_WAIT_S = 2 * 3600
#: What a Flex-start VM does at its end when nothing is said: DELETE (its checkpoint is in the bucket
#: by then; a stopped Flex-start VM would keep billing its disk and queue again to start).
FLEX_START_DEFAULT_ACTION = "DELETE"
#: The status of a Flex-start VM whose request waits for capacity (the discovery document's words:
#: "For Flex Start provisioning instance is waiting for available capacity from DWS").
PENDING_STATUS = "PENDING"
MANAGED_LABEL = ("forja", "managed")
# The labels that make VMs one cluster (the gcp_instance role sets them when gcp_instance_count > 1;
# the inventory groups by them): the cluster's name, each VM's rank, and how many VMs it has.
CLUSTER_LABEL = "forja-cluster"
RANK_LABEL = "forja-rank"
SIZE_LABEL = "forja-cluster-size"
# torchrun's c10d rendezvous port on the rank-0 VM, and the ports a cluster's firewall rule opens
# between its VMs: that port and the range NCCL's and gloo's sockets bind to (Linux's default
# ephemeral range, net.ipv4.ip_local_port_range).
RENDEZVOUS_PORT = 29400
CLUSTER_PORTS = (str(RENDEZVOUS_PORT), "32768-60999")


class SpecError(ValueError):
    """Bad input: the message names the field and the fix."""


def duration_s(value: Any, field_name: str) -> int:
    """Whole seconds from "3d", "12h", "1d12h", "90m", "600s" or a number of seconds (forja_durations);
    SpecError otherwise."""
    try:
        return int(duration_seconds(value, field_name))
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def provisioning_model_of(params: dict[str, Any]) -> str | None:
    """The API's provisioning model the parameters ask for; None when neither option is set.

    `provisioning_model` wins; unset, it derives from `spot` (true: SPOT, false: STANDARD), so a
    playbook written for `spot` keeps working. Both set and disagreeing is an error.
    """
    model = params.get("provisioning_model") or None
    spot = params.get("spot")
    if model is None:
        return None if spot is None else ("SPOT" if spot else "STANDARD")
    if model not in PROVISIONING_MODELS:
        raise SpecError(
            f"provisioning_model: '{model}' must be one of {', '.join(PROVISIONING_MODELS)}"
        )
    wanted = PROVISIONING_MODELS[model]
    if spot is not None and (wanted == "SPOT") != bool(spot):
        raise SpecError(
            f"spot: {bool(spot)} contradicts provisioning_model: {model}; drop spot (provisioning_model "
            "replaces it) or make them agree"
        )
    return wanted


def project_of(instance: dict[str, Any]) -> str:
    """The project in an instance's selfLink (``.../projects/<p>/zones/...``)."""
    match = re.search(r"/projects/([^/]+)/", str(instance.get("selfLink", "")))
    return match.group(1) if match else ""


def ips_of(instance: dict[str, Any]) -> tuple[str | None, str | None]:
    """(public, private) IP of the first network interface that has them."""
    public = private = None
    for nic in instance.get("networkInterfaces") or []:
        private = private or nic.get("networkIP")
        for access in nic.get("accessConfigs") or []:
            public = public or access.get("natIP")
    return public, private


def choose_ip(
    public: str | None, private: str | None, preference: tuple[str, ...] = IP_PREFERENCES
) -> str | None:
    """The address Ansible should connect to: the first of the preference order that is set."""
    values = {"public_ip": public, "private_ip": private}
    for key in preference:
        if values.get(key):
            return values[key]
    return None


def gpus_of_instance(instance: dict[str, Any]) -> tuple[str | None, int]:
    """GPU model and count: from guestAccelerators, else what the machine type attaches (G2 etc.)."""
    accelerators = instance.get("guestAccelerators") or []
    if accelerators:
        first = accelerators[0]
        return short_name(first.get("acceleratorType")) or None, sum(
            int(a.get("acceleratorCount", 0)) for a in accelerators
        )
    return gpus_of_machine_type(short_name(instance.get("machineType")))


def provisioning_of(instance: dict[str, Any]) -> tuple[str, str | None]:
    """(provisioning model, termination action) with the server's defaults made explicit."""
    scheduling = instance.get("scheduling") or {}
    model = scheduling.get("provisioningModel") or ("SPOT" if scheduling.get("preemptible") else "STANDARD")
    action = scheduling.get("instanceTerminationAction") or ("STOP" if model == "SPOT" else None)
    if action == "INSTANCE_TERMINATION_ACTION_UNSPECIFIED":
        action = "STOP" if model == "SPOT" else None
    return model, action


def metadata_dict(instance: dict[str, Any]) -> dict[str, str]:
    """``{items: [{key, value}]}`` -> ``{key: value}``."""
    return {
        item["key"]: item.get("value", "") for item in (instance.get("metadata") or {}).get("items") or []
    }


def instance_facts(
    instance: dict[str, Any], ip_preference: tuple[str, ...] = IP_PREFERENCES
) -> dict[str, Any]:
    """The short, stable facts the inventory and the module expose (no metadata values: they hold secrets)."""
    public, private = ips_of(instance)
    gpu_type, gpu_count = gpus_of_instance(instance)
    model, action = provisioning_of(instance)
    nics = instance.get("networkInterfaces") or [{}]
    return {
        "name": instance.get("name"),
        "id": str(instance.get("id", "")) or None,
        "project": project_of(instance),
        "zone": short_name(instance.get("zone")),
        "status": instance.get("status"),
        "machine_type": short_name(instance.get("machineType")),
        "gpu_type": gpu_type,
        "gpu_count": gpu_count,
        "provisioning_model": model,
        "preemptible": model == "SPOT",
        "instance_termination_action": action,
        # Flex-start: the longest it runs, and when Google ends it (set once it runs).
        "max_run_duration_s": max_run_duration_of(instance),
        "ends_at": ends_at_of(instance),
        "ip": choose_ip(public, private, ip_preference),
        "public_ip": public,
        "private_ip": private,
        "network": short_name(nics[0].get("network")) or None,
        "labels": dict(instance.get("labels") or {}),
        "tags": sorted((instance.get("tags") or {}).get("items") or []),
        "metadata_keys": sorted(metadata_dict(instance)),
        "boot_disk_size_gb": boot_disk_size_of(instance),
        # the VM's identity on Google's APIs: what a bucket's IAM policy grants (the gcp_bucket role)
        "service_account": ((instance.get("serviceAccounts") or [{}])[0]).get("email"),
        "self_link": instance.get("selfLink"),
        "creation_timestamp": instance.get("creationTimestamp"),
        "last_start_timestamp": instance.get("lastStartTimestamp"),
        "last_stop_timestamp": instance.get("lastStopTimestamp"),
    }


def max_run_duration_of(instance: dict[str, Any]) -> int | None:
    """scheduling.maxRunDuration in seconds (a Duration's `seconds` is a string on the wire)."""
    duration = (instance.get("scheduling") or {}).get("maxRunDuration") or {}
    seconds = duration.get("seconds")
    return int(seconds) if seconds not in (None, "") else None


def ends_at_of(instance: dict[str, Any]) -> str | None:
    """When Google ends the VM (RFC 3339): resourceStatus.scheduling.terminationTimestamp, else the
    asked scheduling.terminationTime; None for a VM that has no end (Spot, standard)."""
    status = ((instance.get("resourceStatus") or {}).get("scheduling") or {}).get("terminationTimestamp")
    return status or (instance.get("scheduling") or {}).get("terminationTime") or None


def boot_disk_size_of(instance: dict[str, Any]) -> int | None:
    """Boot disk size in GB (it is billed while the VM is stopped; the cost guard needs it)."""
    size = boot_disk_of(instance).get("diskSizeGb")
    return int(size) if size not in (None, "") else None


def value_digest(value: str) -> str:
    """A short digest that shows a metadata value changed without showing it (ssh-keys, scripts)."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:12]


@dataclass
class InstanceSpec:
    """What the user asked for, already validated (see ``validate_spec``).

    None means "not asked": the Compute API's own default at creation, and not compared on an
    existing VM. The VM forja wants is stated once, in the gcp_instance role's defaults, which
    pass every value; this module states no VM of its own.
    """

    name: str
    zone: str
    machine_type: str | None
    gpus: GpuSpec | None
    image: str | None
    boot_disk_size_gb: int | None
    boot_disk_type: str | None
    boot_disk_interface: str | None
    network: str | None
    subnetwork: str | None
    external_ip: bool | None
    nic_type: str | None
    tags: list[str]
    labels: dict[str, str]
    metadata: dict[str, str]
    service_account_email: str | None
    scopes: list[str] | None
    spot: bool | None
    instance_termination_action: str | None
    fallback_zones: list[str] = field(default_factory=list)
    # STANDARD, SPOT or FLEX_START; None: not asked (the API's STANDARD at creation, not compared).
    provisioning_model: str | None = None
    # Flex-start only: the longest the VM runs, and how long its request may wait for capacity.
    max_run_duration_s: int | None = None
    request_valid_for_s: int | None = None
    # Names of resource policies (the cluster's compact placement) in the zone's region; None: not asked.
    resource_policies: list[str] | None = None

    @property
    def zones(self) -> list[str]:
        """The zone, then the fallback zones, each once, in order."""
        ordered: list[str] = []
        for zone in [self.zone, *self.fallback_zones]:
            if zone not in ordered:
                ordered.append(zone)
        return ordered

    @property
    def flex_start(self) -> bool:
        return self.provisioning_model == "FLEX_START"

    @property
    def termination_action(self) -> str | None:
        """Spot's action with the server default (STOP) made explicit, Flex-start's with forja's
        (DELETE); None for standard VMs."""
        if self.flex_start:
            return self.instance_termination_action or FLEX_START_DEFAULT_ACTION
        return (self.instance_termination_action or "STOP") if self.spot else None


def image_url(
    image: str | None,
    image_family: str | None,
    image_project: str | None,
    project: str,
    required: bool = True,
) -> str | None:
    """The sourceImage for a family or an image name (partial URLs kept as they are).

    Without image_project the image is the project's own, as for gcloud's --image-project.
    """
    if image and image_family:
        raise SpecError("image: give either image or image_family, not both")
    if not image and not image_family:
        if not required:
            return None
        raise SpecError("image_family: give image_family (with image_project) or image")
    owner = image_project or project
    if image_family:
        return (
            image_family if "/" in image_family else f"projects/{owner}/global/images/family/{image_family}"
        )
    return image if "/" in image else f"projects/{owner}/global/images/{image}"


def validate_labels(labels: dict[str, Any], field_name: str = "labels") -> dict[str, str]:
    """GCP label rules: lowercase keys starting with a letter, values of [a-z0-9_-], 63 chars each."""
    clean: dict[str, str] = {}
    for key, value in (labels or {}).items():
        text = "" if value is None else str(value)
        if not LABEL_KEY_RE.match(str(key)):
            raise SpecError(
                f"{field_name}: key '{key}' must start with a lowercase letter and hold only a-z, 0-9, "
                "'_' or '-' (63 characters at most)"
            )
        if not LABEL_VALUE_RE.match(text):
            raise SpecError(
                f"{field_name}: value of '{key}' must hold only a-z, 0-9, '_' or '-' (63 at most)"
            )
        clean[str(key)] = text
    return clean


def validate_source_ranges(ranges: list[str]) -> list[str]:
    """CIDRs for SSH ingress; refuses the whole internet (the point is IAP or a short list)."""
    clean = []
    for text in ranges:
        try:
            net = ipaddress.ip_network(str(text), strict=False)
        except ValueError as exc:
            raise SpecError(f"source_ranges: '{text}' is not an IP address or CIDR ({exc})") from None
        if net.prefixlen == 0:
            raise SpecError(
                f"source_ranges: '{text}' opens SSH to the whole internet; use Google's IAP range "
                "35.235.240.0/20 (gcloud compute ssh --tunnel-through-iap) or your own address/32"
            )
        clean.append(str(net))
    return clean


def validate_spec(
    params: dict[str, Any], project: str, gpus: GpuSpec | None, creating: bool = True
) -> InstanceSpec:
    """Check the user's parameters; every error names the field and the fix, before any change.

    ``creating``: the run may create the VM, so the image is required (the machine type is, by
    ``resolve_gpus``); otherwise an unset image is simply not compared.
    """
    name = params["name"]
    if not NAME_RE.match(name or ""):
        raise SpecError(
            f"name: '{name}' must be 1-63 lowercase letters, digits or '-', start with a letter and not "
            "end with '-'"
        )
    zones = [params["zone"], *(params.get("fallback_zones") or [])]
    for zone in zones:
        if not ZONE_RE.match(zone or ""):
            field_name = "zone" if zone == params["zone"] else "fallback_zones"
            raise SpecError(f"{field_name}: '{zone}' is not a zone name such as us-east1-d")
    model = provisioning_model_of(params)
    spot = None if model is None else model == "SPOT"
    action = params.get("instance_termination_action")
    if action and model not in ("SPOT", "FLEX_START"):
        raise SpecError(
            f"instance_termination_action: '{action}' applies only to Spot and Flex-start VMs; set "
            "spot: true (or provisioning_model: spot or flex_start) or drop instance_termination_action"
        )
    if action and action not in TERMINATION_ACTIONS:
        raise SpecError(f"instance_termination_action: '{action}' must be STOP or DELETE")
    max_run_s, valid_s = flex_start_durations(params, model)
    size = params.get("boot_disk_size_gb")
    if size is not None and (int(size) < 10 or int(size) > 65536):
        raise SpecError(f"boot_disk_size_gb: {size} is out of range; boot disks are 10 to 65536 GB")
    disk_type = params.get("boot_disk_type") or None
    if disk_type is not None and disk_type not in DISK_TYPES:
        raise SpecError(f"boot_disk_type: '{disk_type}' must be one of {', '.join(DISK_TYPES)}")
    interface = (params.get("boot_disk_interface") or "").upper() or None
    if interface is not None and interface not in DISK_INTERFACES:
        raise SpecError(f"boot_disk_interface: '{interface}' must be NVME or SCSI")
    tags = [str(t) for t in params.get("tags") or []]
    for tag in tags:
        if not TAG_RE.match(tag):
            raise SpecError(f"tags: '{tag}' must be lowercase letters, digits or '-', starting with a letter")
    metadata = {str(k): "" if v is None else str(v) for k, v in (params.get("metadata") or {}).items()}
    for key in metadata:
        if not METADATA_KEY_RE.match(key):
            raise SpecError(f"metadata: key '{key}' must hold only letters, digits, '_' or '-'")
    ssh_keys = [str(k).strip() for k in params.get("ssh_keys") or []]
    for entry in ssh_keys:
        user, _colon, key = entry.partition(":")
        if not user or not key.startswith(("ssh-", "ecdsa-", "sk-")):
            raise SpecError("ssh_keys: each entry must read 'USER:ssh-ed25519 AAAA... comment'")
    if ssh_keys:
        if "ssh-keys" in metadata:
            raise SpecError("metadata: give SSH keys either as ssh_keys or as metadata['ssh-keys'], not both")
        metadata["ssh-keys"] = "\n".join(ssh_keys)
    labels = validate_labels(params.get("labels") or {})
    labels.setdefault(*MANAGED_LABEL)
    policies = params.get("resource_policies")
    for policy in policies or []:
        if not NAME_RE.match(str(policy)):
            raise SpecError(
                f"resource_policies: '{policy}' must be a resource policy's name (lowercase letters, digits "
                "or '-') in the zone's region"
            )
    return InstanceSpec(
        name=name,
        zone=params["zone"],
        machine_type=params.get("machine_type") or None,
        gpus=gpus,
        image=image_url(
            params.get("image"),
            params.get("image_family"),
            params.get("image_project"),
            project,
            required=creating,
        ),
        boot_disk_size_gb=None if size is None else int(size),
        boot_disk_type=disk_type,
        boot_disk_interface=interface,
        network=params.get("network") or None,
        subnetwork=params.get("subnetwork") or None,
        external_ip=params.get("external_ip"),
        nic_type=params.get("nic_type") or None,
        tags=sorted(set(tags)),
        labels=labels,
        metadata=metadata,
        service_account_email=params.get("service_account_email") or None,
        scopes=None if params.get("scopes") is None else list(params["scopes"]),
        spot=spot,
        instance_termination_action=action or None,
        fallback_zones=list(params.get("fallback_zones") or []),
        resource_policies=None if policies is None else sorted({str(p) for p in policies}),
        provisioning_model=model,
        max_run_duration_s=max_run_s,
        request_valid_for_s=valid_s,
    )


def flex_start_durations(params: dict[str, Any], model: str | None) -> tuple[int | None, int | None]:
    """(max run, request valid for) in seconds, checked: both belong to Flex-start alone, the run is
    required and at most 7 days, the wait at most 2 hours. The machine series is checked with the
    machine type (`check_flex_start_machine`)."""
    max_run, valid = params.get("max_run_duration"), params.get("request_valid_for_duration")
    if model != "FLEX_START":
        for name, value in (("max_run_duration", max_run), ("request_valid_for_duration", valid)):
            if value not in (None, ""):
                raise SpecError(
                    f"{name}: '{value}' applies only to Flex-start VMs; set provisioning_model: flex_start "
                    f"or drop {name}"
                )
        return None, None
    if max_run in (None, ""):
        raise SpecError(
            "max_run_duration: required for a Flex-start VM (Google ends it then); give at most 7d, "
            "e.g. max_run_duration: 3d"
        )
    max_run_s = duration_s(max_run, "max_run_duration")
    if not 0 < max_run_s <= FLEX_START_MAX_RUN_S:
        raise SpecError(
            f"max_run_duration: '{max_run}' is {max_run_s} s; a Flex-start VM runs more than 0 s and at most "
            "7 days (7d). Split a longer run into several, resuming from the checkpoint"
        )
    valid_s = None
    if valid not in (None, ""):
        valid_s = duration_s(valid, "request_valid_for_duration")
        if not 0 < valid_s <= FLEX_START_MAX_WAIT_S:
            raise SpecError(
                f"request_valid_for_duration: '{valid}' is {valid_s} s; Google keeps a Flex-start request "
                "queued more than 0 s and at most 2 hours (2h)"
            )
    return max_run_s, valid_s


def check_flex_start_machine(spec: InstanceSpec) -> None:
    """Flex-start takes accelerator-optimized series only (not A4X or G4) and H4D; say which."""
    if spec.flex_start and spec.machine_type and not qualifies_for_flex_start(spec.machine_type):
        raise SpecError(
            f"machine_type: '{spec.machine_type}' cannot be a Flex-start VM; Flex-start takes the "
            f"{', '.join(s.upper() for s in FLEX_START_SERIES)} series (e.g. g2-standard-8 for one L4). "
            "Pick such a machine type, or provisioning_model: spot or standard"
        )


def scheduling_body(spec: InstanceSpec) -> dict[str, Any]:
    """Scheduling: GPUs cannot live-migrate, so TERMINATE on host maintenance whenever a GPU is there."""
    has_gpu = bool(spec.gpus and spec.gpus.gpu_count > 0)
    if spec.flex_start:  # Google's "Create a Flex-start VM": no restart, TERMINATE, a max run duration
        return {
            "provisioningModel": "FLEX_START",
            "instanceTerminationAction": spec.termination_action,
            "maxRunDuration": {"seconds": str(spec.max_run_duration_s)},
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": False,
        }
    if spec.spot:
        return {
            "provisioningModel": "SPOT",
            "instanceTerminationAction": spec.termination_action,
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": False,
        }
    return {
        "provisioningModel": "STANDARD",
        "onHostMaintenance": "TERMINATE" if has_gpu else "MIGRATE",
        "automaticRestart": True,
    }


def insert_body(spec: InstanceSpec, zone: str, project: str) -> dict[str, Any]:
    """The instances.insert body for one zone (zone-scoped URLs are rebuilt per fallback zone).

    An option left unset is left out, so the API applies its own default (the network
    ``default``, the image's disk size, pd-standard, SCSI, no external IP, no service account).
    """
    nic: dict[str, Any] = {}
    if spec.network:
        nic["network"] = spec.network if "/" in spec.network else f"global/networks/{spec.network}"
    if spec.subnetwork:
        nic["subnetwork"] = (
            spec.subnetwork
            if "/" in spec.subnetwork
            else f"regions/{zone.rsplit('-', 1)[0]}/subnetworks/{spec.subnetwork}"
        )
    if spec.nic_type:
        nic["nicType"] = spec.nic_type
    if spec.external_ip:
        nic["accessConfigs"] = [{"name": "External NAT", "type": "ONE_TO_ONE_NAT", "networkTier": "PREMIUM"}]
    init: dict[str, Any] = {"sourceImage": spec.image}
    if spec.boot_disk_size_gb is not None:
        init["diskSizeGb"] = str(spec.boot_disk_size_gb)
    if spec.boot_disk_type:
        init["diskType"] = f"zones/{zone}/diskTypes/{spec.boot_disk_type}"
    disk: dict[str, Any] = {"boot": True, "autoDelete": True, "type": "PERSISTENT", "initializeParams": init}
    if spec.boot_disk_interface:
        disk["interface"] = spec.boot_disk_interface
    body: dict[str, Any] = {
        "name": spec.name,
        "machineType": f"zones/{zone}/machineTypes/{spec.machine_type}",
        "scheduling": scheduling_body(spec),
        "disks": [disk],
        "networkInterfaces": [nic],
        "labels": dict(spec.labels),
        "metadata": {"items": [{"key": k, "value": v} for k, v in sorted(spec.metadata.items())]},
    }
    if spec.service_account_email or spec.scopes is not None:
        body["serviceAccounts"] = [
            {"email": spec.service_account_email or "default", "scopes": list(spec.scopes or [])}
        ]
    if spec.tags:
        body["tags"] = {"items": list(spec.tags)}
    if spec.flex_start:  # DWS capacity, never a reservation's; the request waits this long at most
        body["reservationAffinity"] = {"consumeReservationType": "NO_RESERVATION"}
        if spec.request_valid_for_s:
            body["params"] = {"requestValidForDuration": {"seconds": str(spec.request_valid_for_s)}}
    if spec.resource_policies:
        region = zone.rsplit("-", 1)[0]
        body["resourcePolicies"] = [
            f"projects/{project}/regions/{region}/resourcePolicies/{name}" for name in spec.resource_policies
        ]
    if spec.gpus and spec.gpus.attach and spec.gpus.gpu_type:
        body["guestAccelerators"] = [
            {
                "acceleratorType": f"projects/{project}/zones/{zone}/acceleratorTypes/{spec.gpus.gpu_type}",
                "acceleratorCount": spec.gpus.gpu_count,
            }
        ]
    return body


def boot_disk_of(instance: dict[str, Any]) -> dict[str, Any]:
    for disk in instance.get("disks") or []:
        if disk.get("boot"):
            return disk
    return {}


def immutable_differences(spec: InstanceSpec, instance: dict[str, Any]) -> list[str]:
    """Fields this module does not change on an existing VM that differ from what was asked.

    Compared after normalising (short names, server defaults); values the server did not return
    are not compared, so a sparse answer never causes a false "changed".
    """
    gpu_type, gpu_count = gpus_of_instance(instance)
    model, action = provisioning_of(instance)
    pairs: list[tuple[str, Any, Any]] = []
    if spec.machine_type:
        pairs.append(("machine_type", spec.machine_type, short_name(instance.get("machineType"))))
    if spec.gpus is not None:
        pairs += [("gpu_type", spec.gpus.gpu_type, gpu_type), ("gpu_count", spec.gpus.gpu_count, gpu_count)]
    if spec.provisioning_model is not None:
        pairs += [
            ("provisioning_model", spec.provisioning_model, model),
            ("instance_termination_action", spec.termination_action, action),
        ]
    if spec.flex_start:
        pairs.append(("max_run_duration", spec.max_run_duration_s, max_run_duration_of(instance)))
    disk = boot_disk_of(instance)
    if disk.get("diskSizeGb") is not None and spec.boot_disk_size_gb is not None:
        pairs.append(("boot_disk_size_gb", spec.boot_disk_size_gb, int(disk["diskSizeGb"])))
    if disk.get("interface") and spec.boot_disk_interface:
        pairs.append(("boot_disk_interface", spec.boot_disk_interface, disk["interface"]))
    if spec.resource_policies is not None:
        have = sorted(short_name(p) for p in instance.get("resourcePolicies") or [])
        pairs.append(("resource_policies", spec.resource_policies, have))
    return [f"{name} (asked {want!r}, is {have!r})" for name, want, have in pairs if want != have]


def wanted_labels(spec: InstanceSpec, current: dict[str, str], purge: bool) -> dict[str, str]:
    """Labels after the update: ours over the current ones (or only ours when purging)."""
    return dict(spec.labels) if purge else {**current, **spec.labels}


def wanted_metadata(spec: InstanceSpec, current: dict[str, str], purge: bool) -> dict[str, str]:
    """Metadata after the update: ours over the current ones (or only ours when purging).

    Not purging by default: ``gcloud compute ssh`` adds its own ssh-keys entry, removing it would
    lock the user out.
    """
    return dict(spec.metadata) if purge else {**current, **spec.metadata}


def comparable_view(facts: dict[str, Any] | None, metadata: dict[str, str] | None) -> dict[str, Any]:
    """What --diff shows: the managed fields, metadata values as digests."""
    if not facts:
        return {}
    view = {
        k: facts.get(k)
        for k in (
            "name",
            "zone",
            "status",
            "machine_type",
            "gpu_type",
            "gpu_count",
            "provisioning_model",
            "instance_termination_action",
            "labels",
            "tags",
        )
    }
    view["metadata"] = {k: value_digest(v) for k, v in sorted((metadata or {}).items())}
    return view


def predicted_facts(spec: InstanceSpec, zone: str, project: str, status: str) -> dict[str, Any]:
    """The facts a VM made from ``spec`` would have (used in check mode, before it exists)."""
    return {
        "name": spec.name,
        "id": None,
        "project": project,
        "zone": zone,
        "status": status,
        "machine_type": spec.machine_type,
        "gpu_type": spec.gpus.gpu_type if spec.gpus else None,
        "gpu_count": spec.gpus.gpu_count if spec.gpus else 0,
        "provisioning_model": spec.provisioning_model or "STANDARD",
        "preemptible": bool(spec.spot),
        "instance_termination_action": spec.termination_action,
        "max_run_duration_s": spec.max_run_duration_s,
        "ends_at": None,
        "ip": None,
        "public_ip": None,
        "private_ip": None,
        "network": short_name(spec.network) or None,
        "labels": dict(spec.labels),
        "tags": list(spec.tags),
        "metadata_keys": sorted(spec.metadata),
        "boot_disk_size_gb": spec.boot_disk_size_gb,
        "self_link": None,
        "creation_timestamp": None,
        "last_start_timestamp": None,
        "last_stop_timestamp": None,
    }


#: The statuses of a VM that is off (its disk kept); a Spot VM preempted with action STOP ends here.
STOPPED_STATES = ("TERMINATED", "STOPPED")
#: The operation Google files, as a system operation of the zone, when it preempts a Spot VM.
PREEMPTED_OPERATION = "compute.instances.preempted"


def instant(stamp: str) -> datetime:
    """An RFC 3339 time from the API (offsets vary with daylight saving time) as a comparable instant."""
    try:
        parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return datetime.min.replace(tzinfo=timezone.utc)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def preemptions(client: GcpClient, project: str, zone: str, instance: dict[str, Any]) -> list[str]:
    """When Google preempted this VM in this zone: its `compute.instances.preempted` operations, oldest first.

    The zone's operation list is the one record of a preemption: the instance itself only says
    TERMINATED, the same as a VM its user stopped.
    """
    query = f'(operationType = "{PREEMPTED_OPERATION}") (targetId = "{instance.get("id")}")'
    pages = client.pages(f"projects/{project}/zones/{zone}/operations", {"filter": query})
    found = [op.get("insertTime") or "" for page in pages for op in page.get("items") or []]
    return sorted((stamp for stamp in found if stamp), key=instant)


def last_preemption(client: GcpClient, project: str, zone: str, instance: dict[str, Any]) -> str | None:
    """When a stopped Spot VM was preempted, if that is why it is stopped now.

    Only a preemption newer than the VM's last start counts: an older one was already recovered
    from, and a VM the user stopped is not "preempted".
    """
    if (instance.get("scheduling") or {}).get("provisioningModel") != "SPOT" or instance.get(
        "status"
    ) not in STOPPED_STATES:
        return None
    found = preemptions(client, project, zone, instance)
    newest = found[-1] if found else ""
    started = instance.get("lastStartTimestamp") or ""
    return newest if newest and (not started or instant(newest) >= instant(started)) else None
