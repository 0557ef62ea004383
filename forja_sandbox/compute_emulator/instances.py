"""Turning an `instances.insert` body into the Instance the API would store, or refusing it.

Schema validation (field names, types, enums) has already happened; this module applies the
semantic rules Google enforces on top of the schema and that forja must respect: the machine
type and GPUs must exist in the zone, GPU instances cannot live-migrate, Spot settings must be
consistent, accelerator-optimized types (G2/A2/A3) carry their own GPUs. It also fills in what
the server fills in (full URLs, Spot defaults, disk names, fingerprints), because forja's
idempotence logic has to treat those server defaults as equal to what it asked for.
"""

from __future__ import annotations

import base64
import copy
import datetime
import hashlib
import json
import re
from typing import Any

from . import catalog
from .errors import ApiError, bad_request, invalid_field, not_found, required_field

NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
LABEL_KEY_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE_RE = re.compile(r"[a-z0-9_-]{0,63}")
EMPTY_FINGERPRINT = "42WmSpB8rSM="  # what Google reports for empty labels/metadata/tags
_URL_PREFIX = re.compile(r"^https?://[^/]+/compute/(?:v1|beta|alpha)/")


def now() -> str:
    """RFC 3339 with milliseconds and an offset, like Google's timestamps."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def fingerprint(value: Any) -> str:
    """A base64 content hash: changes whenever the guarded content changes."""
    if not value:
        return EMPTY_FINGERPRINT
    digest = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).digest()
    return base64.b64encode(digest[:8]).decode()


def relative(ref: str, project: str) -> str:
    """`projects/p/zones/z/...` from a full URL, a `projects/...` path or a `zones/...` path."""
    path = _URL_PREFIX.sub("", ref).lstrip("/")
    if path.startswith("projects/"):
        return path
    return f"projects/{project}/{path}"


def reference(field: str, ref: Any, project: str, collection: str) -> tuple[str, str, str]:
    """Split a resource reference into (project, scope, name), checking its collection.

    `zones/us-east1-d/machineTypes/g2-standard-8` -> (project, "zones/us-east1-d", "g2-standard-8").
    """
    if not isinstance(ref, str) or not ref:
        raise invalid_field(field, ref, "Expected a resource URL.")
    parts = relative(ref, project).split("/")
    if len(parts) >= 4 and parts[-2] == collection and parts[0] == "projects":
        return parts[1], "/".join(parts[2:-2]), parts[-1]
    raise invalid_field(field, ref, f"The URL is malformed: expected '.../{collection}/<name>'.")


def check_labels(field: str, labels: Any) -> None:
    for key, value in (labels or {}).items():
        if not LABEL_KEY_RE.fullmatch(key):
            raise invalid_field(f"{field}.{key}", key, "Label keys must match [a-z][a-z0-9_-]{0,62}.")
        if not isinstance(value, str) or not LABEL_VALUE_RE.fullmatch(value):
            raise invalid_field(f"{field}.{key}", value, "Label values must match [a-z0-9_-]{0,63}.")


def check_tags(field: str, tags: list[Any]) -> None:
    """Network tags are RFC 1035 names, like instance names."""
    for index, tag in enumerate(tags):
        if not isinstance(tag, str) or not NAME_RE.fullmatch(tag):
            raise invalid_field(f"{field}[{index}]", tag, f"Must be a match of regex '{NAME_RE.pattern}'")


#: Compute Engine's documented metadata limits: a key of 1-128 letters, digits, `-` and `_`, and at
#: most 512 KB for all of an instance's keys and values together (one value's 256 KB is the wire's
#: string limit, forja_sandbox/http_limits.py). Without the total, 100k small items under the body
#: limit were kept, and every later listing carried them.
METADATA_KEY_RE = re.compile(r"[a-zA-Z0-9_-]{1,128}")
METADATA_TOTAL_BYTES = 512 * 1024


def check_metadata(field: str, metadata: dict[str, Any]) -> list[dict[str, str]]:
    items = metadata.get("items") or []
    seen: set[str] = set()
    total = 0
    for index, item in enumerate(items):
        key = item.get("key")
        if not key:
            raise required_field(f"{field}.items[{index}].key")
        if not isinstance(key, str) or not METADATA_KEY_RE.fullmatch(key):
            raise invalid_field(f"{field}.items[{index}].key", key,
                                f"Must be a match of regex '{METADATA_KEY_RE.pattern}'")  # fmt: skip
        if key in seen:
            raise invalid_field(f"{field}.items[{index}].key", key, "Duplicate metadata key.")
        seen.add(key)
        total += len(key.encode()) + len(str(item.get("value", "")).encode())
    if total > METADATA_TOTAL_BYTES:
        raise invalid_field(field, f"{len(items)} items, {total} bytes", "The total size of all metadata "
                            f"keys and values must be at most {METADATA_TOTAL_BYTES} bytes.")  # fmt: skip
    return [{"key": i["key"], "value": i.get("value", "")} for i in items]


def build_instance(body: dict[str, Any], project: str, zone: str, base: str) -> dict[str, Any]:
    """The stored Instance for a validated insert body (status PROVISIONING, no IPs yet)."""
    name = body["name"]
    if not NAME_RE.fullmatch(name):
        raise invalid_field("resource.name", name, f"Must be a match of regex '{NAME_RE.pattern}'")
    zone_url = f"{base}projects/{project}/zones/{zone}"
    machine = _machine_type(body, project, zone)
    accelerators = _accelerators(body, project, zone, machine)
    scheduling = _scheduling(body.get("scheduling") or {}, bool(accelerators), machine)
    flex = scheduling["provisioningModel"] == "FLEX_START"
    if flex:
        _flex_start_request(body)
    check_labels("resource.labels", body.get("labels"))
    metadata_items = check_metadata("resource.metadata", body.get("metadata") or {})
    tags = (body.get("tags") or {}).get("items") or []
    check_tags("resource.tags.items", tags)

    instance = copy.deepcopy(body)
    instance.update(
        {
            "kind": "compute#instance",
            "creationTimestamp": now(),
            "name": name,
            "description": body.get("description", ""),
            "tags": {"items": tags, "fingerprint": fingerprint(tags)}
            if tags
            else {"fingerprint": EMPTY_FINGERPRINT},
            "machineType": f"{zone_url}/machineTypes/{machine.name}",
            # A Flex-start request waits for capacity as PENDING (the discovery document's status enum).
            "status": "PENDING" if flex else "PROVISIONING",
            "zone": zone_url,
            "canIpForward": bool(body.get("canIpForward", False)),
            "networkInterfaces": _network_interfaces(body, project, zone, base),
            "disks": _disks(body, project, zone, base),
            "metadata": {"kind": "compute#metadata", "fingerprint": fingerprint(metadata_items)},
            "selfLink": f"{zone_url}/instances/{name}",
            "scheduling": scheduling,
            "cpuPlatform": machine.cpu_platform,
            "labels": dict(body.get("labels") or {}),
            "labelFingerprint": fingerprint(body.get("labels") or {}),
            "startRestricted": False,
            "deletionProtection": bool(body.get("deletionProtection", False)),
            "fingerprint": "",
        }
    )
    if metadata_items:
        instance["metadata"]["items"] = metadata_items
    for account in instance.get("serviceAccounts") or []:  # Google stores the account "default" stands for
        if account.get("email") in (None, "", "default"):
            account["email"] = catalog.DEFAULT_SERVICE_ACCOUNT
    if not instance["labels"]:
        del instance["labels"]
    if accelerators:
        instance["guestAccelerators"] = [
            {"acceleratorType": f"{zone_url}/acceleratorTypes/{kind}", "acceleratorCount": count}
            for kind, count in accelerators
        ]
    else:
        instance.pop("guestAccelerators", None)
    if flex:
        instance["reservationAffinity"] = {"consumeReservationType": "NO_RESERVATION"}
    instance.pop("params", None)  # input only: Google does not return the request's parameters
    instance["fingerprint"] = fingerprint([name, instance["creationTimestamp"]])
    return {"kind": instance.pop("kind"), **instance}


def duration_seconds(field: str, duration: Any) -> int:
    """A Duration's whole seconds (`{"seconds": "3600"}`; int64 travels as a string), checked."""
    if not isinstance(duration, dict):
        raise invalid_field(field, duration, "Expected a Duration such as {\"seconds\": \"3600\"}.")
    try:
        seconds = int(duration.get("seconds") or 0)
    except (TypeError, ValueError):
        raise invalid_field(f"{field}.seconds", duration.get("seconds"), "Expected an integer.") from None
    if seconds <= 0 and not duration.get("nanos"):
        raise invalid_field(field, duration, "The duration must be positive.")
    return seconds


