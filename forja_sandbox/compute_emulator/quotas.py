"""Compute Engine quotas: each project's limits per region and globally, and what it uses of them.

`regions.get` and `projects.get` answer `quotas: [{metric, limit, usage}]`, the numbers a preflight
check reads to tell "no GPU quota here" from "no GPUs in stock". Usage is counted from the
project's stored instances, so it moves as VMs are created, stopped and deleted, and
`instances.insert` is refused (its operation ends in QUOTA_EXCEEDED, with Google's message) when
the new VM would take a metric past its limit.

How instances count (Google's rules, as documented for CPUs and GPUs):
- CPUs and GPUs count while the instance is not TERMINATED (a stopped VM holds none);
- a Spot/preemptible VM counts against the PREEMPTIBLE_ metric of the region when that quota is
  granted there (limit > 0), otherwise against the standard one ("In regions where you don't have
  preemptible CPU quota, you can use standard CPU quota");
- INSTANCES counts every instance; IN_USE_ADDRESSES the external addresses of VMs not TERMINATED;
- disks count whatever the state: pd-standard in DISKS_TOTAL_GB, the SSD-backed types
  (pd-balanced, pd-ssd, pd-extreme, hyperdisk-balanced) in SSD_TOTAL_GB;
- GPUS_ALL_REGIONS (global) counts every GPU of every region, Spot ones too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from . import catalog

if TYPE_CHECKING:  # the settings import this module to check their quota keys
    from .project_settings import ProjectSettings, QuotaKey

Json = dict[str, Any]

#: The quota metric of each GPU the catalog offers (names from the Compute v1 `Quota.metric` enum).
#: Google's enum has no on-demand H100 metric (on-demand H100s are limited per GPU family, outside
#: `regions.get`), so the H100 has only its preemptible one here.
_GPU_METRICS = {
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
}
_PREEMPTIBLE_GPU_METRICS = {
    **{gpu: f"PREEMPTIBLE_{metric}" for gpu, metric in _GPU_METRICS.items()},
    "nvidia-h100-80gb": "PREEMPTIBLE_NVIDIA_H100_GPUS",
}
_OFFERED = catalog.ACCELERATOR_TYPES
GPU_METRICS = {g: m for g, m in _GPU_METRICS.items() if g in _OFFERED}
PREEMPTIBLE_GPU_METRICS = {g: m for g, m in _PREEMPTIBLE_GPU_METRICS.items() if g in _OFFERED}

#: Default limits, generous so that nothing but a test that asks for it meets one. In this order
#: `regions.get` lists them and `instances.insert` checks them.
REGIONAL_DEFAULTS: dict[str, float] = {
    "CPUS": 24000,
    "PREEMPTIBLE_CPUS": 24000,
    **{metric: 16 for metric in GPU_METRICS.values()},
    **{metric: 16 for metric in PREEMPTIBLE_GPU_METRICS.values()},
    "INSTANCES": 24000,
    "IN_USE_ADDRESSES": 8000,
    "DISKS_TOTAL_GB": 409600,
    "SSD_TOTAL_GB": 204800,
}
GLOBAL_DEFAULTS: dict[str, float] = {
    "GPUS_ALL_REGIONS": 32,
    "CPUS_ALL_REGIONS": 100000,
    "FIREWALLS": 500,
    "NETWORKS": 15,
}
REGIONS: tuple[str, ...] = tuple(sorted(set(catalog.ZONES.values())))
SSD_DISK_TYPES = frozenset({"pd-balanced", "pd-ssd", "pd-extreme", "hyperdisk-balanced"})


def parse_key(key: Any) -> QuotaKey:
    """`("us-east1", "NVIDIA_L4_GPUS")`, `"us-east1/NVIDIA_L4_GPUS"`, `("*", ...)` (every region) or
    `("global", "GPUS_ALL_REGIONS")` -> (scope, metric); ValueError for one the emulator lacks."""
    if isinstance(key, str):
        scope, _, metric = key.partition("/")
    elif isinstance(key, tuple | list) and len(key) == 2 and all(isinstance(k, str) for k in key):
        scope, metric = key
    else:
        raise ValueError(f"quotas: a key is (scope, metric) or 'scope/METRIC', not {key!r}")
    if metric in GLOBAL_DEFAULTS:
        if scope != "global":
            raise ValueError(f"quotas: {metric} is project-wide; its scope is 'global', not {scope!r}")
    elif metric in REGIONAL_DEFAULTS:
        if scope != "*" and scope not in REGIONS:
            raise ValueError(f"quotas: {metric} is regional; scope one of {', '.join(REGIONS)} or '*'")
    else:
        known = ", ".join([*REGIONAL_DEFAULTS, *GLOBAL_DEFAULTS])
        raise ValueError(f"quotas: unknown metric {metric!r}; known: {known}")
    return scope, metric


def limit(settings: ProjectSettings, scope: str, metric: str) -> float:
    """The project's limit: its override for the scope, then for every region, then the default."""
    if (scope, metric) in settings.quotas:
        return settings.quotas[(scope, metric)]
    if scope != "global" and ("*", metric) in settings.quotas:
        return settings.quotas[("*", metric)]
    return float(GLOBAL_DEFAULTS[metric] if scope == "global" else REGIONAL_DEFAULTS[metric])


