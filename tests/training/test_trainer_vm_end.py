"""A run on a VM with a known end (a Flex-start VM's max run duration, FORJA_ENDS_AT) stops a margin
before it as it would for a preemption notice: it saves, mirrors that checkpoint to the bucket in
full, and exits preempted, to be resumed on the next VM.

The real trainer on the tiny digits run, mirroring to the sandbox's storage emulator."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from trainer_helpers import objects, tiny_digits

from trainer import run_folder
from trainer.config import validate
from trainer.metrics import read_jsonl
from trainer.preemption import ENDS_AT_ENV, ENDS_MARGIN_ENV, VM_END, VmEnd
from trainer.train import train


def test_a_run_saves_and_mirrors_its_checkpoint_before_the_vms_end(
    tmp_path: Path, bucket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    began = time.time()
    monkeypatch.setenv(ENDS_AT_ENV, str(began + 4.0))
    monkeypatch.setenv(ENDS_MARGIN_ENV, "2")
    raw = tiny_digits(tmp_path, steps=200_000, log_every_steps=100, checkpoint_bucket=f"gs://{bucket.name}/exp")
    result = train(validate(raw))
    stopped = time.time()

    assert began + 2.0 <= stopped < began + 4.0, "stopped at the margin, before the VM's end"
    events = list(read_jsonl(Path(raw["out_dir"]) / run_folder.EVENTS))
    preempt = next(e for e in events if e["event"] == "preempt")
    assert preempt["signal"] == VM_END and 0 < preempt["saved_step"] < 200_000
    mirror = next(e for e in events if e["event"] == "mirror")
    assert mirror["complete"] and preempt["saved_step"] in mirror["uploaded_steps"]
    assert f"exp/run/checkpoints/ckpt-{preempt['saved_step']}.pt" in objects(bucket, "exp/run/checkpoints/")
    assert result.status == "preempted"


@pytest.mark.parametrize(
    ("ends_at", "margin", "stop_at"),
    [
        ("2026-11-30T10:00:00.000-08:00", None, 1796061600.0 - 600),  # Google's form, with an offset
        ("2026-11-30T18:00:00Z", "60", 1796061600.0 - 60),
        ("1796061600", "0", 1796061600.0),
        ("", None, None),
    ],
)
def test_the_vms_end_reads_googles_time_and_the_margin(ends_at, margin, stop_at):
    env = {ENDS_AT_ENV: ends_at, **({ENDS_MARGIN_ENV: margin} if margin is not None else {})}
    assert VmEnd.from_env(env, now=1796000000.0).stop_at == stop_at


def test_an_end_already_past_at_start_is_stale_and_stops_nothing():
    """A VM stopped at its end and started again boots with its last period's environment."""
    end = VmEnd.from_env({ENDS_AT_ENV: "2026-11-30T18:00:00Z"}, now=1796061600.0 + 1)
    assert end.stop_at is None and "is past" in end.stale and not end.due()


@pytest.mark.parametrize(("ends_at", "margin", "named"), [("next week", None, ENDS_AT_ENV),
                                                          ("1796061600", "-5", ENDS_MARGIN_ENV)])
def test_an_unreadable_end_is_an_error_naming_the_variable(ends_at, margin, named):
    env = {ENDS_AT_ENV: ends_at, **({ENDS_MARGIN_ENV: margin} if margin is not None else {})}
    with pytest.raises(ValueError, match=named):
        VmEnd.from_env(env)