def _flex_start_request(body: dict[str, Any]) -> None:
    """What a Flex-start insert must say beyond its scheduling: no reservation, a bounded wait."""
    affinity = (body.get("reservationAffinity") or {}).get("consumeReservationType")
    if affinity not in (None, "NO_RESERVATION"):
        raise invalid_field(
            "resource.reservationAffinity.consumeReservationType", affinity,
            "Flex-start instances cannot consume reservations; use NO_RESERVATION.",
        )  # fmt: skip
    wait = (body.get("params") or {}).get("requestValidForDuration")
    if wait is not None:
        seconds = duration_seconds("resource.params.requestValidForDuration", wait)
        if seconds > catalog.FLEX_START_MAX_WAIT_S:
            raise invalid_field(
                "resource.params.requestValidForDuration", wait,
                f"A Flex-start request can wait at most {catalog.FLEX_START_MAX_WAIT_S} seconds.",
            )  # fmt: skip


def request_valid_for_s(body: dict[str, Any]) -> int:
    """How long a Flex-start request waits for capacity: its own bound, else the longest allowed."""
    wait = (body.get("params") or {}).get("requestValidForDuration") or {}
    return int(wait.get("seconds") or catalog.FLEX_START_MAX_WAIT_S)  # `kind` first, as Google orders it


