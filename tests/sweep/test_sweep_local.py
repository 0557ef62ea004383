"""Whole sweeps through real Optuna and real trainer runs (the LocalRunner: `python -m trainer train`
children, as the VM's unit runs them), each trial a few seconds of the digits demo on the CPU."""

from __future__ import annotations

import json
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psutil
import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from starlette.testclient import TestClient
from typer.testing import CliRunner

from forja import errors
from forja.api import Forja
from forja.cli import app
from forja.cost_report import SETTLED_EVENT
from forja.paths import forja_home
from forja.sweep import SweepSpec
from forja.ui.server import Dashboard, make_app
from forja_sandbox.service import PROJECT
from forja_sandbox.storage_emulator import StorageEmulator

#: 30 steps, a metric line every 5 (what the pruner compares), $1 a second (what the budget counts).
TINY = {"model": "trainer.demo:digits_cnn", "data": "trainer.demo:digits", "steps": 30, "batch_size": 32,
        "lr": 0.002, "log_every_steps": 5, "checkpoint_every_s": 0, "render_plots": False,
        "price_per_hour": 3600, "num_workers": 0, "device": "cpu", "precision": "fp32"}
SPACE = {"params": {"lr": {"type": "float", "low": 1e-7, "high": 0.05, "log": True}}}
BUCKET = "forja-sweeps-test"


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    config, space = tmp_path / "tiny.yaml", tmp_path / "space.yaml"
    config.write_text(yaml.safe_dump(TINY))
    space.write_text(yaml.safe_dump(SPACE))
    return config, space


@pytest.fixture
def bucketed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Forja, storage.Bucket]]:
    """A session whose inventory names a bucket of a storage emulator, as the sandbox's does."""
    with StorageEmulator(data_dir=tmp_path / "gcs") as emulator:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
        client = storage.Client(project=PROJECT, credentials=AnonymousCredentials())
        bucket = client.create_bucket(BUCKET)
        inventory = tmp_path / "hosts.ini"
        inventory.write_text(f"[forja_gpu]\nlocalhost ansible_connection=local gcp_bucket_name={BUCKET}\n")
        yield Forja(project_dir=tmp_path, inventory=str(inventory)), bucket


def test_a_sweep_prunes_the_trial_that_lags_tells_the_rest_and_marks_the_best(
    files: tuple[Path, Path],
) -> None:
    config, space = files
    api = Forja(project_dir=config.parent)
    said: list[str] = []
    report = api.sweep(config, space=space, trials=3, name="prune", local=True, poll_s=0.3, say=said.append,
                       first=[{"lr": 0.02}, {"lr": 0.01}, {"lr": 1e-7}])

    states = {row.run: row.state for row in report.trials}
    assert states == {"prune-t000": "complete", "prune-t001": "complete", "prune-t002": "pruned"}, said
    assert report.best_runs and report.best_runs[0] in ("prune-t000", "prune-t001")
    best = json.loads((Path(report.folder) / "best.json").read_text())
    assert Path(best[0]["model"], "model.json").is_file()  # the best trial's exported model
    assert {Path(p).name for p in report.plots} == {"history.png", "importances.png", "parallel.png"}
    runs = {r.run_id: r for r in api.runs()}
    for row in report.trials:  # each trial costs what its run costs in `forja runs`, settled once at its end
        record = runs[row.run]
        span = (datetime.fromisoformat(record.ended_at or "") - datetime.fromisoformat(record.started_at))
        assert row.cost_usd == record.cost_usd == pytest.approx(span.total_seconds()), row  # $1 a second
        assert row.training_usd is not None and row.training_usd != row.cost_usd, "the trainer's own count"
        assert [e.kind for e in api.history.events(row.run)].count(SETTLED_EVENT) == 1
    assert runs["prune-t000"].status == "completed" and runs["prune-t002"].status == "stopped"
    assert [r.state for r in api.sweep_status("prune")[0].trials] == ["complete", "complete", "pruned"]

    board = Dashboard(api, ["http://127.0.0.1:1/"])  # `forja ui` lists the sweep, the best marked
    with TestClient(make_app(board, "t", collect=False), base_url="http://127.0.0.1") as client:
        assert client.get("/api/sweeps").status_code == 403
        shown = client.get("/api/sweeps", headers={"Authorization": "token t"}).json()["sweeps"]
    trials = next(s["shown"] for s in shown if s["name"] == "prune")
    assert [t["best"] for t in trials if t["run"] in report.best_runs] == ["best"]