def disk_types(body: Json) -> list[str]:
    """The type of each disk an insert body asks for (Google's default: pd-standard). The stored
    instance does not say (an attached disk has no type), so the store keeps these beside it."""
    types = []
    for disk in body.get("disks") or []:
        named = str((disk.get("initializeParams") or {}).get("diskType") or "pd-standard")
        types.append(named.rsplit("/", 1)[-1])
    return types


def charges(instance: Json, zone: str, settings: ProjectSettings, types: list[str]) -> Counter[QuotaKey]:
    """What one instance takes of each quota (see the module docstring for the rules)."""
    region = catalog.ZONES[zone]
    taken: Counter[QuotaKey] = Counter({(region, "INSTANCES"): 1})
    scheduling = instance.get("scheduling") or {}
    # Flex-start VMs "consume preemptible quota" (Google's blog post announcing them, 2025-09-25).
    model = scheduling.get("provisioningModel")
    spot = model in ("SPOT", "FLEX_START") or bool(scheduling.get("preemptible"))

    def metric(standard: str | None, preemptible: str | None) -> str | None:
        if spot and preemptible and limit(settings, region, preemptible) > 0:
            return preemptible
        return standard

    if instance.get("status") != "TERMINATED":
        machine = catalog.MACHINE_TYPES.get(str(instance.get("machineType", "")).rsplit("/", 1)[-1])
        if machine is not None:
            cpu_metric = metric("CPUS", "PREEMPTIBLE_CPUS")
            taken[(region, cpu_metric or "CPUS")] += machine.cpus
            taken[("global", "CPUS_ALL_REGIONS")] += machine.cpus
        for accelerator in instance.get("guestAccelerators") or []:
            gpu = str(accelerator.get("acceleratorType", "")).rsplit("/", 1)[-1]
            count = int(accelerator.get("acceleratorCount") or 0)
            gpu_metric = metric(GPU_METRICS.get(gpu), PREEMPTIBLE_GPU_METRICS.get(gpu))
            if gpu_metric:
                taken[(region, gpu_metric)] += count
            taken[("global", "GPUS_ALL_REGIONS")] += count
        # Each access config holds (or, being created, wants) an ephemeral external address.
        nics = instance.get("networkInterfaces") or []
        addresses = sum(len(nic.get("accessConfigs") or []) for nic in nics)
        if addresses:
            taken[(region, "IN_USE_ADDRESSES")] += addresses
    for index, disk in enumerate(instance.get("disks") or []):
        kind = types[index] if index < len(types) else "pd-standard"
        total = "SSD_TOTAL_GB" if kind in SSD_DISK_TYPES else "DISKS_TOTAL_GB"
        taken[(region, total)] += int(disk.get("diskSizeGb") or 0)
    return taken


def usage(
    records: Iterable[Any], settings: ProjectSettings, disk_types_by_id: dict[str, list[str]]
) -> Counter[QuotaKey]:
    """The sum of `charges` over a project's instance records (call under the store lock)."""
    used: Counter[QuotaKey] = Counter()
    for record in records:
        types = disk_types_by_id.get(str(record.data.get("id")), [])
        used.update(charges(record.data, record.zone, settings, types))
    return used


def _number(value: float) -> float | int:
    """Google's JSON writes whole doubles without a fraction (`"limit": 24`)."""
    return int(value) if float(value).is_integer() else value


def region_quotas(settings: ProjectSettings, used: Counter[QuotaKey], region: str) -> list[Json]:
    return [
        {"metric": m, "limit": _number(limit(settings, region, m)), "usage": _number(used[(region, m)])}
        for m in REGIONAL_DEFAULTS
    ]


def project_quotas(settings: ProjectSettings, used: Counter[QuotaKey]) -> list[Json]:
    return [
        {"metric": m, "limit": _number(limit(settings, "global", m)), "usage": _number(used[("global", m)])}
        for m in GLOBAL_DEFAULTS
    ]


def exceeded(settings: ProjectSettings, used: Counter[QuotaKey], wanted: Counter[QuotaKey]) -> str | None:
    """Google's message for the first quota the `wanted` charges would exceed, or None.

    The form is Google's (`Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-east1.`,
    `Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.`; two spaces, a float limit).
    GPUS_ALL_REGIONS is checked first (what a new project meets), then the regional metrics.
    """
    order = [("global", "GPUS_ALL_REGIONS")] + [k for k in wanted if k[0] != "global"] + [
        ("global", "CPUS_ALL_REGIONS")
    ]
    for scope, metric in order:
        amount = wanted.get((scope, metric), 0)
        if amount and used[(scope, metric)] + amount > limit(settings, scope, metric):
            where = "globally" if scope == "global" else f"in region {scope}"
            return f"Quota '{metric}' exceeded.  Limit: {float(limit(settings, scope, metric))} {where}."
    return None


def region_resource(base: str, project: str, region: str, quotas: list[Json]) -> Json:
    """Compute's Region: its zones (those of the catalog) and the project's quotas there."""
    url = f"{base}projects/{project}"
    return {
        "kind": "compute#region",
        "id": catalog.numeric_id("region", region),
        "creationTimestamp": catalog.CREATED,
        "name": region,
        "description": region,
        "status": "UP",
        "zones": [f"{url}/zones/{z}" for z in sorted(catalog.ZONES) if catalog.ZONES[z] == region],
        "quotas": quotas,
        "selfLink": f"{url}/regions/{region}",
        "supportsPzs": False,
    }
