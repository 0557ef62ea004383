"""The real command line: a demo that learns, SIGTERM -> clean save and exit 3, report's pictures."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_helpers import subprocess_env

from trainer import run_folder
from trainer.cli import main
from trainer.metrics import METRIC_FIELDS, read_jsonl
from trainer.summary import FIELDS


def test_digits_demo_reaches_95_percent_in_300_steps(tmp_path: Path) -> None:
    """The built-in digits config, as shipped: >= 95% held-out accuracy after its 300 steps."""
    run = tmp_path / "digits"
    code = main(
        [
            "train",
            "--config",
            "digits",
            "--out",
            str(run),
            "--set",
            "price_per_hour=0.9",
            "--set",
            f"cache_dir={tmp_path}",
        ]
    )
    assert code == 0
    summary = json.loads((run / run_folder.SUMMARY).read_text())
    assert set(summary) == set(FIELDS)
    assert summary["status"] == "completed" and summary["steps"] == 300
    assert summary["accuracy"] >= 0.95, summary
    assert summary["cost_usd"] == pytest.approx(summary["wall_s"] / 3600 * 0.9, rel=1e-6)
    rows = list(read_jsonl(run / run_folder.METRICS))
    assert [r["step"] for r in rows] == list(range(20, 301, 20))
    assert all(set(METRIC_FIELDS) <= r.keys() for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"] / 5
    for name in ("loss.png", "throughput.png", "utilisation.png", "cost.png"):
        png = (run / run_folder.PLOTS_DIR / name).read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000, name
    resolved = (run / run_folder.CONFIG).read_text()
    assert "batch_size: 32" in resolved and "device: cpu" in resolved and "precision: auto" not in resolved


def test_report_renders_a_run_folder_and_refreshes_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "r"
    run.mkdir()
    lines = [
        {
            "step": s,
            "loss": 2.0 / s,
            "lr": 1e-3,
            "samples_per_s": 100.0 + s,
            "step_time_s": 0.1,
            "data_wait_s": 0.01,
            "gpu_mem_gb": None,
            "gpu_util": None,
            "cpu_util": 50.0,
            "cost_usd": s * 1e-4,
            "wall_s": s * 0.1,
            "time": 0.0,
        }
        for s in range(1, 41)
    ]
    (run / run_folder.METRICS).write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 41, "lo')
    (run / run_folder.EVENTS).write_text(json.dumps({"event": "resume", "step": 20}) + "\n")
    assert main(["report", "--run", str(run)]) == 0
    summary = json.loads((run / run_folder.SUMMARY).read_text())
    assert summary["steps"] == 40 and summary["median_samples_per_s"] == pytest.approx(120.5)
    assert sorted(p.name for p in (run / run_folder.PLOTS_DIR).iterdir()) == [
        "cost.png",
        "loss.png",
        "throughput.png",
        "utilisation.png",
    ]
    assert main(["report", "--run", str(tmp_path / "missing")]) == 2  # the user's to fix, no traceback


GOOD_LINE = {"step": 1, "loss": 0.5, "samples_per_s": 100.0, "step_time_s": 0.1, "data_wait_s": 0.01}


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ({run_folder.METRICS: {"loss": 0.5}}, "line 2: no 'step'"),
        ({run_folder.METRICS: {"step": "two", "loss": 0.5}}, "line 2: 'step' must be a whole number"),
        ({run_folder.METRICS: {"step": 2, "loss": "low"}},
         "line 2: 'loss' must be a number or null, got 'low'"),
        ({run_folder.EVENTS: {"event": "resume", "step": "x"}}, "line 1: a resume's 'step' must be"),
        ({run_folder.SUMMARY: "{not json"}, "summary.json is not a JSON summary"),
        ({run_folder.SUMMARY: "[1, 2]"}, "summary.json must hold a JSON object, got list"),
    ],
    ids=["no step", "step as words", "loss as words", "resume step as words", "summary not JSON",
         "summary a list"],
)
def test_report_names_the_file_and_line_it_cannot_read_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, object], said: str
) -> None:
    """A metrics line another tool (or a hand) wrote: one line naming it, exit 2, not a traceback."""
    run = tmp_path / "r"
    run.mkdir()
    (run / run_folder.METRICS).write_text(json.dumps(GOOD_LINE) + "\n")
    for name, content in files.items():
        text = content if isinstance(content, str) else json.dumps(content) + "\n"
        mode = "a" if name == run_folder.METRICS else "w"
        with open(run / name, mode) as handle:
            handle.write(text)
    assert main(["report", "--run", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --run {run}: {run / next(iter(files))}") and said in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_report_on_a_file_says_it_is_not_a_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / run_folder.METRICS  # the run's file given instead of its folder
    metrics.write_text(json.dumps(GOOD_LINE) + "\n")
    assert main(["report", "--run", str(metrics)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --run {metrics}: {metrics} is a file, not a run folder (the trainer's out_dir)"


@pytest.mark.slow
def test_sigterm_saves_at_the_next_step_and_exits_3_then_resumes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    base = [
        sys.executable,
        "-m",
        "trainer",
        "train",
        "--config",
        "digits",
        "--out",
        str(run),
        "--set",
        "model_args={width: 8, hidden: 32}",
        "--set",
        "log_every_steps=1",
        "--set",
        "checkpoint_every_s=0",
        "--set",
        "lr_schedule.warmup_steps=0",
        "--set",
        f"cache_dir={tmp_path}",
    ]
    proc = subprocess.Popen(
        [*base, "--set", "steps=100000"],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while len(list(read_jsonl(run / run_folder.METRICS))) < 5:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.1)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert proc.returncode == 3, out
    assert took < 25, f"stopping took {took:.1f}s: a Spot VM gives 30s"
    summary = json.loads((run / run_folder.SUMMARY).read_text())
    stopped = summary["steps"]
    assert summary["status"] == "preempted" and summary["last_checkpoint"] == f"ckpt-{stopped}.pt"
    preempt = [e for e in read_jsonl(run / run_folder.EVENTS) if e["event"] == "preempt"]
    assert preempt and preempt[0]["signal"] == "SIGTERM" and preempt[0]["saved_step"] == stopped

    resumed = subprocess.run(
        [*base, "--set", f"steps={stopped + 5}"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((run / run_folder.SUMMARY).read_text())
    assert (summary["status"], summary["steps"], summary["resumed_from_step"]) == (
        "completed",
        stopped + 5,
        stopped,
    )
    assert summary["preemptions"] == 1 and summary["lost_steps"] == 0


def test_a_failing_run_exits_1_and_says_so_in_its_summary(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["train", "--config", "digits", "--out", str(run), "--set", "loss=trainer_fakes:broken_loss",
            "--set", f"cache_dir={tmp_path}", "--set", "render_plots=false"]  # fmt: skip
    assert main(args) == 1
    summary = json.loads((run / run_folder.SUMMARY).read_text())
    assert summary["status"] == "failed" and "shape mismatch in the loss" in summary["error"]
    assert [e["event"] for e in read_jsonl(run / run_folder.EVENTS)] == ["start", "fail"]
