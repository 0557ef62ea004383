"""summary.json has one field list (trainer.summary): every writer writes exactly it, forja reads it.

Real runs on CPU: the built-in loop (completed, preempted then resumed, failed) and a user's own loop
(trainer.runlib), then ``report``. forja's history columns and its ``train`` table are read from those
same files through the same list.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from test_runlib import short_run
from trainer_helpers import tiny_digits

from forja.cli import SUMMARY_SHOWN
from forja.history import summary_fields
from trainer import run_folder
from trainer.config import validate
from trainer.report import render
from trainer.summary import FIELDS, HEADLINE
from trainer.train import train


def written(run: Path) -> dict[str, Any]:
    return json.loads((run / run_folder.SUMMARY).read_text())


def test_the_built_in_loop_writes_exactly_the_field_list_and_forja_reads_it(tmp_path: Path) -> None:
    raw = tiny_digits(tmp_path, steps=30, eval_every_steps=10)
    run = Path(raw["out_dir"])

    def stop_at_12(step: int) -> None:
        if step == 12:
            os.kill(os.getpid(), signal.SIGTERM)

    first = train(validate(raw), on_step=stop_at_12)
    assert first.status == "preempted" and first.summary == written(run)
    assert list(written(run)) == sorted(FIELDS), "every field, no other (json sorts the keys)"
    assert (first.summary["exit_code"], first.summary["resumed_from_step"]) == (3, None)

    done = train(validate(raw))
    summary = written(run)
    assert done.status == "completed" and list(summary) == sorted(FIELDS)
    assert (summary["exit_code"], summary["preemptions"]) == (0, 1)
    assert summary["resumed_from_step"] == first.summary["steps"]
    assert all(summary[k] is not None for k in HEADLINE), summary
    assert summary["error"] is None and summary["script"] is None and summary["mfu"] is None  # CPU

    # forja: its history columns come from these fields (not cost_usd: the trainer's count is a part of the
    # run's cost, which forja settles at the run's end), its table shows the trainer's headline
    assert summary_fields(summary) == {
        "steps": 30,
        "last_loss": summary["final_loss"],
        "lost_steps": 0,
        "preemptions": 1,
    }
    assert tuple(SUMMARY_SHOWN) == HEADLINE

    # report adds its medians and plots to the same fields, no others
    refreshed = render(run)
    assert list(written(run)) == sorted(FIELDS) and refreshed["median_samples_per_s"] > 0
    assert refreshed["plots"] and all((run / p).is_file() for p in refreshed["plots"])


def test_a_failed_run_writes_the_same_fields(tmp_path: Path) -> None:
    raw = tiny_digits(tmp_path, loss="trainer_fakes:broken_loss")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        train(validate(raw))
    summary = written(Path(raw["out_dir"]))
    assert list(summary) == sorted(FIELDS)
    assert (summary["status"], summary["exit_code"]) == ("failed", 1)
    assert "shape mismatch in the loss" in summary["error"]
    assert summary_fields(summary) == {}, "a run that failed before its summary has no columns to give"


def test_a_users_own_loop_writes_the_same_fields(tmp_path: Path) -> None:
    short_run(tmp_path / "run", 6, render_plots=False)
    summary = written(tmp_path / "run")
    assert list(summary) == sorted(FIELDS)
    assert (summary["status"], summary["steps"], summary["exit_code"]) == ("completed", 6, 0)
    assert summary["accuracy"] is None and summary["script"]  # its own loop: no built-in evaluation
    assert summary_fields(summary)["steps"] == 6
