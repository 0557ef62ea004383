"""summary.json: the one list of what a run's summary holds, for every writer and every reader.

Why one list: the summary is written by the built-in loop (:mod:`trainer.train`), by a user's own
loop (:mod:`trainer.runlib`), by a failure note and by ``report``, and read by forja's history, its
``train`` table and ``python -m trainer train``'s last line. Written out in each of those places, a
renamed or added field silently became ``None`` in some of them. Here it is one dataclass: every
summary.json has every field (``None``: not known for this run), a writer that names a field not in
the list fails at once, and readers take the names from :data:`FIELDS` / :data:`HEADLINE`.

Standard library only: forja imports this module from the product install, where torch is absent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Summary:
    """One run folder's summary.json, field by field (the order is the order people read it in)."""

    #: "completed", "preempted", "diverged" or "failed" ("running" only in a user's loop that has not ended).
    status: str
    #: Optimizer steps done, and how many the run has in all.
    steps: int | None = None
    total_steps: int | None = None
    #: The training loss at the last logged step; the held-out loss and accuracy of the last evaluation.
    final_loss: float | None = None
    accuracy: float | None = None
    eval_loss: float | None = None
    #: Mean throughput of this session's loop (samples over the loop's wall time).
    samples_per_s: float | None = None
    #: Wall time over all sessions (setup included) and what it cost at ``price_per_hour``: the trainer's
    #: own count, "of which training" of the run's cost that forja settles (trainer.metrics.cost_usd).
    wall_s: float | None = None
    cost_usd: float | None = None
    #: The step this session resumed from (None: a fresh start), and what preemptions cost.
    resumed_from_step: int | None = None
    lost_steps: int | None = None
    #: Sessions stopped by a SIGTERM with a clean save (Spot, maintenance), those `forja stop` stopped
    #: (trainer.preemption.STOP_REQUESTED), and those that crashed or were killed with no last word,
    #: then resumed.
    preemptions: int | None = None
    stops: int | None = None
    restarts: int | None = None
    #: File names under checkpoints/ (the best is the last until a metric picks another).
    last_checkpoint: str | None = None
    best_checkpoint: str | None = None
    #: What ran: parameters, precision, device, processes and the batch the run settled on.
    params: int | None = None
    precision: str | None = None
    device: str | None = None
    world_size: int | None = None
    micro_batch: int | None = None
    accum_steps: int | None = None
    global_batch: int | None = None
    #: Training FLOPs per sample: the model's own statement (trainer.gpt), else counted on a GPU.
    flops_per_sample: float | None = None
    #: A token model's throughput (samples/s x tokens per sample) and the FLOP/s it achieved.
    tokens_per_s: float | None = None
    achieved_tflops: float | None = None
    #: Model FLOPs utilisation against the datasheet peak (a GPU in trainer.hardware's table) and
    #: against the matmul ceiling measured at the start (trainer.benchmark.matmul_ceiling), the
    #: figures themselves (TFLOP/s), and why one is missing (trainer.mfu).
    mfu: float | None = None
    mfu_ceiling: float | None = None
    peak_tflops: float | None = None
    ceiling_tflops: float | None = None
    mfu_note: str | None = None
    #: Seconds from the session's start (the process's, from the command line) to the loop's first
    #: step: imports, data, model, resume.
    startup_s: float | None = None
    #: What the run measured, for the plan's calibration (trainer.plan, `forja plan --calibrate`):
    #: seconds per optimizer step over this session's loop, and on a GPU the allocator's peaks
    #: (torch.cuda.max_memory_allocated / max_memory_reserved, MiB) and the GPU's name. None on a
    #: CPU: its allocator keeps no peak, and a process's RSS is not what a plan predicts.
    step_s: float | None = None
    peak_allocated_mib: float | None = None
    peak_reserved_mib: float | None = None
    gpu_name: str | None = None
    #: Each out-of-memory fallback: {"step", "from", "to"} micro-batches.
    oom_fallbacks: list[dict[str, int]] = field(default_factory=list)
    #: The user's script, for a run of their own loop (trainer.runlib).
    script: str | None = None
    #: Why a failed run failed, and the process's exit code (trainer.exit_codes).
    error: str | None = None
    exit_code: int | None = None
    #: A diverged run: the step, why, the last finite loss and the newest checkpoint before it
    #: (trainer.divergence.Judge.record).
    divergence: dict[str, Any] | None = None
    #: Filled by ``report`` from metrics.jsonl, with the plots it drew.
    median_samples_per_s: float | None = None
    median_data_wait_fraction: float | None = None
    plots: list[str] | None = None
    #: When the summary was written (Unix time).
    time: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """The summary in ``data`` (a summary.json): fields it lacks are None, names not in the list dropped
        (a summary from an older trainer still reads)."""
        known = {k: v for k, v in data.items() if k in FIELDS}
        known.setdefault("status", "unknown")
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        """Every field, for summary.json."""
        return dataclasses.asdict(self)


#: Every field of summary.json, in order.
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Summary))

#: The short view of a finished run: ``python -m trainer train``'s last line and ``forja train``'s table.
HEADLINE: tuple[str, ...] = (
    "status", "steps", "final_loss", "accuracy", "samples_per_s", "wall_s", "cost_usd",
)  # fmt: skip