def _machine_type(body: dict[str, Any], project: str, zone: str) -> catalog.MachineType:
    field = "resource.machineType"
    ref = body.get("machineType")
    if not ref:
        raise required_field(field)
    ref_project, scope, name = reference(field, ref, project, "machineTypes")
    if scope != f"zones/{zone}" or ref_project != project:
        raise invalid_field(field, ref, f"Machine type must be in the instance's zone 'zones/{zone}'.")
    machine = catalog.MACHINE_TYPES.get(name)
    if machine is None or machine not in catalog.machine_types_in(zone):
        raise invalid_field(field, ref, f"Machine type with name '{name}' does not exist in zone '{zone}'.")
    return machine


def _accelerators(
    body: dict[str, Any], project: str, zone: str, machine: catalog.MachineType
) -> list[tuple[str, int]]:
    """The GPUs the instance ends up with: the type's own, or (N1 only) the attached ones."""
    requested: list[tuple[str, int]] = []
    for index, item in enumerate(body.get("guestAccelerators") or []):
        field = f"resource.guestAccelerators[{index}].acceleratorType"
        ref = item.get("acceleratorType")
        if not ref:
            raise required_field(field)
        _ref_project, scope, name = reference(field, ref, project, "acceleratorTypes")
        accel = catalog.ACCELERATOR_TYPES.get(name)
        if scope != f"zones/{zone}":
            raise invalid_field(
                field, ref, f"Accelerator type must be in the instance's zone 'zones/{zone}'."
            )
        if accel is None or zone not in accel.zones:
            raise invalid_field(field, ref, f"Accelerator type '{name}' does not exist in zone '{zone}'.")
        count = int(item.get("acceleratorCount") or 0)
        if not 1 <= count <= accel.max_cards:
            raise invalid_field(
                f"resource.guestAccelerators[{index}].acceleratorCount", count,
                f"Must be between 1 and {accel.max_cards} for '{name}'.",
            )  # fmt: skip
        requested.append((name, count))
    if machine.gpu is not None:
        if requested and requested != [machine.gpu]:
            raise invalid_field(
                "resource.guestAccelerators", body["guestAccelerators"],
                f"Machine type '{machine.name}' comes with {machine.gpu[1]} x {machine.gpu[0]}; "
                "omit guestAccelerators or request exactly that.",
            )  # fmt: skip
        return [machine.gpu]
    if requested and machine.family != "n1":
        raise bad_request(
            f"[{machine.name}, {requested[0][0]}] features are not compatible for creating instance.",
            "badRequest",
        )
    for index, (name, count) in enumerate(requested):
        allowed = catalog.N1_ATTACHABLE.get(name)
        if allowed is None:
            raise bad_request(f"[{machine.name}, {name}] features are not compatible for creating instance.")
        if count not in allowed:
            raise invalid_field(
                f"resource.guestAccelerators[{index}].acceleratorCount", count,
                f"'{name}' can be attached in counts of {list(allowed)}.",
            )  # fmt: skip
    return requested


