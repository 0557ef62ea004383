"""An in-memory TensorDataset read without workers skips the DataLoader (trainer.data.InMemoryBatches):
the batches must be the DataLoader's, sample for sample, from the start and from a resumed position.

Real parts: torch's own DataLoader over the same sampler, as the trainer builds it with workers.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.data import BatchPlan, InMemoryBatches, ResumableSampler, TensorBatches, keep_batch, make_loader


def test_in_memory_batches_are_the_data_loaders_batches_from_any_position() -> None:
    data = TensorDataset(torch.arange(100.0).view(50, 2), torch.arange(50))
    plan = BatchPlan(micro_batch=4, accum_steps=2, world_size=2)
    sampler = ResumableSampler(len(data), plan, rank=1, seed=7)
    fast, _ = make_loader(data, sampler, num_workers=0, pin_memory=False)
    assert isinstance(fast, InMemoryBatches)
    reference = DataLoader(TensorBatches(data), batch_size=4, sampler=sampler, collate_fn=keep_batch)
    for epoch, start in ((0, 0), (3, 2)):
        sampler.set_position(epoch, start)
        got, want = list(fast), list(reference)
        assert len(got) == len(want) == (sampler.steps_per_epoch - start) * 2
        pairs = [(a, b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True)]
        assert all(torch.equal(a, b) for a, b in pairs)
