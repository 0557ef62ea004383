"""Survival: a run stopped by SIGTERM mid-epoch and resumed is bit-identical to one that never stopped."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import tiny_digits

from trainer import run_folder
from trainer.checkpoint import CheckpointManager
from trainer.config import validate
from trainer.train import train


def losses(run: Path) -> list[tuple[int, float]]:
    lines = (run / run_folder.METRICS).read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    found = CheckpointManager(run / run_folder.CHECKPOINTS_DIR).load_latest()
    assert found is not None
    return found.state["model"]


def sigterm_at(step: int) -> Any:
    """An on_step hook that sends this process a real SIGTERM once ``step`` is done."""

    def hook(done: int) -> None:
        if done == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({}, id="fp32"),
        pytest.param(
            {"precision": "bf16", "effective_batch_size": 32, "grad_clip": 0.5}, id="bf16-accumulation"
        ),
    ],
)
def test_resume_mid_epoch_is_bit_exact(tmp_path: Path, extra: dict[str, Any]) -> None:
    # digits: 1438 training samples / 16 per step = 89 steps per epoch; stop at 37 (mid-epoch),
    # then run past the epoch boundary to 100
    raw = tiny_digits(tmp_path, steps=100, **extra)
    straight = train(validate({**raw, "out_dir": str(tmp_path / "straight")}))
    assert straight.status == "completed"

    interrupted_dir = tmp_path / "interrupted"
    config = validate({**raw, "out_dir": str(interrupted_dir)})
    first = train(config, on_step=sigterm_at(37))  # the signal lands after step 37; the save at 38
    assert (first.status, first.exit_code, first.summary["steps"]) == ("preempted", 3, 38)
    saved = CheckpointManager(interrupted_dir / run_folder.CHECKPOINTS_DIR).list()
    assert [p.name for p in saved] == ["ckpt-38.pt"]

    second = train(config)
    assert second.status == "completed"
    assert second.summary["resumed_from_step"] == 38
    assert second.summary["lost_steps"] == 0 and second.summary["preemptions"] == 1

    assert losses(interrupted_dir) == losses(tmp_path / "straight")
    a, b = final_weights(tmp_path / "straight"), final_weights(interrupted_dir)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"


def test_lost_work_is_counted_when_the_newest_checkpoint_is_gone(tmp_path: Path) -> None:
    raw = tiny_digits(tmp_path, steps=30, checkpoint_every_steps=10)
    config = validate(raw)
    run = Path(raw["out_dir"])
    train(config, on_step=sigterm_at(24))  # checkpoints at 10, 20 and 25 (stop)
    (run / run_folder.CHECKPOINTS_DIR / "ckpt-25.pt").write_bytes(b"not a zip: truncated by a full disk")
    result = train(config)
    assert result.summary["resumed_from_step"] == 20
    assert result.summary["lost_steps"] == 5
    assert (run / run_folder.CHECKPOINTS_DIR / "ckpt-25.pt.corrupt").exists()
    steps = [s for s, _ in losses(run)]
    assert steps == list(range(1, 31)), "metrics of redone steps must not appear twice"


def test_killed_before_the_first_checkpoint_restarts_from_zero_and_counts_the_loss(tmp_path: Path) -> None:
    raw = tiny_digits(tmp_path, steps=20)
    run = Path(raw["out_dir"])
    train(validate(raw), on_step=sigterm_at(11))
    for ckpt in (run / run_folder.CHECKPOINTS_DIR).iterdir():  # as if the VM died before any save landed
        ckpt.unlink()
    result = train(validate(raw))
    assert (result.summary["resumed_from_step"], result.summary["lost_steps"]) == (0, 12)
    assert [s for s, _ in losses(run)] == list(range(1, 21))


def test_dataloader_workers_give_the_same_run_as_the_main_process(tmp_path: Path) -> None:
    base = tiny_digits(tmp_path, steps=100, batch_size=32)  # crosses an epoch end (44 steps per epoch)
    train(validate({**base, "out_dir": str(tmp_path / "w0"), "num_workers": 0}))
    train(validate({**base, "out_dir": str(tmp_path / "w2"), "num_workers": 2}))
    assert losses(tmp_path / "w0") == losses(tmp_path / "w2")
