"""Checkpoints are atomic: a SIGKILL in the middle of a write never costs more than that one write."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import CheckpointManager, atomic_save, rng_state, set_rng_state

PAYLOAD = 2_000_000  # float32 values: an 8 MB checkpoint, long enough to be caught mid-write


def writer(folder: Path) -> None:
    """Child body: write checkpoints 1, 2, 3, ... forever, each filled with its own step number."""
    manager = CheckpointManager(folder, keep=2)
    step = 0
    while True:
        step += 1
        manager.save({"step": step, "model": {"w": torch.full((PAYLOAD,), float(step))}}, step)


def kill_mid_write(folder: Path, rng: random.Random) -> bool:
    """Fork a writer, SIGKILL it at a random moment of a write; True if a temporary was left behind."""
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            writer(folder)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    # wait until a later checkpoint is being written (a temporary exists), then kill at a random point
    while not any(".tmp." in p.name for p in folder.glob("*")) or len(list(folder.glob("ckpt-*.pt"))) < 1:
        assert time.monotonic() < deadline, "the writer never started"
        time.sleep(0.001)
    time.sleep(rng.uniform(0, 0.03))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return any(".tmp." in p.name for p in folder.glob("*"))


def test_sigkill_during_a_write_leaves_a_loadable_previous_checkpoint(tmp_path: Path) -> None:
    rng = random.Random(7)
    caught_mid_write = 0
    for trial in range(20):
        folder = tmp_path / f"t{trial}"
        folder.mkdir()
        caught_mid_write += kill_mid_write(folder, rng)
        manager = CheckpointManager(folder, keep=2)
        manager.remove_stale_temporaries()
        assert not any(".tmp." in p.name for p in folder.iterdir()), "stale temporary not removed"
        found = manager.load_latest(quarantine=False)
        assert found is not None, f"trial {trial}: no loadable checkpoint"
        assert found.skipped == [], f"trial {trial}: a complete-looking checkpoint was corrupt"
        step = found.state["step"]
        assert torch.equal(found.state["model"]["w"], torch.full((PAYLOAD,), float(step)))
    assert caught_mid_write >= 10, f"only {caught_mid_write}/20 kills hit a write: the test lost its point"


@pytest.mark.slow  # 7 s or more: the host tier's CPU lane, not make check
def test_a_corrupt_newest_checkpoint_is_set_aside_and_the_previous_one_used(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=3)
    for step in (10, 20, 30):
        manager.save({"step": step, "model": {"w": torch.tensor([float(step)])}}, step)
    data = manager.path_for(30).read_bytes()
    manager.path_for(30).write_bytes(data[: len(data) // 2])  # truncated, as by a full disk
    found = manager.load_latest()
    assert found is not None and found.state["step"] == 20
    assert [p.name for p in found.skipped] == ["ckpt-30.pt.corrupt"]
    assert [p.name for p in manager.list()] == ["ckpt-10.pt", "ckpt-20.pt"]


def test_only_the_newest_k_are_kept_ordered_by_step_not_name(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (5, 50, 100, 1000):
        manager.save({"step": step, "model": {}}, step)
    assert [p.name for p in manager.list()] == ["ckpt-100.pt", "ckpt-1000.pt"]


def test_checkpoints_load_with_weights_only_and_restore_every_rng(tmp_path: Path) -> None:
    import numpy as np

    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    atomic_save({"rng": rng_state()}, tmp_path / "x.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.random(), np.random.rand(), torch.rand(1)  # move every generator on
    set_rng_state(torch.load(tmp_path / "x.pt", weights_only=True)["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected
