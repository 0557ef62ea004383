# Copyright: forja contributors
# Apache-2.0
"""forja's machine catalog: every machine type forja knows, with its GPUs, vCPUs, memory and price key.

This file is the one home of that table. The gcp_gpu_instance module gets it through AnsiballZ (a
module may only use module_utils); forja's cost code and the sandbox's Compute emulator load this
same file by path through ``forja.machines``, so it imports nothing but the standard library:
no Ansible, no forja. Prices are not here: ``forja_gcp_prices.json`` beside it holds them keyed
by each type's ``price_key``, read by ``forja_cost.py`` (which imports this file as its sibling).

It also holds the codes of a zone out of capacity and the statuses of a VM on its way up or down,
which the module and forja's Spot watcher both act on. It checks a machine type against the GPUs
asked for before any API call. Accelerator-optimized families (G2, A2, A3) come with their GPUs
attached by the machine type: asking for another GPU model or count is a mistake we can name before
the API answers with a less helpful 400. N1 accepts attached GPUs in fixed counts. Every other
family takes none. The tables follow Google's "GPU machine types" and "general-purpose machine
family" pages; a machine type missing here is still checked by the API (machineTypes.get) before
anything is created.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB_MB = 1024
#: GPU counts of the A2/A3 shapes named <family>-<n>g.
COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True)
class MachineType:
    """One machine type: what it carries and what it is priced as.

    ``gpu_type``/``gpu_count`` are the GPUs the machine type itself comes with (G2/A2/A3); N1 types
    carry none (attached GPUs are asked for separately). ``price_key`` names the entry of
    ``machine_types`` in forja's price table (the machine type's own name for every type here).
    """

    name: str
    vcpus: int
    memory_mb: int
    gpu_type: str | None = None
    gpu_count: int = 0
    shared_cpu: bool = False
    price_key: str = ""

    @property
    def family(self) -> str:
        return self.name.split("-", 1)[0]

    @property
    def key(self) -> str:
        """The price table entry: price_key, else the name."""
        return self.price_key or self.name


def _catalog() -> dict[str, MachineType]:
    types = [
        MachineType("e2-micro", 2, 1 * GIB_MB, shared_cpu=True),
        MachineType("e2-small", 2, 2 * GIB_MB, shared_cpu=True),
        MachineType("e2-medium", 2, 4 * GIB_MB, shared_cpu=True),
        *(MachineType(f"e2-standard-{n}", n, 4 * n * GIB_MB) for n in (2, 4, 8)),
        # N1: 3.75 GB per vCPU; GPUs are attached (N1_GPUS below), not part of the type.
        *(MachineType(f"n1-standard-{n}", n, 3840 * n) for n in (1, 2, 4, 8, 16)),
        # G2: 4 GB per vCPU; 4/8/12/16/32 vCPUs -> 1 L4, 24 -> 2, 48 -> 4, 96 -> 8.
        *(
            MachineType(f"g2-standard-{n}", n, 4 * n * GIB_MB, "nvidia-l4", gpus)
            for n, gpus in ((4, 1), (8, 1), (12, 1), (16, 1), (24, 2), (32, 1), (48, 4), (96, 8))
        ),
        # A2 Standard: 12 vCPUs and 85 GB per A100 40GB; a2-megagpu-16g: 96 vCPUs, 1360 GB, 16 GPUs.
        *(MachineType(f"a2-highgpu-{g}g", 12 * g, 85 * g * GIB_MB, "nvidia-tesla-a100", g) for g in COUNTS),
        MachineType("a2-megagpu-16g", 96, 1360 * GIB_MB, "nvidia-tesla-a100", 16),
        # A2 Ultra: 12 vCPUs and 170 GB per A100 80GB.
        *(MachineType(f"a2-ultragpu-{g}g", 12 * g, 170 * g * GIB_MB, "nvidia-a100-80gb", g) for g in COUNTS),
        # A3 High: 26 vCPUs and 234 GB per H100 80GB; Edge and Mega: 208 vCPUs, 1872 GB, 8 GPUs.
        *(MachineType(f"a3-highgpu-{g}g", 26 * g, 234 * g * GIB_MB, "nvidia-h100-80gb", g) for g in COUNTS),
        MachineType("a3-edgegpu-8g", 208, 1872 * GIB_MB, "nvidia-h100-80gb", 8),
        MachineType("a3-megagpu-8g", 208, 1872 * GIB_MB, "nvidia-h100-mega-80gb", 8),
        # A3 Ultra: 224 vCPUs, 2952 GB, 8 H200.
        MachineType("a3-ultragpu-8g", 224, 2952 * GIB_MB, "nvidia-h200-141gb", 8),
    ]
    return {m.name: m for m in types}


#: Machine type name -> what it is.
MACHINE_TYPES: dict[str, MachineType] = _catalog()

# Machine type -> (GPU model, count) for families whose GPUs come with the machine type.
ATTACHED_GPUS: dict[str, tuple[str, int]] = {
    m.name: (m.gpu_type, m.gpu_count) for m in MACHINE_TYPES.values() if m.gpu_type
}

# What each GPU model leaves for training and how fast it really is (usable memory, CUDA context,
# measured matmul rates), for `forja plan`, lives in trainer/gpus.yaml keyed by these gpu_type names:
# the trainer reads it standalone on a machine without forja (tests/cost/test_plan.py checks every
# GPU here has an entry there).

# Family prefix -> the machine type family users should pick for that GPU model.
ATTACHED_FAMILY_OF_GPU = {
    "nvidia-l4": "G2 (g2-standard-*)",
    "nvidia-tesla-a100": "A2 Standard (a2-highgpu-*, a2-megagpu-16g)",
    "nvidia-a100-80gb": "A2 Ultra (a2-ultragpu-*)",
    "nvidia-h100-80gb": "A3 High/Edge (a3-highgpu-*, a3-edgegpu-8g)",
    "nvidia-h100-mega-80gb": "A3 Mega (a3-megagpu-8g)",
    "nvidia-h200-141gb": "A3 Ultra (a3-ultragpu-8g)",
}

# GPUs that N1 machine types accept as guestAccelerators, with the counts allowed.
N1_GPUS: dict[str, tuple[int, ...]] = {
    "nvidia-tesla-t4": (1, 2, 4),
    "nvidia-tesla-v100": (1, 2, 4, 8),
    "nvidia-tesla-p4": (1, 2, 4),
    "nvidia-tesla-p100": (1, 2, 4),
}

ACCELERATOR_FAMILIES = ("g2-", "a2-", "a3-")

# Machine series that accept a compact placement policy (groupPlacementPolicy.collocation
# COLLOCATED), from Google's "Placement policies overview": the accelerator-optimized series and the
# compute/general series below. E2, N1 and the shared-core types are not among them.
COMPACT_PLACEMENT_FAMILIES = (
    "a2", "a3", "a4", "g2", "g4", "c2", "c2d", "c3", "c3d", "c4", "c4a", "c4d", "h3", "n2", "n2d", "z3",
)  # fmt: skip


def supports_compact_placement(machine_type: str) -> bool:
    """Whether Compute Engine accepts a compact placement policy for this machine type's series."""
    return machine_type.split("-", 1)[0] in COMPACT_PLACEMENT_FAMILIES


