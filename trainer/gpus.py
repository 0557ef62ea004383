"""trainer/gpus.yaml read as typed constants: the target GPUs' memory, rates and sources.

Why a module of its own: the memory estimate (trainer/estimate.py) and the plan (trainer/plan.py)
both read the table, and the plan also uses the estimate's hook measurement as its fallback; the
table's reader below both keeps them from importing each other. It needs no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

import yaml

MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True)
class GpuSpec:
    """One target's constants (see trainer/gpus.yaml for each field's meaning and source)."""

    name: str
    usable_mib: float
    context_mib: float
    allocator_overhead: float
    tflops: dict[str, float]
    bandwidth_gbs: float
    launch_us: float
    host_op_us: float
    auto_precision: str
    aliases: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)
    #: The torch device this target is, when the plan runs on it ("cpu", or "cuda" on a lent GPU):
    #: its heavy ops are then timed on it at the step's own shapes (:class:`OpTimes`), not modelled.
    measure_on: str | None = None

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu"

    def datasheet_tflops(self, precision: str) -> float | None:
        """The datasheet peak for ``precision`` (trainer/hardware.py's table, the MFU denominator)."""
        from trainer.hardware import peak_flops

        for alias in self.aliases:
            found = peak_flops(alias, precision)
            if found:
                return found / 1e12
        return None

    def how(self, key: str) -> str:
        """measured / modelled / datasheet, from the constant's source."""
        return self.sources.get(key, "modelled").split(":", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_table() -> dict[str, GpuSpec]:
    """Every GPU of trainer/gpus.yaml by its catalog name (forja reads the same file)."""
    text = resources.files("trainer").joinpath("gpus.yaml").read_text()
    table = yaml.safe_load(text)["gpus"]
    return {
        name: GpuSpec(name=name, **{**entry, "aliases": tuple(entry.get("aliases", ()))})
        for name, entry in table.items()
    }


def named(name: str) -> GpuSpec | None:
    """The table's GPU called ``name`` (its catalog name or an alias, any case), or None."""
    wanted = name.lower()
    return next((spec for spec in gpu_table().values()
                 if wanted in (spec.name.lower(), *(a.lower() for a in spec.aliases))), None)


def ran_on(target: str, device: str | None) -> bool:
    """Whether a run that reports ``device`` (its summary's ``gpu_name``, torch's name such as "NVIDIA
    L4", or "cpu") ran on the plan target ``target`` (a catalog GPU name such as nvidia-l4, or "cpu").

    Why it matters: a plan's figures are for its target only; the sandbox's VM is a g2-standard-8
    whose run trains on the CPU, and its step time says nothing about the L4's.
    """
    if not device:
        return False
    if target.lower() == "cpu" or device.lower() == "cpu":
        return target.lower() == device.lower()
    spec = gpu_table().get(target)
    names = (spec.aliases if spec is not None else ()) or (target,)
    return any(a.lower() in device.lower() for a in names)
