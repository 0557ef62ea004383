"""forja-train-launch on two nodes of one machine: elastic torchrun with a c10d rendezvous (no test host).

Two launchers, as the trainer_run unit runs them on two cluster VMs, with the environment the role's
env file gives a multi-node run (node 0 hosts the rendezvous; each names itself to the other), train
the digits CNN with gloo. Mid-run node 1 is lost: every process of its run is SIGKILLed (what is left
of a lost Spot VM's run), then its launcher starts again, as systemd's Restart=on-failure does. Node
0's elastic agent must restart its worker group within the restart budget, both nodes meet again in
the rendezvous, and training resumes from the newest checkpoint with both nodes, then completes.
tests/sandbox/test_cluster_training.py does the same across two VMs of the sandbox through the role.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from trainer_helpers import subprocess_env

from forja import runstate
from trainer import run_folder

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "roles" / "trainer_run" / "files" / "forja-train-launch"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("flock") is None or shutil.which("ps") is None,
                       reason="the launcher needs flock and ps"),
]
#: Each node's name for the others (FORJA_NODE_ADDR): torch gives RANK 0 to the name that sorts first,
#: as the role's forja-<run>-node000 names do on VMs; here two names of this machine.
NAMES = ("127.0.0.1", "localhost")
MAX_RESTARTS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_node(tmp_path: Path, rank: int, port: int, config: Path, log_name: str) -> subprocess.Popen[str]:
    """One node's launcher, its output in ``log_name`` (a file: the run is long enough to fill a pipe)."""
    env = subprocess_env(
        FORJA_RUN="elastic",
        FORJA_OUT=str(tmp_path / f"node{rank}"),
        FORJA_CODE=str(REPO),
        FORJA_CONFIG=str(config),
        FORJA_PYTHON=sys.executable,
        FORJA_NNODES="2",
        FORJA_NODE_RANK=str(rank),
        FORJA_NPROC_PER_NODE="1",
        FORJA_STOP_GRACE_S="5",
        FORJA_MASTER_ADDR="127.0.0.1",
        FORJA_MASTER_PORT=str(port),
        FORJA_MAX_RESTARTS=str(MAX_RESTARTS),
        FORJA_RDZV_TIMEOUT_S="120",
        FORJA_NODE_ADDR=NAMES[rank],
    )
    log = (tmp_path / log_name).open("w")
    return subprocess.Popen(["bash", str(LAUNCHER)], env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def newest_step(out: Path) -> int:
    try:
        lines = (out / run_folder.METRICS).read_text().splitlines()
    except OSError:
        return 0
    steps = [json.loads(line).get("step", 0) for line in lines if line.startswith("{")]
    return max(steps, default=0)


def lose(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the launcher and everything below it (torchrun's workers lead sessions of their own)."""
    parent = psutil.Process(proc.pid)
    for process in [*parent.children(recursive=True), parent]:
        process.kill()
    proc.wait(timeout=30)


def test_a_lost_node_comes_back_and_training_resumes_from_the_checkpoint(tmp_path: Path) -> None:
    config = tmp_path / "digits.yaml"
    config.write_text(yaml.safe_dump({
        "model": "trainer.demo:digits_cnn", "model_args": {"width": 8, "hidden": 32},
        "data": "trainer.demo:digits", "steps": 2000, "batch_size": 16, "log_every_steps": 20,
        "checkpoint_every_steps": 100, "checkpoint_every_s": 0,
    }))
    port = free_port()
    node0 = start_node(tmp_path, 0, port, config, "node0.log")
    node1 = start_node(tmp_path, 1, port, config, "node1.log")
    try:
        deadline = time.monotonic() + 180
        while newest_step(tmp_path / "node0") < 350:  # past the checkpoint at step 300
            assert node0.poll() is None and node1.poll() is None, (tmp_path / "node0.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "node0.log").read_text()[-3000:]
            time.sleep(0.2)
        lose(node1)
        time.sleep(3)  # systemd's RestartSec, shortened
        node1 = start_node(tmp_path, 1, port, config, "node1-again.log")
        assert node0.wait(timeout=300) == 0, (tmp_path / "node0.log").read_text()[-4000:]
        assert node1.wait(timeout=60) == 0, (tmp_path / "node1-again.log").read_text()[-4000:]
    finally:
        for proc in (node0, node1):
            if proc.poll() is None:
                lose(proc)

    out0 = tmp_path / "node0"
    elastic = json.loads((out0 / run_folder.ELASTIC).read_text())
    assert 1 <= elastic["restart_count"] <= MAX_RESTARTS, elastic  # node 0's agent restarted its workers
    assert (elastic["rank"], elastic["world_size"], elastic["nodes"]) == (0, 2, 2)  # RANK 0 stayed on node 0
    events = [json.loads(line) for line in (out0 / run_folder.EVENTS).read_text().splitlines()]
    resumed = [e for e in events if e["event"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["resumed_from_step"] >= 300, resumed
    assert resumed[0]["world_size"] == 2
    summary = json.loads((out0 / run_folder.SUMMARY).read_text())
    assert (summary["status"], summary["steps"], summary["world_size"]) == ("completed", 2000, 2)
    assert summary["resumed_from_step"] == resumed[0]["resumed_from_step"]
    assert (out0 / run_folder.COMPLETED_MARKER).exists()
    assert (tmp_path / "node1" / run_folder.COMPLETED_MARKER).exists()
    # only RANK 0 wrote the run's files: node 1's folder has its own markers, no metrics
    assert not (tmp_path / "node1" / run_folder.METRICS).exists()
    assert json.loads((tmp_path / "node1" / run_folder.ELASTIC).read_text())["rank"] == 1
    # forja reads the round as forja-train-state reports it (its "elastic" key is this file)
    state = runstate.parse({runstate.SCHEMA_KEY: 1, "run": "elastic", "elastic": elastic})
    assert state is not None and state.elastic_restarts == elastic["restart_count"]
