# Copyright: forja contributors
# Apache-2.0
"""Which GPUs a machine type carries or accepts, checked before any API call.

Accelerator-optimized families (G2, A2, A3) come with their GPUs attached by the machine type:
asking for another GPU model or count is a mistake we can name before the API answers with a
less helpful 400. N1 accepts attached GPUs in fixed counts. Every other family takes none.
The tables follow Google's "GPU machine types" pages; a machine type missing here is still
checked by the API (machineTypes.get) before anything is created.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Machine type -> (GPU model, count) for families whose GPUs come with the machine type.
ATTACHED_GPUS: dict[str, tuple[str, int]] = {
    "g2-standard-4": ("nvidia-l4", 1),
    "g2-standard-8": ("nvidia-l4", 1),
    "g2-standard-12": ("nvidia-l4", 1),
    "g2-standard-16": ("nvidia-l4", 1),
    "g2-standard-32": ("nvidia-l4", 1),
    "g2-standard-24": ("nvidia-l4", 2),
    "g2-standard-48": ("nvidia-l4", 4),
    "g2-standard-96": ("nvidia-l4", 8),
    "a2-highgpu-1g": ("nvidia-tesla-a100", 1),
    "a2-highgpu-2g": ("nvidia-tesla-a100", 2),
    "a2-highgpu-4g": ("nvidia-tesla-a100", 4),
    "a2-highgpu-8g": ("nvidia-tesla-a100", 8),
    "a2-megagpu-16g": ("nvidia-tesla-a100", 16),
    "a2-ultragpu-1g": ("nvidia-a100-80gb", 1),
    "a2-ultragpu-2g": ("nvidia-a100-80gb", 2),
    "a2-ultragpu-4g": ("nvidia-a100-80gb", 4),
    "a2-ultragpu-8g": ("nvidia-a100-80gb", 8),
    "a3-highgpu-1g": ("nvidia-h100-80gb", 1),
    "a3-highgpu-2g": ("nvidia-h100-80gb", 2),
    "a3-highgpu-4g": ("nvidia-h100-80gb", 4),
    "a3-highgpu-8g": ("nvidia-h100-80gb", 8),
    "a3-edgegpu-8g": ("nvidia-h100-80gb", 8),
    "a3-megagpu-8g": ("nvidia-h100-mega-80gb", 8),
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8),
}

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