def _flex_start_scheduling(requested: dict[str, Any], machine: catalog.MachineType) -> dict[str, Any]:
    """FLEX_START: a qualifying series, a max run of at most 7 days, TERMINATE, no automatic restart,
    and a termination action (STOP or DELETE) to perform at the end of the run."""
    field = "resource.scheduling"
    if machine.family not in catalog.FLEX_START_FAMILIES:
        raise invalid_field(
            f"{field}.provisioningModel", "FLEX_START",
            f"Machine type '{machine.name}' is not supported with the FLEX_START provisioning model.",
        )  # fmt: skip
    if requested.get("preemptible"):
        raise invalid_field(f"{field}.preemptible", True, "Flex-start instances cannot be preemptible.")
    if not requested.get("maxRunDuration"):
        raise required_field(f"{field}.maxRunDuration")
    seconds = duration_seconds(f"{field}.maxRunDuration", requested["maxRunDuration"])
    if seconds > catalog.FLEX_START_MAX_RUN_S:
        raise invalid_field(
            f"{field}.maxRunDuration", requested["maxRunDuration"],
            f"Flex-start instances can run at most {catalog.FLEX_START_MAX_RUN_S} seconds (7 days).",
        )  # fmt: skip
    action = requested.get("instanceTerminationAction")
    if action in (None, "INSTANCE_TERMINATION_ACTION_UNSPECIFIED"):
        raise required_field(f"{field}.instanceTerminationAction")
    maintenance = requested.get("onHostMaintenance") or "TERMINATE"
    if maintenance != "TERMINATE":
        raise invalid_field(
            f"{field}.onHostMaintenance", maintenance, "Flex-start instances must use TERMINATE."
        )
    if requested.get("automaticRestart"):
        raise invalid_field(
            f"{field}.automaticRestart", True, "Flex-start instances cannot be automatically restarted."
        )
    return {**requested, "onHostMaintenance": "TERMINATE", "automaticRestart": False, "preemptible": False}


