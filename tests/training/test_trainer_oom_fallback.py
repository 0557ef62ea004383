"""An OOM mid-run: save, lower the micro-batch (same global batch through accumulation), go on, record it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from trainer_helpers import tiny_digits

from trainer import run_folder
from trainer.config import validate
from trainer.metrics import read_jsonl
from trainer.train import train


@pytest.mark.parametrize("style", ["type", "message"])
def test_an_oom_mid_run_lowers_the_micro_batch_and_the_run_completes(tmp_path: Path, style: str) -> None:
    # room for 32 samples for 10 forward passes, then for 12 only: 32 -> 16 (x2) -> 8 (x4)
    raw = tiny_digits(
        tmp_path, model="robustness_fakes:oom_above", model_args={"limit": 12, "after": 10, "style": style}
    )
    raw.update(steps=30, batch_size=32)
    result = train(validate(raw))
    assert result.status == "completed" and result.summary["steps"] == 30
    s = result.summary
    assert (s["micro_batch"], s["accum_steps"], s["global_batch"]) == (8, 4, 32)
    assert s["oom_fallbacks"] == [{"step": 10, "from": 32, "to": 16}, {"step": 10, "from": 16, "to": 8}]
    events = list(read_jsonl(Path(raw["out_dir"]) / run_folder.EVENTS))
    ooms = [e for e in events if e["event"] == "oom"]
    assert [(e["from_micro_batch"], e["micro_batch"], e["accum"]) for e in ooms] == [(32, 16, 2), (16, 8, 4)]
    saves = [e for e in events if e["event"] == "checkpoint"]
    assert [e["reason"] for e in saves][:2] == ["oom", "oom"], "it saves before going on"
    steps = [r["step"] for r in read_jsonl(Path(raw["out_dir"]) / run_folder.METRICS)]
    assert steps == list(range(1, 31)), "no step is lost or repeated"


def test_a_restart_after_an_oom_keeps_the_lowered_micro_batch(tmp_path: Path) -> None:
    raw = tiny_digits(tmp_path, model="robustness_fakes:oom_above", model_args={"limit": 16, "after": 4})
    raw.update(steps=20, batch_size=32)
    config = validate(raw)

    def stop_at_12(step: int) -> None:
        if step == 12:
            os.kill(os.getpid(), signal.SIGTERM)

    first = train(config, on_step=stop_at_12)
    assert first.status == "preempted" and first.summary["micro_batch"] == 16
    # a new process: the model's memory is fresh, but it would OOM again at 32 after 4 passes
    second = train(config)
    assert second.status == "completed" and second.summary["micro_batch"] == 16
    assert second.summary["oom_fallbacks"] == [{"step": 4, "from": 32, "to": 16}]
    assert len([e for e in read_jsonl(Path(raw["out_dir"]) / run_folder.EVENTS) if e["event"] == "oom"]) == 1


def test_an_oom_at_micro_batch_1_is_not_retried(tmp_path: Path) -> None:
    raw = tiny_digits(tmp_path, model="robustness_fakes:oom_above", model_args={"limit": 0, "after": 2})
    raw.update(steps=5, batch_size=1)
    with pytest.raises(Exception, match="CUDA out of memory"):
        train(validate(raw))
