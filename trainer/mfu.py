"""Model FLOPs utilisation: what a run's throughput means against the hardware, decided once per session.

Why a record of its own: MFU needs three facts that are found at setup (the FLOPs of one sample, the
datasheet peak, a measured matmul ceiling) and one that changes every log step (samples/s). The
summary, metrics.jsonl, the live endpoint and the bench all turn them into the same figures here,
and a missing figure carries the reason it is missing (``note``) instead of a silent null.

Where the FLOPs come from: a model that states its own (``model.flops_per_sample()``, as
trainer.gpt does: 6 x weights x tokens plus attention) is taken at its word on any device. Otherwise
a GPU run counts one micro-batch with ``FlopCounterMode``; a CPU run does not count (its first use
costs about a second, which a short CPU run would feel), and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Why a CPU run has no datasheet MFU (its MFU, when FLOPs are known, is against the measured ceiling).
CPU_NOTE = "CPU: no datasheet peak; MFU is against the matmul ceiling measured at the start"
#: Why a run without counted FLOPs has no MFU at all.
UNCOUNTED_NOTE = (
    "FLOPs not counted: on a CPU only a model with flops_per_sample() is (FlopCounterMode's first "
    "use costs about a second); on a GPU the count failed (see the log)"
)


@dataclass(frozen=True)
class Utilisation:
    """One session's MFU inputs; ``figures`` turns a throughput into the reported numbers."""

    flops_per_sample: float | None = None  # training FLOPs (forward + backward) of one sample
    tokens_per_sample: int | None = None  # a token model's sequence length (None: not a token model)
    peak_flops: float | None = None  # the device's datasheet FLOP/s in the run's precision
    ceiling_flops: float | None = None  # a large matmul's FLOP/s measured at the session's start
    note: str | None = None  # why an MFU figure is missing or only partly meaningful

    def figures(self, samples_per_s: float) -> dict[str, float | None]:
        """tokens/s, achieved TFLOP/s and MFU against the peak and the ceiling (None where unknown)."""
        achieved = self.flops_per_sample * samples_per_s if self.flops_per_sample else None
        known = achieved is not None
        return {
            "tokens_per_s": samples_per_s * self.tokens_per_sample if self.tokens_per_sample else None,
            "achieved_tflops": achieved / 1e12 if known else None,
            "mfu": achieved / self.peak_flops if known and self.peak_flops else None,
            "mfu_ceiling": achieved / self.ceiling_flops if known and self.ceiling_flops else None,
        }

    def describe(self) -> dict[str, Any]:
        """The session's fixed facts, for the summary and the start event (TFLOP/s, rounded)."""
        return {
            "peak_tflops": round(self.peak_flops / 1e12, 2) if self.peak_flops else None,
            "ceiling_tflops": round(self.ceiling_flops / 1e12, 3) if self.ceiling_flops else None,
            "mfu_note": self.note,
        }


def tokens_per_sample(model: Any, batch: Any) -> int | None:
    """A token model's sequence length: the model's own ``tokens_per_sample``, else the length of a
    2-D integer input (B, T) in the batch (the first tensor of a tuple or an ``input_ids`` key)."""
    stated = getattr(model, "tokens_per_sample", None)
    if isinstance(stated, int) and stated > 0:
        return stated
    first = batch[0] if isinstance(batch, tuple | list) and batch else batch
    if isinstance(first, dict):
        first = first.get("input_ids")
    shape = getattr(first, "shape", None)
    dtype = getattr(first, "dtype", None)
    if shape is None or len(shape) != 2 or dtype is None or dtype.is_floating_point:
        return None
    return int(shape[1])
