"""When a run has diverged: the loss judged step by step, and what the run says when it stops.

Why: with a learning rate too high (``lr: 1e6``) the loss is NaN within ten steps, and without a
judge the run went on to its last step, ended "completed" with exit 0 and exported NaN weights:
every GPU hour after the divergence was wasted and a broken model could be published. The loop
asks :class:`Judge` about each checked step's loss (``check_finite_every_steps``) before the
optimizer applies it. The answer is to go on, to skip the batch (``skip_nonfinite``, the budget
large-model trainers keep for a rare bad batch), or to stop: the run then ends with status
"diverged" and exit code 7 (:data:`trainer.exit_codes.DIVERGED`), which the unit never restarts,
and names the step, the last finite loss and the newest checkpoint before the divergence.

Pure Python (no torch): the same judge serves the built-in loop and a user's own loop
(:meth:`trainer.runlib.Run.log`), and is tested without a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainer.finite import word

Verdict = Literal["ok", "skip", "diverged"]


class Diverged(Exception):
    """The run diverged (raised by a user's loop through trainer.runlib; the built-in loop stops)."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        super().__init__(sentence(record))


@dataclass
class Judge:
    """Judges each checked loss; remembers the last finite one and the batches skipped."""

    skip_budget: int = 0
    bound: float | None = None
    skipped: list[int] = field(default_factory=list)
    last_finite_step: int | None = None
    last_finite_loss: float | None = None

    def judge(self, step: int, loss: float) -> Verdict:
        """The verdict on ``loss``, the loss of optimizer step ``step`` (1-based, the step it would make)."""
        if math.isfinite(loss) and (self.bound is None or loss <= self.bound):
            self.last_finite_step, self.last_finite_loss = step, loss
            return "ok"
        if not math.isfinite(loss) and len(self.skipped) < self.skip_budget:
            self.skipped.append(step)
            return "skip"
        return "diverged"

    def newest_good_step(self, step: int) -> int:
        """The newest checkpoint step that can still be good when the loss of ``step`` diverged: the
        one before the last finite loss (the checkpoint of step N holds the weights step N+1's loss
        used); with no finite loss seen, the one before the checkpoint whose weights gave the bad loss."""
        return (self.last_finite_step if self.last_finite_step is not None else step - 1) - 1

    def stop(self, step: int, loss: float, checkpoints: Any, main: bool) -> dict[str, Any]:
        """The divergence record at ``step``, naming the newest good checkpoint; on rank 0 (``main``)
        the checkpoints after it are set aside, so a restart (a lower lr) resumes from the good one.
        ``checkpoints`` is the run's trainer.checkpoint.CheckpointManager (the built-in loop's or a
        runlib loop's): one path for both."""
        record = self.record(step, loss, good_checkpoint(checkpoints.list(), self.last_finite_step))
        if main:
            record["set_aside"] = checkpoints.set_aside_after(self.newest_good_step(step))
        return record

    def record(self, step: int, loss: float, last_checkpoint: str | None) -> dict[str, Any]:
        """What the run's summary and its ``diverged`` event say about the divergence at ``step``."""
        over = math.isfinite(loss)
        return {
            "step": step,
            "loss": word(loss) if not over else loss,
            "reason": f"loss {loss:.6g} above divergence_loss_bound {self.bound:g}" if over
            else f"loss is {word(loss)}",
            "last_finite_step": self.last_finite_step,
            "last_finite_loss": self.last_finite_loss,
            "skipped_steps": list(self.skipped),
            "last_good_checkpoint": last_checkpoint,
            "set_aside": [],
        }  # fmt: skip


def good_checkpoint(checkpoints: list[Path], last_finite_step: int | None) -> str | None:
    """The newest of ``checkpoints`` (``ckpt-<step>.pt``, oldest first) whose weights produced a finite
    loss: saved at or before the step before the last finite one, because the checkpoint of step N
    holds the weights that step N+1's loss was computed with."""
    if last_finite_step is None:
        return None
    good = [path.name for path in checkpoints if checkpoint_step(path) <= last_finite_step - 1]
    return good[-1] if good else None


def checkpoint_step(path: Path) -> int:
    return int(path.name.removeprefix("ckpt-").split(".", 1)[0])


def weights_record(step: int, tensors: list[str], last_checkpoint: str | None) -> dict[str, Any]:
    """The divergence record of a run whose loss stayed finite but whose final weights are not."""
    from trainer.finite import describe_tensors

    return {
        "step": step,
        "loss": None,
        "reason": f"the final weights are not finite ({describe_tensors(tensors)})",
        "last_finite_step": None,
        "last_finite_loss": None,
        "skipped_steps": [],
        "last_good_checkpoint": last_checkpoint,
    }


def sentence(record: dict[str, Any]) -> str:
    """One line for people: where it diverged, the last finite loss, where to resume from."""
    text = f"diverged at step {record['step']}: {record['reason']}"
    if record.get("last_finite_loss") is not None:
        text += f"; last finite loss {record['last_finite_loss']:.6g} at step {record['last_finite_step']}"
    if record.get("skipped_steps"):
        text += f"; skipped {len(record['skipped_steps'])} bad batch(es) first (skip_nonfinite)"
    checkpoint = record.get("last_good_checkpoint")
    if checkpoint:
        return (f"{text}; newest checkpoint before it: {checkpoint}; nothing was exported. Lower lr (or "
                "check the data), then resume from that checkpoint")  # fmt: skip
    return f"{text}; no checkpoint before it; nothing was exported. Lower lr (or check the data), start again"
