"""What the emulated cloud offers: zones, machine types, GPUs and public images.

The data is a small, realistic slice of Compute Engine chosen for what forja decides on: which
zones offer the NVIDIA L4 (us-east1-c deliberately does not, so "GPU not offered in the zone"
is testable) and the images the roles boot from. The machine types (vCPUs, memory, the GPUs a
type carries, the GPUs N1 accepts) are forja's machine catalog, read from its one home
(plugins/module_utils/forja_gcp_machines.py, through forja.machines), never copied here.
Resource dicts are built per request because their URLs embed the emulator's base URL and the
caller's project.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from forja import machines


def project_number(project: str) -> str:
    """A stable 12-digit project number (Google's are 12 digits, never starting with 0)."""
    digest = int.from_bytes(hashlib.sha256(f"project-number/{project}".encode()).digest()[:8], "big")
    return str(100_000_000_000 + digest % 900_000_000_000)


CREATED = "2016-01-01T00:00:00.000-08:00"
GUEST_OS_FEATURES = ("VIRTIO_SCSI_MULTIQUEUE", "UEFI_COMPATIBLE", "GVNIC", "SEV_CAPABLE")
IMAGE_PROJECTS = ("deeplearning-platform-release", "ubuntu-os-cloud")

ZONES: dict[str, str] = {
    zone: zone.rsplit("-", 1)[0]
    for zone in (
        "us-east1-b", "us-east1-c", "us-east1-d",
        "us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f",
        "us-east4-a", "us-east4-c",
        "us-west1-a", "us-west1-b",
        "europe-west4-a", "europe-west4-b", "europe-west4-c",
        "europe-west1-b", "europe-west1-c",
        "asia-east1-a", "asia-east1-b", "asia-east1-c",
        "asia-southeast1-b", "asia-southeast1-c",
    )
}  # fmt: skip

# First address of each region's auto-mode "default" subnetwork (Google's real ranges).
REGION_SUBNETS: dict[str, str] = {
    "us-east1": "10.142.0",
    "us-central1": "10.128.0",
    "us-east4": "10.150.0",
    "us-west1": "10.138.0",
    "europe-west4": "10.164.0",
    "europe-west1": "10.132.0",
    "asia-east1": "10.140.0",
    "asia-southeast1": "10.148.0",
}


@dataclasses.dataclass(frozen=True)
class AcceleratorType:
    name: str
    description: str
    max_cards: int
    zones: tuple[str, ...]


def _zones(*names: str) -> tuple[str, ...]:
    return tuple(names)


ACCELERATOR_TYPES: dict[str, AcceleratorType] = {
    a.name: a
    for a in (
        AcceleratorType(
            "nvidia-l4", "NVIDIA L4", 8,
            _zones("us-east1-b", "us-east1-d", "us-central1-a", "us-central1-b", "us-central1-c",
                   "us-east4-a", "us-east4-c", "us-west1-a", "us-west1-b", "europe-west4-a",
                   "europe-west4-b", "europe-west4-c", "europe-west1-b", "europe-west1-c",
                   "asia-east1-a", "asia-east1-c", "asia-southeast1-b", "asia-southeast1-c"),
        ),
        AcceleratorType(
            "nvidia-tesla-t4", "NVIDIA T4", 4,
            tuple(z for z in ZONES if z not in ("us-east1-b",)),
        ),
        AcceleratorType(
            "nvidia-tesla-v100", "NVIDIA V100", 8,
            _zones("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-west1-a",
                   "us-west1-b", "europe-west4-a", "europe-west4-b", "europe-west4-c", "asia-east1-c"),
        ),
        AcceleratorType(
            "nvidia-tesla-p100", "NVIDIA P100", 4,
            _zones("us-east1-b", "us-east1-c", "us-central1-c", "us-central1-f", "us-west1-a",
                   "us-west1-b", "europe-west4-a", "asia-east1-a", "asia-east1-c"),
        ),
        AcceleratorType(
            "nvidia-tesla-a100", "NVIDIA A100 40GB", 16,
            _zones("us-east1-b", "us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f",
                   "us-west1-b", "europe-west4-a", "europe-west4-b", "asia-southeast1-b",
                   "asia-southeast1-c"),
        ),
        AcceleratorType(
            "nvidia-a100-80gb", "NVIDIA A100 80GB", 16,
            _zones("us-central1-a", "us-central1-c", "us-east4-c", "europe-west4-a", "asia-southeast1-c"),
        ),
        AcceleratorType(
            "nvidia-h100-80gb", "NVIDIA H100 80GB", 8,
            _zones("us-central1-a", "us-central1-c", "us-east4-a", "europe-west4-b", "europe-west4-c",
                   "asia-southeast1-b"),
        ),
    )
}  # fmt: skip


#: The families Google accepts as Flex-start VMs, stated here from Google's page, not read from
#: forja's own rule, so the emulator can catch forja asking wrongly: "all accelerator-optimized
#: machine types (except A4X and G4) and H4D machine types"
#: (cloud.google.com/compute/docs/instances/about-flex-start-vms).
FLEX_START_FAMILIES = ("a2", "a3", "a4", "g2", "h4d")
#: At most 7 days of run (the same page) and, for the request's wait, "up to two hours" (Google's
#: blog post announcing Flex-start VMs, 2025-09-25).
FLEX_START_MAX_RUN_S = 7 * 24 * 3600
FLEX_START_MAX_WAIT_S = 2 * 3600

#: The CPU platform the emulator reports per family (Google's defaults for these families).
CPU_PLATFORMS: dict[str, str] = {
    "e2": "AMD Rome",
    "n1": "Intel Broadwell",
    "g2": "Intel Cascade Lake",
    "a2": "Intel Cascade Lake",
    "a3": "Intel Sapphire Rapids",
}


@dataclasses.dataclass(frozen=True)
class MachineType:
    """A machine type as the emulator serves it; `gpu` is the accelerator the type itself carries."""

    name: str
    cpus: int
    memory_mb: int
    gpu: tuple[str, int] | None = None
    shared_cpu: bool = False
    cpu_platform: str = "Intel Broadwell"

    @property
    def family(self) -> str:
        return self.name.split("-", 1)[0]


def _served_machine_types() -> dict[str, MachineType]:
    """forja's machine catalog (its one home, read through forja.machines) as the emulator serves it:
    every type whose family and GPU the emulated cloud offers."""
    served: dict[str, MachineType] = {}
    for m in machines.machine_types().values():
        if m.family not in CPU_PLATFORMS or (m.gpu_type and m.gpu_type not in ACCELERATOR_TYPES):
            continue
        gpu = (m.gpu_type, m.gpu_count) if m.gpu_type else None
        served[m.name] = MachineType(m.name, m.vcpus, m.memory_mb, gpu, m.shared_cpu, CPU_PLATFORMS[m.family])
    return served


MACHINE_TYPES: dict[str, MachineType] = _served_machine_types()

# Attached (not built-in) GPUs that N1 machines accept, with the counts Google allows: the
# catalog's, for the GPUs the emulated cloud offers.
N1_ATTACHABLE: dict[str, tuple[int, ...]] = {
    name: counts for name, counts in machines.catalog().N1_GPUS.items() if name in ACCELERATOR_TYPES
}


def machine_types_in(zone: str) -> list[MachineType]:
    """Types offered in a zone: the general ones everywhere, GPU types where their GPU is."""
    return [m for m in MACHINE_TYPES.values() if m.gpu is None or zone in ACCELERATOR_TYPES[m.gpu[0]].zones]


def accelerators_in(zone: str) -> list[AcceleratorType]:
    return [a for a in ACCELERATOR_TYPES.values() if zone in a.zones]


def numeric_id(*parts: str) -> str:
    """A stable uint64-looking id (Google ids are decimal strings)."""
    digest = hashlib.sha256("/".join(parts).encode()).digest()
    return str(int.from_bytes(digest[:8], "big") >> 1)


# ---------------------------------------------------------------------------------------------
# Resource renderers


def zone_resource(base: str, project: str, zone: str) -> dict[str, Any]:
    region = ZONES[zone]
    return {
        "kind": "compute#zone",
        "id": numeric_id("zone", zone),
        "creationTimestamp": CREATED,
        "name": zone,
        "description": zone,
        "status": "UP",
        "region": f"{base}projects/{project}/regions/{region}",
        "selfLink": f"{base}projects/{project}/zones/{zone}",
        "availableCpuPlatforms": sorted({m.cpu_platform for m in machine_types_in(zone)}),
        "supportsPzs": False,
    }


def machine_type_resource(base: str, project: str, zone: str, machine: MachineType) -> dict[str, Any]:
    resource: dict[str, Any] = {
        "kind": "compute#machineType",
        "id": numeric_id("machineType", machine.name),
        "creationTimestamp": CREATED,
        "name": machine.name,
        "description": f"{machine.cpus} vCPU{'s' if machine.cpus > 1 else ''}, "
        f"{machine.memory_mb / 1024:g} GB RAM",
        "guestCpus": machine.cpus,
        "memoryMb": machine.memory_mb,
        "imageSpaceGb": 0,
        "maximumPersistentDisks": 128,
        "maximumPersistentDisksSizeGb": "263168",
        "zone": zone,
        "selfLink": f"{base}projects/{project}/zones/{zone}/machineTypes/{machine.name}",
        "isSharedCpu": machine.shared_cpu,
        "architecture": "X86_64",
    }
    if machine.gpu:
        accel, count = machine.gpu
        resource["accelerators"] = [{"guestAcceleratorType": accel, "guestAcceleratorCount": count}]
    return resource


def accelerator_type_resource(base: str, project: str, zone: str, accel: AcceleratorType) -> dict[str, Any]:
    return {
        "kind": "compute#acceleratorType",
        "id": numeric_id("acceleratorType", zone, accel.name),
        "creationTimestamp": CREATED,
        "name": accel.name,
        "description": accel.description,
        "zone": f"{base}projects/{project}/zones/{zone}",
        "selfLink": f"{base}projects/{project}/zones/{zone}/acceleratorTypes/{accel.name}",
        "maximumCardsPerInstance": accel.max_cards,
    }


@dataclasses.dataclass(frozen=True)
class Image:
    project: str
    name: str
    family: str
    description: str
    disk_size_gb: int
    created: str
    license: str
    deprecated: bool = False


IMAGES: tuple[Image, ...] = (
    Image(
        "deeplearning-platform-release",
        "pytorch-2-7-cu128-ubuntu-2204-nvidia-570-v20250916",
        "pytorch-2-7-cu128-ubuntu-2204-nvidia-570",
        "Google, Deep Learning VM with PyTorch 2.7, CUDA 12.8, Ubuntu 22.04, NVIDIA driver 570",
        50, "2025-09-16T10:00:00.000-07:00", "dlvm", deprecated=True,
    ),
    Image(
        "deeplearning-platform-release",
        "pytorch-2-7-cu128-ubuntu-2204-nvidia-570-v20251021",
        "pytorch-2-7-cu128-ubuntu-2204-nvidia-570",
        "Google, Deep Learning VM with PyTorch 2.7, CUDA 12.8, Ubuntu 22.04, NVIDIA driver 570",
        50, "2025-10-21T10:00:00.000-07:00", "dlvm",
    ),
    Image(
        "ubuntu-os-cloud",
        "ubuntu-2204-jammy-v20251023",
        "ubuntu-2204-lts",
        "Canonical, Ubuntu, 22.04 LTS, amd64 jammy image built on 2025-10-23",
        10, "2025-10-23T10:00:00.000-07:00", "ubuntu-2204-lts",
    ),
)  # fmt: skip


def find_image(project: str, name: str) -> Image | None:
    return next((i for i in IMAGES if i.project == project and i.name == name), None)


def image_from_family(project: str, family: str) -> Image | None:
    """The newest non-deprecated image of the family, as Google resolves families."""
    candidates = [i for i in IMAGES if i.project == project and i.family == family and not i.deprecated]
    return max(candidates, key=lambda i: i.created, default=None)


def image_resource(base: str, image: Image) -> dict[str, Any]:
    self_link = f"{base}projects/{image.project}/global/images/{image.name}"
    resource: dict[str, Any] = {
        "kind": "compute#image",
        "id": numeric_id("image", image.project, image.name),
        "creationTimestamp": image.created,
        "name": image.name,
        "description": image.description,
        "sourceType": "RAW",
        "status": "READY",
        "archiveSizeBytes": str(image.disk_size_gb * 1024**3 // 5),
        "diskSizeGb": str(image.disk_size_gb),
        "licenses": [f"{base}projects/{image.project}/global/licenses/{image.license}"],
        "family": image.family,
        "selfLink": self_link,
        "labelFingerprint": "42WmSpB8rSM=",
        "guestOsFeatures": [{"type": t} for t in GUEST_OS_FEATURES],
        "storageLocations": ["us", "eu", "asia"],
        "architecture": "X86_64",
    }
    if image.deprecated:
        newest = image_from_family(image.project, image.family)
        resource["deprecated"] = {
            "state": "DEPRECATED",
            "replacement": image_resource(base, newest)["selfLink"] if newest else "",
        }
    return resource


def network_resource(base: str, project: str) -> dict[str, Any]:
    """The auto-mode `default` VPC every project has (forja uses only that one)."""
    url = f"{base}projects/{project}"
    return {
        "kind": "compute#network",
        "id": numeric_id("network", project, "default"),
        "creationTimestamp": CREATED,
        "name": "default",
        "description": "Default network for the project",
        "selfLink": f"{url}/global/networks/default",
        "autoCreateSubnetworks": True,
        "subnetworks": [f"{url}/regions/{r}/subnetworks/default" for r in sorted(REGION_SUBNETS)],
        "routingConfig": {"routingMode": "REGIONAL"},
        "networkFirewallPolicyEnforcementOrder": "AFTER_CLASSIC_FIREWALL",
    }


#: Every sandbox project's Compute Engine default service account (Google's form: NUMBER-compute@...).
DEFAULT_SERVICE_ACCOUNT = "123456789012-compute@developer.gserviceaccount.com"


def project_resource(base: str, project: str) -> dict[str, Any]:
    """Compute's Project; its `id` is the project number, as on GCE (quotas are added by the caller)."""
    return {
        "kind": "compute#project",
        "id": project_number(project),
        "creationTimestamp": CREATED,
        "name": project,
        "selfLink": f"{base}projects/{project}",
        "commonInstanceMetadata": {"kind": "compute#metadata", "fingerprint": "42WmSpB8rSM="},
        "defaultServiceAccount": DEFAULT_SERVICE_ACCOUNT,
        "defaultNetworkTier": "PREMIUM",
        "xpnProjectStatus": "UNSPECIFIED_XPN_PROJECT_STATUS",
    }