# Machine series that can be Flex-start VMs (provisioningModel FLEX_START, Dynamic Workload Scheduler),
# from Google's "About Flex-start VMs": "all accelerator-optimized machine types (except A4X and G4) and
# H4D machine types". General-purpose series (N1 with attached GPUs, N2, E2) do not qualify.
FLEX_START_SERIES = ("a2", "a3", "a4", "g2", "h4d")
# The series whose Flex-start VMs are billed at a discount (the same page: "For A4, A3, A2, and H4D
# machine types, you obtain vCPUs, memory, and any attached GPUs at a discounted price"); G2 gets
# obtainability, not a lower price: a G2 Flex-start VM is billed at the on-demand rate.
FLEX_START_DISCOUNT_SERIES = ("a2", "a3", "a4", "h4d")


def qualifies_for_flex_start(machine_type: str) -> bool:
    """Whether Compute Engine accepts this machine type as a Flex-start VM (A4X is a4x-, not a4-)."""
    return machine_type.split("-", 1)[0] in FLEX_START_SERIES


#: Google's error codes for a zone that has no capacity for the machine type right now (a stock-out):
#: the module moves to the next zone on them, forja's Spot watcher waits and tries again.
STOCKOUT_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
#: Instance statuses a VM passes through on its way up or down: wait and look again. PENDING is a
#: Flex-start request waiting in Google's queue for capacity (it may wait up to two hours).
SETTLING_STATES = (
    "PROVISIONING", "STAGING", "STOPPING", "SUSPENDING", "REPAIRING", "PENDING_STOP", "PENDING",
)  # fmt: skip


