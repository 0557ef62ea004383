"""The autostop agent's stall detector against real training runs on CPU (no unit, no VM).

The agent (roles/autostop/files/forja_autostop.py, a stdlib script) is loaded as it runs on a host;
only the list of active units is given here, since this machine runs no forja-train@ units. The
runs are real `python -m trainer` processes serving their metrics endpoint:
- one made to hang (its data source blocks once a file appears): the detector fires;
- one in an evaluation longer than the stall window, which reports progress per batch: it does not.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainer_helpers import subprocess_env, tiny_digits, until

from forja import live
from trainer import run_folder

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
AGENT = REPO / "roles/autostop/files/forja_autostop.py"
SPEC = importlib.util.spec_from_file_location("forja_autostop", AGENT)
agent = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(agent)
PATTERN = yaml.safe_load((REPO / "roles/host_contract/defaults/main.yml").read_text())[
    "host_contract_train_unit_pattern"
]
STALL_S = 2.0


def unit(run: str) -> str:
    return PATTERN.replace("*", run)


def agent_config(runs: Path, **over: Any) -> dict[str, Any]:
    return {**agent.DEFAULTS, "jupyter_url": "http://127.0.0.1:1", "jupyter_token_file": "/nonexistent",
            "train_unit_pattern": PATTERN, "run_dir": str(runs), "state_dir": str(runs.parent / "autostop"),
            "stall_after_s": STALL_S, **over}  # fmt: skip


@contextmanager
def serving_run(tmp: Path, run: str, **overrides: Any) -> Iterator[str]:
    """A training run named `run` under tmp/runs, serving its metrics; yields its endpoint's URL."""
    out = tmp / "runs" / run
    raw = tiny_digits(tmp, out_dir=str(out), steps=10**7, log_every_steps=10, **overrides)
    config = tmp / f"{run}.yaml"
    config.write_text(json.dumps(raw))
    env = subprocess_env(FORJA_RUN=run, FORJA_METRICS_PORT="0", FORJA_METRICS_PORTS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])  # live_fakes, for the data path
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "train", "--config", str(config)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        until(lambda: (out / run_folder.LIVE).is_file() or proc.poll() is not None, 120, f"{run}'s live.json")
        assert proc.poll() is None, f"{run} exited with {proc.returncode}"
        url = live.live_url(json.loads((out / run_folder.LIVE).read_text())["port"])
        until(lambda: (live.scrape(url).step or 0) > 0, 60, f"{run}'s first step")
        yield url
    finally:
        proc.kill()
        proc.wait()


def check(config: dict[str, Any], run: str) -> list[dict[str, Any]]:
    """One pass of the agent over the active unit of `run` (as each timer run does)."""
    return agent.handle_stalls(config, [unit(run)], time.time())


def test_a_run_made_to_hang_is_found_stalled(tmp_path: Path, capsys) -> None:
    hang = tmp_path / "hang"
    data = {"data": "live_fakes:hanging_digits", "data_args": {"hang": str(hang)}}
    with serving_run(tmp_path, "hung", **data) as url:
        config = agent_config(tmp_path / "runs", stall_action="warn")
        assert check(config, "hung") == []
        hang.touch()
        before = until(lambda: _stopped_at(url), 30, "the steps to stop")
        time.sleep(STALL_S + 0.5)
        [record] = check(config, "hung")
        assert live.scrape(url).step == before, "the run hangs: no step since"
    assert record["decision"] == "stall" and record["action"] == "warn" and record["run"] == "hung"
    assert record["unit"] == unit("hung") and record["progress_age_s"] >= STALL_S
    assert "run hung: no progress for" in record["reasons"][0]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == record  # the journal's line


def _stopped_at(url: str) -> float | None:
    first = live.scrape(url).step
    time.sleep(0.3)
    return first if live.scrape(url).step == first else None


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_a_hung_run_whose_endpoint_went_silent_is_judged_on_its_last_progress(tmp_path: Path) -> None:
    """A hang that holds Python's lock silences the server thread too (here: the process is frozen
    with SIGSTOP, its socket still accepting): the last progress the agent saw counts."""
    with serving_run(tmp_path, "frozen") as url:
        config = agent_config(tmp_path / "runs", stall_action="stop", dry_run=True)
        assert check(config, "frozen") == []  # seen once, making progress
        pid = json.loads((tmp_path / "runs" / "frozen" / run_folder.LIVE).read_text())["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(live.LiveError):
                live.scrape(url, timeout=1)
            time.sleep(STALL_S)
            [record] = check(config, "frozen")
        finally:
            os.kill(pid, signal.SIGCONT)
    assert record["action"] == "would-stop" and "endpoint silent" in record["reasons"][0]


def test_a_long_evaluation_that_reports_progress_is_not_a_stall(tmp_path: Path) -> None:
    # 360 held-out digits x 4 at 5 ms a read: an evaluation of about 7 s, over three stall windows
    overrides = {"data": "live_fakes:slow_eval_digits", "data_args": {"times": 4, "delay_s": 0.005},
                 "eval_every_steps": 20, "eval_batch_size": 16}  # fmt: skip
    with serving_run(tmp_path, "evals", **overrides) as url:
        config = agent_config(tmp_path / "runs", stall_action="stop")  # a false stall would call systemctl
        evaluating = until(lambda: (s := live.scrape(url)).phase == "eval" and s, 60, "the evaluation")
        started = time.monotonic()
        while time.monotonic() - started < STALL_S * 1.5:
            assert check(config, "evals") == []
            time.sleep(0.5)
        now = live.scrape(url)
    assert now.phase == "eval" and now.step == evaluating.step, "still evaluating: no training step since"
    assert (now.last_progress_timestamp or 0) > (evaluating.last_progress_timestamp or 0)
