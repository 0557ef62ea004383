"""examples/own-loop, a user's own train.py, under torchrun with two gloo processes on this machine.

The example is launched as forja's launcher launches it (torchrun, the FORJA_* contract in the
environment); SIGTERM goes to the torchrun agent, as the launcher forwards systemd's. The stopped
run must leave its own checkpoint, and the resumed run must end bit-identical to one that was
never interrupted (the example draws each batch from a generator seeded by step and rank).
Its dependency (tabulate, from requirements.txt) is installed into a folder of its own on the path.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from trainer_helpers import subprocess_env

from trainer import exit_codes, run_folder
from trainer.checkpoint import load_checkpoint
from trainer.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "own-loop"
pytestmark = pytest.mark.slow  # three torchrun launches of two processes each


@pytest.fixture(scope="module")
def requirements(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's requirements.txt installed by hand (pip --target), as its README says."""
    target = tmp_path_factory.mktemp("own-loop-deps")
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
         "-r", str(EXAMPLE / "requirements.txt")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr
    return target


def launch(run_dir: Path, deps: Path, *args: str) -> subprocess.Popen[str]:
    env = subprocess_env(
        FORJA_RUN=run_dir.name,
        FORJA_RUN_DIR=str(run_dir),
        FORJA_CHECKPOINT_DIR=str(run_dir / run_folder.CHECKPOINTS_DIR),
        FORJA_PRICE_PER_HOUR="0.5",
        FORJA_NNODES="1",
        FORJA_NODE_RANK="0",
        FORJA_NPROC_PER_NODE="2",
        FORJA_WORLD_SIZE="2",
    )
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{deps}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--max_restarts=0", "train.py", "--log-every", "5", "--save-every", "1000", *args]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=EXAMPLE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    summary = json.loads((run_dir / run_folder.SUMMARY).read_text())
    return load_checkpoint(run_dir / run_folder.CHECKPOINTS_DIR / summary["last_checkpoint"])["model"]


def test_the_example_stops_on_sigterm_resumes_from_its_checkpoint_and_matches_an_unbroken_run(
    tmp_path: Path, requirements: Path
) -> None:
    broken = tmp_path / "broken"
    proc = launch(broken, requirements, "--steps", "1000000")
    deadline = time.monotonic() + 180
    while sum(1 for _ in read_jsonl(broken / run_folder.METRICS)) < 3:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the example did not start training"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # to the torchrun agent, which forwards it to both ranks
    out, _ = proc.communicate(timeout=120)
    summary = json.loads((broken / run_folder.SUMMARY).read_text())
    stopped = summary["steps"]
    assert summary["status"] == "preempted", out
    assert summary["world_size"] == 2
    assert (broken / run_folder.CHECKPOINTS_DIR / f"ckpt-{stopped}.pt").is_file()

    total = stopped + 30
    resumed = launch(broken, requirements, "--steps", str(total))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == exit_codes.COMPLETED, out
    assert f"resumed from step {stopped}" in out
    assert "own-loop" in out  # the table printed with the project's own dependency
    summary = json.loads((broken / run_folder.SUMMARY).read_text())
    assert (summary["status"], summary["steps"], summary["resumed_from_step"]) == (
        "completed",
        total,
        stopped,
    )
    assert summary["preemptions"] == 1

    unbroken = tmp_path / "unbroken"
    once = launch(unbroken, requirements, "--steps", str(total))
    out, _ = once.communicate(timeout=300)
    assert once.returncode == exit_codes.COMPLETED, out
    a, b = final_model(broken), final_model(unbroken)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name  # bit-identical after a preemption