MACHINE_TYPE_RE = re.compile(r"^[a-z][a-z0-9]*-[a-z0-9-]+$")


class MachineSpecError(ValueError):
    """A machine type / GPU combination that cannot exist; the message names the field and the fix."""


@dataclass(frozen=True)
class GpuSpec:
    """What the VM will carry: the GPU model and count, and whether we must attach it in the request."""

    gpu_type: str | None
    gpu_count: int
    attach: bool


def resolve_gpus(machine_type: str, gpu_type: str | None, gpu_count: int | None) -> GpuSpec:
    """Check a machine type against the GPU asked for and say what the VM will have.

    Raises MachineSpecError naming the field (machine_type, gpu_type, gpu_count) and the fix.
    """
    if not machine_type or not MACHINE_TYPE_RE.match(machine_type):
        raise MachineSpecError(
            f"machine_type: '{machine_type}' is not a machine type name such as g2-standard-8"
        )
    gpu_type = gpu_type or None
    if machine_type in ATTACHED_GPUS:
        model, count = ATTACHED_GPUS[machine_type]
        if gpu_type and gpu_type != model:
            raise MachineSpecError(
                f"gpu_type: {machine_type} comes with {count} x {model} attached by the machine "
                f"type, not {gpu_type}; "
                f"drop gpu_type or pick a machine type of "
                f"{ATTACHED_FAMILY_OF_GPU.get(gpu_type, 'the N1 family')}"
            )
        if gpu_count not in (None, 0, count):
            raise MachineSpecError(
                f"gpu_count: {machine_type} has exactly {count} x {model}; set gpu_count to {count} "
                f"(or leave it "
                f"unset), or pick the machine type of that family with {gpu_count} GPUs"
            )
        return GpuSpec(model, count, attach=False)
    if machine_type.startswith(ACCELERATOR_FAMILIES):
        raise MachineSpecError(
            f"machine_type: '{machine_type}' is not a known G2/A2/A3 shape; use one of "
            f"{', '.join(sorted(k for k in ATTACHED_GPUS if k[:3] == machine_type[:3]))}"
        )
    if gpu_type in ATTACHED_FAMILY_OF_GPU:
        raise MachineSpecError(
            f"gpu_type: {gpu_type} is only available attached to {ATTACHED_FAMILY_OF_GPU[gpu_type]} "
            f"machine types, "
            f"not {machine_type}; set machine_type accordingly (e.g. g2-standard-8 for one L4)"
        )
    if not gpu_type:
        if gpu_count:
            raise MachineSpecError(
                f"gpu_count: {gpu_count} GPUs asked but no gpu_type; set gpu_type "
                f"(e.g. nvidia-tesla-t4 on N1) or drop gpu_count"
            )
        return GpuSpec(None, 0, attach=False)
    if not machine_type.startswith("n1-"):
        raise MachineSpecError(
            f"gpu_type: {machine_type} cannot take attached GPUs; use an N1 machine type for "
            f"{gpu_type}, or a "
            "G2/A2/A3 machine type whose GPUs come attached"
        )
    if gpu_type not in N1_GPUS:
        raise MachineSpecError(
            f"gpu_type: '{gpu_type}' is not a GPU N1 accepts; use one of {', '.join(N1_GPUS)}"
        )
    count = gpu_count or 1
    if count not in N1_GPUS[gpu_type]:
        allowed = ", ".join(str(c) for c in N1_GPUS[gpu_type])
        raise MachineSpecError(f"gpu_count: {gpu_type} on N1 comes in counts of {allowed}, not {count}")
    return GpuSpec(gpu_type, count, attach=True)


def gpus_of_machine_type(machine_type: str) -> tuple[str | None, int]:
    """GPU model and count a machine type carries by itself (None, 0 for other families)."""
    return ATTACHED_GPUS.get(machine_type, (None, 0))
