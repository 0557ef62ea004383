"""Runs longer than any fixed limit, on a real test host (th6): follow, detach, Ctrl-C, --timeout, logs -f.

The clock is a test parameter, not a long sleep: the run is the digits demo with a model that
sleeps in every forward pass (a project module sent with the run), so it lasts 10-20 s, and the
only fixed clock forja has, the follow window (FORJA_FOLLOW_WINDOW_S), is set to 2 s. A run
followed to its end through several windows is one that the old fixed wait limit would have
reported failed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from apihosts import REPO, host_vars, ssh, write_inventory

from forja import events as ev
from forja.api import Forja
from forja.cost_report import SETTLED_EVENT
from forja.errors import ExitCode
from forja.history import History
from forja_sandbox import testhosts
from trainer import run_folder

pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.timeout(2400)]
FORJA = str(Path(sys.executable).parent / "forja")
#: The follow window in these tests: far shorter than every run below.
WINDOW_S = 2
SLOW_MODEL = '''"""The digits CNN, slowed down: a run that lasts as long as a test needs, with no big data."""
import time

from torch import nn

from trainer.demo import digits_cnn


class Slow(nn.Module):
    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.inner = digits_cnn()
        self.delay_s = delay_s

    def forward(self, x):
        time.sleep(self.delay_s)
        return self.inner(x)


def slow_cnn(delay_s: float = 0.2) -> nn.Module:
    return Slow(delay_s)
'''


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("long")


@pytest.fixture(scope="module")
def project(workspace: Path) -> Path:
    folder = workspace / "project"
    folder.mkdir()
    (folder / "slowmodel.py").write_text(SLOW_MODEL)
    return folder


def slow_config(folder: Path, name: str, steps: int, delay_s: float = 0.25) -> Path:
    """The digits config with the slowed model: about steps x delay_s seconds of training."""
    config = yaml.safe_load((REPO / "trainer/configs/digits.yaml").read_text())
    config.update(model="slowmodel:slow_cnn", model_args={"delay_s": delay_s}, steps=steps, log_every_steps=5)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def inventory(th6: testhosts.Host, workspace: Path) -> Path:
    return write_inventory(workspace / "inventory.yml", {"th6": host_vars(th6)})


@pytest.fixture(scope="module")
def home(workspace: Path) -> Path:
    """FORJA_HOME of the CLI processes (and of ansible-playbook's history record)."""
    return workspace / "home"


@pytest.fixture(scope="module")
def api(inventory: Path, project: Path, workspace: Path, home: Path) -> Forja:
    return Forja(project_dir=project, inventory=inventory, private_data_dir=workspace / "runner",
                 host_key_checking=False, history=History(home / "history.sqlite"),
                 follow_window_s=WINDOW_S)


def cli(home: Path, inventory: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FORJA_HOME": str(home), "FORJA_FOLLOW_WINDOW_S": str(WINDOW_S)}
    return subprocess.run([FORJA, "-i", str(inventory), "--no-host-key-checking", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, check=False)


def unit_state(host: testhosts.Host, run: str) -> str:
    return ssh(host, f"systemctl is-active forja-train@{run}.service || true").strip()


def wait_for_steps(
    host: testhosts.Host, run: str, command: subprocess.Popen[str], deadline_s: float = 300
) -> None:
    """Until the run has written a metrics line (it trains), read on the host itself. A `command`
    that ends first, or a run that never trains, fails with what the command and the unit said."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if ssh(host, f"sudo cat /var/lib/forja/runs/{run}/{run_folder.METRICS} 2>/dev/null || true").strip():
            return
        if command.poll() is not None:
            break
        time.sleep(1)
    if command.poll() is None:
        command.kill()
    stdout, stderr = command.communicate(timeout=60)
    unit = ssh(host, f"systemctl status --no-pager forja-train@{run}.service 2>&1; "
                     f"sudo journalctl --no-pager -n 40 -u forja-train@{run}.service 2>&1 || true")
    raise AssertionError(f"run {run} wrote no metrics (command exit {command.returncode}, "
                         f"{deadline_s - max(0.0, end - time.monotonic()):.0f} s)\n"
                         f"stdout: {stdout[-2000:]}\nstderr: {stderr[-3000:]}\nunit: {unit[-3000:]}")


def test_following_outlives_every_window_until_the_run_completes(api: Forja, project: Path) -> None:
    seen: list[ev.Event] = []
    config = slow_config(project, "long-follow", steps=60)
    config.write_text(config.read_text() + "price_per_hour: 0.9\n")  # a rate known: its end is priced
    result = api.train(config, name="long-follow", poll_s=1, on_event=seen.append)
    windows = [e for e in seen
               if isinstance(e, ev.PlaybookFinished) and e.playbook.endswith("train_wait.yml")]
    steps = [e.step for e in seen if isinstance(e, ev.TrainProgress)]
    assert result.status == "completed" and result.detached is None
    assert len(windows) >= 3, f"followed through {len(windows)} windows of {WINDOW_S} s"
    assert steps and steps == sorted(steps) and steps[-1] == 60
    assert result.summary["steps"] == 60 and result.artifact_dir is not None
    record = api.history.get("long-follow")
    assert (record.status, record.steps, record.hosts) == ("completed", 60, ["th6"])
    assert record.ended_at and record.artifact_dir
    # its cost settled once, where its results were fetched, and named as every view names it
    settled = [e for e in api.history.events("long-follow") if e.kind == SETTLED_EVENT]
    assert len(settled) == 1 and result.cost_usd == record.cost_usd == settled[0].data["cost_usd"]
    assert 0 < (result.training_usd or 0) < result.cost_usd and "cost_usd" not in result.summary


def test_detach_returns_at_once_with_the_run_id_and_logs_f_follows_to_the_end(
    th6: testhosts.Host, api: Forja, project: Path, inventory: Path, home: Path
) -> None:
    config = slow_config(project, "long-detach", steps=40)
    proc = cli(home, inventory, "--json", "train", str(config), "--project", str(project),
               "--name", "long-detach", "--detach")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["run_id"] == "long-detach"
    assert json.loads(proc.stdout)["detached"] == "detach"
    assert "forja stop long-detach" in proc.stderr
    assert unit_state(th6, "long-detach") in ("active", "activating"), "the command did not wait for the run"
    assert api.history.get("long-detach").status == "running"

    logs = cli(home, inventory, "logs", "-f", "long-detach", "-n", "5")
    assert logs.returncode == 0, logs.stderr
    assert "forja: starting run long-detach" in logs.stdout or "step" in logs.stdout
    assert "forja: run long-detach completed" in logs.stdout, logs.stdout[-500:]
    lines = [line for line in logs.stdout.splitlines() if line.strip()]
    assert len(lines) == len(set(lines)), "each journal line is printed once"
    assert api.history.get("long-detach").status == "completed", "logs -f recorded how the run ended"


def test_ctrl_c_detaches_and_the_run_goes_on_to_complete(
    th6: testhosts.Host, api: Forja, project: Path, inventory: Path, home: Path
) -> None:
    config = slow_config(project, "long-ctrl-c", steps=120)  # ~30 s: Ctrl-C twice while it trains
    env = {**os.environ, "FORJA_HOME": str(home), "FORJA_FOLLOW_WINDOW_S": str(WINDOW_S)}
    proc = subprocess.Popen(
        [FORJA, "-i", str(inventory), "--no-host-key-checking", "train", str(config),
         "--project", str(project), "--name", "long-ctrl-c"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        wait_for_steps(th6, "long-ctrl-c", proc)
        time.sleep(WINDOW_S + 1)  # following, past at least one window
        assert proc.poll() is None, proc.communicate()
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.STILL_RUNNING, stderr
    assert time.monotonic() - interrupted < 30
    assert "goes on" in stderr and "forja stop long-ctrl-c" in stderr and "forja follow long-ctrl-c" in stderr
    assert stdout.strip().endswith("long-ctrl-c")
    assert unit_state(th6, "long-ctrl-c") in ("active", "activating"), "Ctrl-C did not stop the run"
    assert api.history.get("long-ctrl-c").status == "running"

    logs = subprocess.Popen(
        [FORJA, "-i", str(inventory), "--no-host-key-checking", "logs", "-f", "long-ctrl-c"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        time.sleep(5)
        logs.send_signal(signal.SIGINT)
        _, logs_err = logs.communicate(timeout=60)
    finally:
        logs.kill()
    assert logs.returncode == 0 and "run long-ctrl-c goes on" in logs_err, logs_err
    assert unit_state(th6, "long-ctrl-c") in ("active", "activating"), "Ctrl-C on logs -f left the run alone"

    result = api.follow("long-ctrl-c", poll_s=1)
    assert result.status == "completed" and result.summary["steps"] == 120
    record = api.history.get("long-ctrl-c")
    assert (record.status, record.steps) == ("completed", 120)
    detached = [e.data["reason"] for e in api.history.events("long-ctrl-c") if e.kind == "detached"]
    assert detached == ["interrupted"]


def test_an_expired_timeout_says_the_run_goes_on_and_is_not_a_failure(
    th6: testhosts.Host, api: Forja, project: Path, inventory: Path, home: Path
) -> None:
    config = slow_config(project, "long-timeout", steps=40)
    proc = cli(home, inventory, "--json", "train", str(config), "--project", str(project),
               "--name", "long-timeout", "--timeout", "3")
    assert proc.returncode == ExitCode.STILL_RUNNING, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["status"], out["detached"]) == ("running", "timeout")
    assert "still running after the 3 s --timeout" in proc.stderr and "goes on" in proc.stderr
    assert api.history.get("long-timeout").status == "running"

    # The role's own knob is the same limit, no longer overridden by forja's default.
    limited = Forja(project_dir=project, inventory=inventory, private_data_dir=api.private_data_dir,
                    host_key_checking=False, history=api.history, follow_window_s=WINDOW_S,
                    extravars={"trainer_run_wait_timeout_s": 2})
    assert limited.follow("long-timeout", poll_s=1).detached == "timeout"
    assert api.history.get("long-timeout").status == "running"
    assert api.follow("long-timeout", poll_s=1).status == "completed"
    assert api.history.get("long-timeout").status == "completed"


def test_a_run_started_by_ansible_playbook_appears_in_forja_runs(
    th6: testhosts.Host, project: Path, inventory: Path, home: Path, workspace: Path
) -> None:
    config = slow_config(project, "long-site", steps=30)
    env = {**os.environ, "FORJA_HOME": str(home), "ANSIBLE_HOST_KEY_CHECKING": "False"}
    play = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "playbooks/train.yml",
         "-e", f"trainer_run_config={config}", "-e", f"trainer_run_project_dir={project}",
         "-e", "trainer_run_poll_s=1", "-e", f"trainer_run_fetch_dir={workspace / 'site-results'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    assert play.returncode == 0, play.stdout[-3000:]
    assert "still training" not in play.stdout, "the role's default wait has no limit"
    runs = cli(home, inventory, "--json", "runs")
    assert runs.returncode == 0, runs.stderr
    (row,) = [r for r in json.loads(runs.stdout) if r["run_id"] == "long-site"]
    assert (row["status"], row["steps"], row["hosts"]) == ("completed", 30, ["th6"])
    again = subprocess.run(play.args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
                           check=False)
    assert again.returncode == 0 and "Record the runs in forja's run history" in again.stdout
    assert len([r for r in History(home / "history.sqlite").list() if r.run_id == "long-site"]) == 1