def preempt_once_checkpointed(folder: Path) -> threading.Thread:
    """What Spot does to a trial, from outside the sweep: a SIGTERM once the run has a checkpoint."""

    def preempt() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list((folder / "checkpoints").glob("ckpt-*.pt")):
            time.sleep(0.02)
        for child in psutil.Process().children(recursive=True):
            if str(folder) in " ".join(child.cmdline()):
                child.send_signal(signal.SIGTERM)

    thread = threading.Thread(target=preempt, daemon=True)
    thread.start()
    return thread


def test_a_preempted_trial_resumes_the_budget_stops_new_trials_and_the_bucket_resumes_the_sweep(
    files: tuple[Path, Path], bucketed: tuple[Forja, storage.Bucket]
) -> None:
    config, space = files
    config.write_text(yaml.safe_dump({**TINY, "steps": 80, "checkpoint_every_steps": 10}))
    api, bucket = bucketed
    folder = forja_home() / "sweeps" / "local-runs" / "budget-t000"
    preempted: list[threading.Thread] = []

    def say(line: str) -> None:
        if line.startswith("budget-t000: sent"):
            preempted.append(preempt_once_checkpointed(folder))

    report = api.sweep(config, space=space, trials=4, name="budget", local=True, poll_s=0.3, say=say,
                       max_usd=0.5)  # the first trial alone costs seconds at $1/s
    assert len(report.trials) == 1 and "--max-usd $0.50 reached" in (report.stopped or "")
    assert report.trials[0].state == "complete"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["resumed_from_step"] >= 10 and summary["steps"] == 80  # its checkpoint, not step 0
    assert [e.kind for e in api.history.events("budget-t000")].count("preempted") == 1
    assert bucket.blob("sweeps/budget/study.db").exists()

    with pytest.raises(errors.ConfigError, match="forja sweep resume budget"):
        api.sweep(config, space=space, trials=4, name="budget", local=True)
    shutil.rmtree(SweepSpec.folder_of("budget"))  # the laptop is gone; its bucket copy is not
    with pytest.raises(errors.ConfigError, match="already exists \\(in the bucket"):
        api.sweep(config, space=space, trials=4, name="budget", local=True)
    again = api.sweep_resume("budget", poll_s=0.3, say=print)
    assert [row.state for row in again.trials] == ["complete"] and "--max-usd" in (again.stopped or "")


@pytest.mark.slow  # ten trainer runs, two at a time: over a few seconds
def test_spot_drill_every_trial_is_accounted_for_the_preempted_resume_and_status_shows_the_front(
    files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's Spot drill, here: ten trials, two preempted mid-run (a SIGTERM once each has a
    checkpoint, as Spot's notice is on the VM), both resumed from their own checkpoint, losing at most
    one checkpoint interval; the study has a trial for each, told once. Two objectives (the loss and
    the cost), so the Pareto front is what `forja sweep status` marks best."""
    config, space = files
    every = 10
    config.write_text(yaml.safe_dump({**TINY, "checkpoint_every_steps": every}))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two trainers on two cores, not four threads
    objectives = [{"metric": m, "direction": "minimize"} for m in ("eval_loss", "cost_usd")]
    space.write_text(yaml.safe_dump({**SPACE, "objectives": objectives}))
    api = Forja(project_dir=config.parent)
    root = forja_home() / "sweeps" / "local-runs"
    struck = ("drill-t002", "drill-t006")
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        run = line.split(":")[0]
        if run in struck and line.startswith(f"{run}: sent"):
            preempt_once_checkpointed(root / run)

    report = api.sweep(config, space=space, trials=10, parallel=2, name="drill", local=True, poll_s=0.3,
                       say=say)

    assert [(row.number, row.run, row.state) for row in report.trials] == [
        (n, f"drill-t{n:03d}", "complete") for n in range(10)], said
    for run in struck:
        summary = json.loads((root / run / "summary.json").read_text())
        assert summary["steps"] == TINY["steps"] and summary["resumed_from_step"] >= every, summary
        assert summary["lost_steps"] <= every
        assert [e.kind for e in api.history.events(run)].count("preempted") == 1
    drill = {r.run_id: r.status for r in api.runs() if r.run_id.startswith("drill-")}
    assert drill == {row.run: "completed" for row in report.trials}

    values = {row.run: row.values for row in report.trials}
    front = {run for run, (loss, cost) in values.items()
             if not any(o[0] <= loss and o[1] <= cost and o != [loss, cost] for o in values.values())}
    assert set(report.best_runs) == front
    shown = CliRunner().invoke(app, ["sweep", "status", "drill"], env={"COLUMNS": "240"})
    assert shown.exit_code == 0, shown.output
    marked = {re.findall(r"drill-t\d+", line)[0] for line in shown.output.splitlines()
              if line.rstrip(" │").endswith("best")}
    assert marked == front, shown.output
