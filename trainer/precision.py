"""Mixed precision: bf16 autocast where the hardware is fast at it, fp16 + GradScaler where only fp16 is.

Why: the L4 (Ada, sm_89) runs bf16 on its tensor cores at about 4x its fp32 rate, and bf16 keeps
fp32's exponent range, so no loss scaling is needed. Older GPUs (T4, V100) only have fast fp16,
whose narrow range needs a GradScaler. On CPUs with AMX or AVX-512 BF16 autocast is also faster
(measured 1.3-1.5x on this project's machines); elsewhere the CPU stays in fp32.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@cache
def cpu_has_fast_bf16() -> bool:
    """AMX-BF16 or AVX512-BF16 in /proc/cpuinfo (Linux); False where it cannot be read."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve(requested: str, device: str) -> str:
    """auto -> the fastest safe choice for ``device``; an explicit choice is kept."""
    if requested != "auto":
        return requested
    if device == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16"
        return "fp16" if torch.cuda.get_device_capability()[0] >= 7 else "fp32"
    return "bf16" if cpu_has_fast_bf16() else "fp32"


@dataclass(frozen=True)
class Amp:
    """The autocast context and the GradScaler (a disabled no-op unless fp16) for one run."""

    precision: str
    device_type: str
    scaler: torch.amp.GradScaler

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=DTYPES[self.precision])


def make_amp(precision: str, device_type: str) -> Amp:
    return Amp(precision, device_type, torch.amp.GradScaler(device_type, enabled=precision == "fp16"))
