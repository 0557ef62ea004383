"""forja-train-launch running a user's command under torchrun, as systemd runs it (no test host needed).

The real launcher (roles/trainer_run/files/forja-train-launch) with the environment the role's env
file gives it, this machine's Python as the run's Python and two gloo processes: the run contract
each process sees, the exit status of the first failing worker (torchrun alone would say 1), and
the stop grace after which a process that ignores SIGTERM is killed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from trainer_helpers import launcher_env

from trainer import exit_codes, run_folder

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "roles" / "trainer_run" / "files" / "forja-train-launch"
pytestmark = pytest.mark.skipif(
    shutil.which("flock") is None or shutil.which("ps") is None, reason="the launcher needs flock and ps"
)


def launcher(tmp_path: Path, command: list[str], nproc: int, grace: int = 20) -> subprocess.Popen[str]:
    """Start the launcher for a run spec holding ``command`` (stdout and stderr together)."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    env = launcher_env(tmp_path, "own", {"command": command, "mine": 1}, project, nproc=nproc, grace=grace,
                       FORJA_PRICE_PER_HOUR="0.5")
    return subprocess.Popen(
        ["bash", str(LAUNCHER)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


DUMP = """
import json, os, shutil, sys
keys = [k for k in os.environ if k.startswith("FORJA_")] + ["RANK", "LOCAL_RANK", "WORLD_SIZE"]
seen = {k: os.environ.get(k) for k in keys}
seen["cwd"], seen["python"] = os.getcwd(), shutil.which("python")
with open(os.path.join(os.environ["FORJA_RUN_DIR"], "rank-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(seen, f)
"""


def test_every_process_gets_the_run_contract_in_its_environment(tmp_path: Path) -> None:
    proc = launcher(tmp_path, ["python", "-c", DUMP], nproc=2)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert (tmp_path / "out" / run_folder.COMPLETED_MARKER).exists()
    ranks = [json.loads((tmp_path / "out" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for rank, seen in enumerate(ranks):
        assert (seen["RANK"], seen["LOCAL_RANK"], seen["WORLD_SIZE"]) == (str(rank), str(rank), "2")
        assert seen["FORJA_RUN_DIR"] == str(tmp_path / "out")
        assert seen["FORJA_CHECKPOINT_DIR"] == str(tmp_path / "out" / run_folder.CHECKPOINTS_DIR)
        assert seen["FORJA_RESUME_FROM"] == ""  # no checkpoint yet
        assert (seen["FORJA_WORLD_SIZE"], seen["FORJA_NPROC_PER_NODE"], seen["FORJA_NNODES"]) == (
            "2",
            "2",
            "1",
        )
        assert seen["FORJA_PRICE_PER_HOUR"] == "0.5" and seen["FORJA_CONFIG"] == str(tmp_path / "run.yaml")
        assert seen["cwd"] == str(tmp_path / "project")
        assert Path(seen["python"]).parent == Path(sys.executable).parent  # `python` is the run's Python


def test_the_first_failing_workers_exit_code_is_the_runs(tmp_path: Path) -> None:
    # rank 1 fails at once with "user error" (4); torchrun then stops rank 0 and itself says 1
    fail = "import os, sys, time; time.sleep(60 if os.environ['RANK'] == '0' else 0); sys.exit(4)"
    proc = launcher(tmp_path, ["python", "-c", fail], nproc=2)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == exit_codes.USER_ERROR, out
    assert exit_codes.USER_ERROR in exit_codes.NO_RESTART  # so the unit does not retry it
    assert not (tmp_path / "out" / run_folder.COMPLETED_MARKER).exists()


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    stubborn = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "open(os.path.join(os.environ['FORJA_RUN_DIR'], 'pid'), 'w').write(str(os.getpid())); time.sleep(600)"
    )
    proc = launcher(tmp_path, ["python", "-c", stubborn], nproc=1, grace=2)
    pid_file = tmp_path / "out" / "pid"
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    worker = psutil.Process(int(pid_file.read_text()))
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)  # what systemd sends the launcher (KillMode=mixed)
    out, _ = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert "still running 2 s after SIGTERM; killing" in out
    assert 2.0 <= took < 15.0, out
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
    assert proc.returncode != 0 and not (tmp_path / "out" / run_folder.COMPLETED_MARKER).exists()
