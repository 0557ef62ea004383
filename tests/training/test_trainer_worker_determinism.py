"""Bit-exact resume with DataLoader workers and random augmentation (the drill: 4.5e-3 apart before)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import torch
from trainer_helpers import tiny_digits

from trainer import run_folder
from trainer.checkpoint import CheckpointManager
from trainer.config import validate
from trainer.train import train


def losses(run: Path) -> list[tuple[int, float]]:
    lines = (run / run_folder.METRICS).read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


def weights(run: Path) -> dict[str, torch.Tensor]:
    found = CheckpointManager(run / run_folder.CHECKPOINTS_DIR).load_latest()
    assert found is not None
    return found.state["model"]


def test_resume_with_two_workers_and_random_augmentation_is_bit_exact(tmp_path: Path) -> None:
    # 1438 samples / 32 = 44 steps per epoch; stopped at step 30 (mid-epoch, mid-way through a worker's
    # share), resumed past the epoch end
    raw = tiny_digits(
        tmp_path, steps=60, batch_size=32, num_workers=2, data="robustness_fakes:augmented_digits"
    )
    straight = train(validate({**raw, "out_dir": str(tmp_path / "straight")}))
    assert straight.status == "completed"

    config = validate({**raw, "out_dir": str(tmp_path / "resumed")})

    def stop_after_29(step: int) -> None:
        if step == 29:
            os.kill(os.getpid(), signal.SIGTERM)

    first = train(config, on_step=stop_after_29)
    assert (first.status, first.summary["steps"]) == ("preempted", 30)
    second = train(config)
    assert second.status == "completed" and second.summary["resumed_from_step"] == 30

    assert losses(tmp_path / "resumed") == losses(tmp_path / "straight")
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    print(f"max weight difference after resume with 2 workers: {worst:.3g}")
    assert worst == 0.0


def test_the_augmentation_is_random_across_epochs_and_samples(tmp_path: Path) -> None:
    """Seeding per batch must not freeze the augmentation: two epochs of the same data differ."""
    from robustness_fakes import augmented_digits
    from torch.utils.data import get_worker_info

    from trainer.seeding import WorkerSeeded

    seen: dict[int, list[torch.Tensor]] = {}

    class Probe(WorkerSeeded):
        def __getitems__(self, indices):  # record what worker-seeded fetches return, per epoch
            assert get_worker_info() is None
            import trainer.seeding as seeding

            seeding.seed_this_worker(seeding.batch_seed(self.seed, self.epoch, int(indices[0])))
            return [self.dataset[i] for i in indices]

    train_set, _ = augmented_digits()
    probe = Probe(train_set, seed=1)
    for epoch in (0, 1):
        probe.epoch = epoch
        seen[epoch] = [x for x, _ in probe.__getitems__([5, 6])]
    assert not torch.equal(seen[0][0], seen[1][0]), "the same sample got the same augmentation every epoch"
    assert not torch.equal(seen[0][0] - train_set.base[5][0], seen[0][1] - train_set.base[6][0])
