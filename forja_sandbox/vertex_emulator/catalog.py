"""What the emulated Vertex AI training service accepts: machine shapes and each region's GPUs.

Nothing here is a table of its own. Machine types and the GPUs they carry or accept are forja's one
machine catalog (plugins/module_utils/forja_gcp_machines.py, read through ``forja.machines``);
which regions offer which GPU is the sandbox Compute emulator's zone table (a region offers a GPU
when one of its zones does), so the sandbox's VMs and its Vertex jobs agree on where a GPU exists.
Vertex names accelerators by the ``AcceleratorType`` enum (``NVIDIA_L4``); Compute Engine by its
accelerator-type resource (``nvidia-l4``). The two spellings follow one rule, ``to_compute_name``.
"""

from __future__ import annotations

from forja import machines
from forja_sandbox.compute_emulator import catalog as compute_catalog


class MachineRefused(ValueError):
    """A machine spec Vertex would refuse; ``field`` is the request field it names."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


#: The catalog names the field it refuses as gcp_gpu_instance does; Vertex's MachineSpec calls them so.
_VERTEX_FIELD = {
    "machine_type": "machine_type",
    "gpu_type": "accelerator_type",
    "gpu_count": "accelerator_count",
}


def _vertex_words(text: str) -> str:
    """The catalog's explanation with Vertex's field names, so its fix reads right in a job spec."""
    for ours, vertex in _VERTEX_FIELD.items():
        text = text.replace(ours, vertex)
    return text


def to_compute_name(accelerator: str) -> str:
    """``NVIDIA_TESLA_T4`` -> ``nvidia-tesla-t4``: Vertex's enum name as Compute Engine spells it."""
    return accelerator.lower().replace("_", "-")


def regions() -> set[str]:
    """The regions the sandbox knows (those of the Compute emulator's zones)."""
    return set(compute_catalog.ZONES.values())


def region_offers(region: str, accelerator: str) -> bool:
    """Whether any zone of ``region`` offers ``accelerator`` (Vertex enum name)."""
    found = compute_catalog.ACCELERATOR_TYPES.get(to_compute_name(accelerator))
    return found is not None and any(compute_catalog.ZONES.get(z) == region for z in found.zones)


def check_machine(region: str, field: str, machine_type: str, accelerator: str | None, count: int) -> None:
    """Refuse a machine type / accelerator / region combination the way Vertex words it.

    ``field`` is the machine spec's path (``job_spec.worker_pool_specs[0].machine_spec``). The
    combination itself is judged by the catalog's ``resolve_gpus``; its own explanation (which family
    to pick instead) follows Google's sentence, so the user gets Google's words and the fix.
    """
    gpu_type = to_compute_name(accelerator) if accelerator else None
    try:
        machines.catalog().resolve_gpus(machine_type, gpu_type, count or None)
    except machines.catalog().MachineSpecError as exc:
        if accelerator:
            message = f'Accelerator "{accelerator}" is not supported for machine type "{machine_type}".'
        else:
            message = f'Machine type "{machine_type}" is not supported.'
        named, _, why = str(exc).partition(": ")
        raise MachineRefused(f"{field}.{_VERTEX_FIELD[named]}", f"{message} ({_vertex_words(why)})") from exc
    if accelerator and not region_offers(region, accelerator):
        offering = sorted(r for r in regions() if region_offers(r, accelerator))
        raise MachineRefused(
            f"{field}.accelerator_type",
            f'Accelerator "{accelerator}" is not supported in region "{region}". '
            f"(regions that offer it: {', '.join(offering) or 'none'})",
        )
