"""Data order that can be resumed mid-epoch, bit for bit, under one process or many.

Why a custom sampler: the order of an epoch is a pure function of (seed, epoch), so a resumed run
only needs the epoch and the step inside it, never the state of an iterator. Each optimizer step
consumes one contiguous *global* block of the permutation, split between micro-batches and ranks,
so two processes at batch 16 see exactly the samples one process sees at batch 32.
The DataLoader gets its own generator, re-seeded per epoch: without one, creating an iterator draws
from the global torch RNG and a resumed run diverges at its first step.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset


def epoch_seed(seed: int, epoch: int) -> int:
    """A well-mixed 63-bit seed for (run seed, epoch)."""
    return int(
        np.random.SeedSequence([abs(seed), epoch, 1 if seed < 0 else 0]).generate_state(2, np.uint64)[0] >> 1
    )


@dataclass(frozen=True)
class BatchPlan:
    """How a global batch is made: micro-batch per process x accumulation steps x processes."""

    micro_batch: int
    accum_steps: int
    world_size: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accum_steps * self.world_size


def plan_batches(micro_batch: int, effective_batch: int | None, world_size: int) -> BatchPlan:
    """Exact integer accumulation reaching ``effective_batch``; ValueError naming the keys if impossible."""
    if effective_batch is None:
        return BatchPlan(micro_batch, 1, world_size)
    per_step = micro_batch * world_size
    if effective_batch % per_step:
        raise ValueError(
            f"effective_batch_size: {effective_batch} is not a multiple of batch_size {micro_batch} x "
            f"{world_size} processes (choose a multiple of {per_step}, or batch_size: auto)"
        )
    return BatchPlan(micro_batch, effective_batch // per_step, world_size)


def largest_divisor_plan(max_micro: int, effective_batch: int | None, world_size: int) -> BatchPlan:
    """The largest micro-batch <= ``max_micro`` that divides the effective batch exactly."""
    if effective_batch is None:
        return BatchPlan(max_micro, 1, world_size)
    if effective_batch % world_size:
        raise ValueError(
            f"effective_batch_size: {effective_batch} cannot be split over {world_size} processes "
            f"(use a multiple of {world_size})"
        )
    per_rank = effective_batch // world_size
    micro = max(b for b in range(1, min(max_micro, per_rank) + 1) if per_rank % b == 0)
    return BatchPlan(micro, per_rank // micro, world_size)


class ResumableSampler(Sampler[int]):
    """This rank's sample indices for the steps [start_step, steps_per_epoch) of one epoch."""

    def __init__(self, length: int, plan: BatchPlan, rank: int, seed: int) -> None:
        if length < plan.global_batch:
            raise ValueError(
                f"batch: the global batch {plan.global_batch} is larger than the {length} training samples "
                "(lower batch_size or effective_batch_size)"
            )
        self.length, self.plan, self.rank, self.seed = length, plan, rank, seed
        self.epoch, self.start_step = 0, 0

    @property
    def steps_per_epoch(self) -> int:
        return self.length // self.plan.global_batch

    def set_position(self, epoch: int, start_step: int) -> None:
        self.epoch, self.start_step = epoch, start_step

    def _permutation(self) -> torch.Tensor:
        gen = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        return torch.randperm(self.length, generator=gen)

    def __iter__(self) -> Iterator[int]:
        p, order = self.plan, self._permutation()
        for step in range(self.start_step, self.steps_per_epoch):
            block = order[step * p.global_batch : (step + 1) * p.global_batch]
            for micro in range(p.accum_steps):
                first = (micro * p.world_size + self.rank) * p.micro_batch
                yield from block[first : first + p.micro_batch].tolist()

    def __len__(self) -> int:
        return (self.steps_per_epoch - self.start_step) * self.plan.accum_steps * self.plan.micro_batch


class TensorBatches(Dataset):
    """A TensorDataset that hands out whole batches by fancy indexing (no per-sample collate)."""

    def __init__(self, dataset: TensorDataset) -> None:
        self.tensors = dataset.tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[index] for t in self.tensors)

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(indices)
        return tuple(t[index] for t in self.tensors)


def keep_batch(batch: Any) -> Any:
    """collate_fn for :class:`TensorBatches`: the batch is already stacked."""
    return batch


def choose_workers(requested: int | str, device: str) -> int:
    """auto: 0 on CPU (workers would steal the cores doing the math), else up to 4, leaving cores free."""
    if requested != "auto":
        return int(requested)
    if device == "cpu":
        return 0
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def make_loader(
    dataset: Dataset, sampler: ResumableSampler, num_workers: int, pin_memory: bool
) -> tuple[DataLoader, torch.Generator]:
    """A DataLoader over ``sampler`` with its own generator (re-seed it per epoch before ``iter``)."""
    generator = torch.Generator()
    batched = isinstance(dataset, TensorDataset)
    return (
        DataLoader(
            TensorBatches(dataset) if batched else dataset,
            batch_size=sampler.plan.micro_batch,
            sampler=sampler,
            num_workers=num_workers,
            pin_memory=pin_memory,
            generator=generator,
            collate_fn=keep_batch if batched else None,
            persistent_workers=False,
        ),
        generator,
    )


def epoch_iterator(
    loader: DataLoader, generator: torch.Generator, seed: int, epoch: int, start_step: int
) -> Iterator[Any]:
    """An iterator over the rest of ``epoch`` from ``start_step``; draws nothing from the global RNG."""
    sampler = loader.sampler
    assert isinstance(sampler, ResumableSampler)
    sampler.set_position(epoch, start_step)
    generator.manual_seed(epoch_seed(seed, epoch) ^ 0x5EED)
    return iter(loader)