def _scheduling(requested: dict[str, Any], has_gpu: bool, machine: catalog.MachineType) -> dict[str, Any]:
    field = "resource.scheduling"
    model = requested.get("provisioningModel") or "STANDARD"
    if model == "FLEX_START":
        return _flex_start_scheduling(requested, machine)
    if model == "RESERVATION_BOUND":
        raise invalid_field(f"{field}.provisioningModel", model, "The emulator serves no reservations.")
    preemptible = bool(requested.get("preemptible", False))
    spot = model == "SPOT"
    if preemptible and not spot and requested.get("provisioningModel"):
        raise invalid_field(
            f"{field}.provisioningModel",
            model,
            "For preemptible, only allowed provisioning_model value is SPOT.",
        )
    spot = spot or preemptible
    action = requested.get("instanceTerminationAction")
    if (
        action
        and action != "INSTANCE_TERMINATION_ACTION_UNSPECIFIED"
        and not spot
        and not requested.get("maxRunDuration")
    ):
        raise invalid_field(
            f"{field}.instanceTerminationAction", action,
            "Instance termination action can only be specified for SPOT VMs or VMs with a max run duration.",
        )  # fmt: skip
    default_maintenance = "TERMINATE" if spot else "MIGRATE"
    maintenance = requested.get("onHostMaintenance") or default_maintenance
    if spot and maintenance != "TERMINATE":
        raise invalid_field(
            f"{field}.onHostMaintenance", maintenance, "Preemptible (Spot) instances must use TERMINATE."
        )
    if has_gpu and maintenance != "TERMINATE":
        raise bad_request(
            "Instances with guest accelerators do not support live migration. "
            f"Set '{field}.onHostMaintenance' to TERMINATE."
        )
    restart = requested.get("automaticRestart")
    if spot and restart:
        raise invalid_field(
            f"{field}.automaticRestart",
            restart,
            "Preemptible (Spot) instances cannot be automatically restarted.",
        )
    scheduling = dict(requested)
    scheduling.update(
        {
            "onHostMaintenance": maintenance,
            "automaticRestart": False if spot else (True if restart is None else bool(restart)),
            "preemptible": spot,
            "provisioningModel": "SPOT" if spot else "STANDARD",
        }
    )
    if spot:
        scheduling["instanceTerminationAction"] = action or "STOP"
    return scheduling


def _network_interfaces(body: dict[str, Any], project: str, zone: str, base: str) -> list[dict[str, Any]]:
    interfaces = body.get("networkInterfaces") or []
    if not interfaces:
        raise invalid_field("resource.networkInterfaces", [], "At least one network interface is required.")
    region = catalog.ZONES[zone]
    result = []
    for index, nic in enumerate(interfaces):
        field = f"resource.networkInterfaces[{index}]"
        network = nic.get("network") or "global/networks/default"
        _p, scope, net_name = reference(f"{field}.network", network, project, "networks")
        if scope != "global" or net_name != "default":
            raise not_found(f"projects/{project}/global/networks/{net_name}")
        if nic.get("subnetwork"):
            field_sub = f"{field}.subnetwork"
            _p, sub_scope, sub_name = reference(field_sub, nic["subnetwork"], project, "subnetworks")
            if sub_scope != f"regions/{region}":
                raise invalid_field(field_sub, nic["subnetwork"], f"Subnetwork must be in region '{region}'.")
            if sub_name != "default":
                raise not_found(f"projects/{project}/regions/{region}/subnetworks/{sub_name}")
        out = copy.deepcopy(nic)
        out.update(
            {
                "kind": "compute#networkInterface",
                "network": f"{base}projects/{project}/global/networks/default",
                "subnetwork": f"{base}projects/{project}/regions/{region}/subnetworks/default",
                "name": f"nic{index}",
                "fingerprint": fingerprint([index, zone]),
                "stackType": nic.get("stackType", "IPV4_ONLY"),
            }
        )
        configs = []
        for cfg_index, cfg in enumerate(nic.get("accessConfigs") or []):
            kind = cfg.get("type", "ONE_TO_ONE_NAT")
            if kind != "ONE_TO_ONE_NAT":
                raise invalid_field(
                    f"{field}.accessConfigs[{cfg_index}].type", kind, "Only ONE_TO_ONE_NAT here."
                )
            configs.append(
                {
                    **cfg,
                    "kind": "compute#accessConfig",
                    "type": kind,
                    "name": cfg.get("name", "External NAT"),
                    "networkTier": cfg.get("networkTier", "PREMIUM"),
                }
            )
        out["accessConfigs"] = configs
        if not configs:
            del out["accessConfigs"]
        result.append(out)
    return result


def _disks(body: dict[str, Any], project: str, zone: str, base: str) -> list[dict[str, Any]]:
    disks = body.get("disks") or []
    boots = [d for d in disks if d.get("boot")]
    if len(boots) != 1:
        raise invalid_field("resource.disks", disks, "Exactly one boot disk must be specified.")
    result = []
    for index, disk in enumerate(disks):
        field = f"resource.disks[{index}]"
        params = disk.get("initializeParams") or {}
        if not params and not disk.get("source"):
            raise invalid_field(
                field, disk, "A disk needs initializeParams (new disk) or source (existing disk)."
            )
        size = int(disk.get("diskSizeGb") or params.get("diskSizeGb") or 0)
        licenses: list[str] = []
        features: list[dict[str, str]] = []
        if params.get("sourceImage"):
            image = _image(f"{field}.initializeParams.sourceImage", params["sourceImage"], project)
            image_size = image.disk_size_gb
            if size and size < image_size:
                raise bad_request(
                    f"Invalid value for field '{field}.initializeParams.diskSizeGb': '{size}'. "
                    f"Requested disk size cannot be smaller than the image size ({image_size} GB)",
                    "invalid",
                )
            size = size or image_size
            licenses = [f"{base}projects/{image.project}/global/licenses/{image.license}"]
            features = [{"type": t} for t in catalog.GUEST_OS_FEATURES]
        if params.get("diskType"):
            _p, _scope, disk_type = reference(
                f"{field}.initializeParams.diskType", params["diskType"], project, "diskTypes"
            )
            if disk_type not in ("pd-standard", "pd-balanced", "pd-ssd", "pd-extreme", "hyperdisk-balanced"):
                raise invalid_field(
                    f"{field}.initializeParams.diskType", params["diskType"], "Unknown disk type."
                )
        size = size or 10
        disk_name = params.get("diskName") or (
            body["name"] if disk.get("boot") else f"{body['name']}-{index}"
        )
        out = copy.deepcopy(disk)
        out.pop("initializeParams", None)
        out.update(
            {
                "kind": "compute#attachedDisk",
                "type": disk.get("type", "PERSISTENT"),
                "mode": disk.get("mode", "READ_WRITE"),
                "source": f"{base}projects/{project}/zones/{zone}/disks/{disk_name}",
                "deviceName": disk.get("deviceName") or f"persistent-disk-{index}",
                "index": index,
                "boot": bool(disk.get("boot", False)),
                "autoDelete": bool(disk.get("autoDelete", False)),
                "interface": disk.get("interface", "SCSI"),
                "diskSizeGb": str(size),
                "architecture": "X86_64",
            }
        )
        if licenses:
            out["licenses"] = licenses
            out["guestOsFeatures"] = features
        result.append(out)
    return result


def _image(field: str, ref: str, project: str) -> catalog.Image:
    path = relative(ref, project)
    parts = path.split("/")
    if len(parts) == 6 and parts[2:4] == ["global", "images"] and parts[4] == "family":
        image = catalog.image_from_family(parts[1], parts[5])
    elif len(parts) == 5 and parts[2:4] == ["global", "images"]:
        image = catalog.find_image(parts[1], parts[4])
    else:
        raise invalid_field(
            field, ref, "Expected projects/<p>/global/images/<name> or .../images/family/<f>."
        )
    if image is None:
        raise not_found(path)
    return image


def public_ip_check(instance: dict[str, Any]) -> bool:
    """Whether the instance asked for an external address (an accessConfig on any NIC)."""
    return any(nic.get("accessConfigs") for nic in instance.get("networkInterfaces", []))


__all__ = ["ApiError", "build_instance", "fingerprint", "now", "reference"]
