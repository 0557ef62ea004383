"""Data order that can be resumed mid-epoch, bit for bit, under one process or many.

Why a custom sampler: the order of an epoch is a pure function of (seed, epoch), so a resumed run
only needs the epoch and the step inside it, never the state of an iterator. Each optimizer step
consumes one contiguous *global* block of the permutation, split between micro-batches and ranks,
so two processes at batch 16 see exactly the samples one process sees at batch 32.
The DataLoader gets its own generator, re-seeded per epoch: without one, creating an iterator draws
from the global torch RNG and a resumed run diverges at its first step.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    Sampler,
    TensorDataset,
    default_collate,
    get_worker_info,
)


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

    def index_batches(self) -> Iterator[torch.Tensor]:
        """This rank's micro-batches of indices, as tensors (what ``__iter__`` yields one by one)."""
        p, order = self.plan, self._permutation()
        for step in range(self.start_step, self.steps_per_epoch):
            block = order[step * p.global_batch : (step + 1) * p.global_batch]
            for micro in range(p.accum_steps):
                first = (micro * p.world_size + self.rank) * p.micro_batch
                yield block[first : first + p.micro_batch]

    def __iter__(self) -> Iterator[int]:
        for index in self.index_batches():
            yield from index.tolist()

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


class InMemoryBatches:
    """The loader of an in-memory TensorDataset read by this process (no workers, no pinning): each
    micro-batch is one fancy index with the sampler's index tensor, as a hand-written loop does.

    Why not a DataLoader here: for a small model on a CPU its per-batch work (a profiler record, the
    batch sampler's per-sample loop, the index list turned back into a tensor) was 1-2 % of a
    digits step (bench/trainer_bench.py). The batches are the same, sample for sample.
    """

    def __init__(self, dataset: TensorDataset, sampler: ResumableSampler) -> None:
        self.dataset, self.sampler = dataset, sampler

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        tensors = self.dataset.tensors
        for index in self.sampler.index_batches():
            yield tuple(t[index] for t in tensors)


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
    dataset: Dataset,
    sampler: ResumableSampler | StreamPosition,
    num_workers: int,
    pin_memory: bool,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> tuple[DataLoader | InMemoryBatches, torch.Generator]:
    """A DataLoader over ``sampler`` with its own generator (re-seed it per epoch before ``iter``); an
    in-memory TensorDataset read without workers gets :class:`InMemoryBatches` instead.

    With workers, a user's dataset is wrapped so each batch's random augmentation is seeded from
    (seed, epoch, batch) and a resumed run repeats it exactly (:mod:`trainer.seeding`).
    """
    from trainer.seeding import WorkerSeeded

    generator = torch.Generator()
    if isinstance(dataset, StepSource):  # shards that start at any step: one window of steps per item
        assert isinstance(sampler, StreamPosition)
        windows = WindowSteps(dataset, sampler, collate_fn)
        loader = DataLoader(
            windows,
            batch_size=None,
            num_workers=num_workers,
            pin_memory=pin_memory,
            generator=generator,
            prefetch_factor=1 if num_workers else None,  # one window ahead per worker: bounded memory
        )
        return loader, generator
    if isinstance(sampler, StreamPosition):  # a stream: whole steps per item, no sampler (StreamSteps)
        steps = StreamSteps(dataset, sampler, collate_fn or default_collate)
        loader = DataLoader(
            steps, batch_size=None, num_workers=num_workers, pin_memory=pin_memory, generator=generator
        )
        return loader, generator
    batched = isinstance(dataset, TensorDataset) and collate_fn is None
    if batched and num_workers == 0 and not pin_memory and isinstance(sampler, ResumableSampler):
        return InMemoryBatches(dataset, sampler), generator
    if not batched and num_workers > 0 and hasattr(dataset, "__getitem__"):
        dataset = WorkerSeeded(dataset, sampler.seed)
    return (
        DataLoader(
            TensorBatches(dataset) if batched else dataset,
            batch_size=sampler.plan.micro_batch,
            sampler=sampler,
            num_workers=num_workers,
            pin_memory=pin_memory,
            generator=generator,
            collate_fn=keep_batch if batched else collate_fn,
            persistent_workers=False,
        ),
        generator,
    )


def epoch_iterator(
    loader: DataLoader | InMemoryBatches, generator: torch.Generator, seed: int, epoch: int, start_step: int
) -> Iterator[Any]:
    """An iterator over the rest of ``epoch`` from ``start_step``; draws nothing from the global RNG."""
    if isinstance(loader.dataset, WindowSteps):  # windows -> steps -> micro-batches
        windows = loader.dataset
        windows.position.set_position(epoch, start_step)
        windows.source.prepare_epoch(windows.position)
        generator.manual_seed(epoch_seed(seed, epoch) ^ 0x5EED)
        return itertools.chain.from_iterable(itertools.chain.from_iterable(loader))
    if isinstance(loader.dataset, StreamSteps):  # a stream: flatten its steps into micro-batches
        loader.dataset.position.set_position(epoch, start_step)
        generator.manual_seed(epoch_seed(seed, epoch) ^ 0x5EED)
        return itertools.chain.from_iterable(loader)
    sampler = loader.sampler
    assert isinstance(sampler, ResumableSampler)
    sampler.set_position(epoch, start_step)
    from trainer.seeding import WorkerSeeded

    if isinstance(loader.dataset, WorkerSeeded):  # workers copy it when iter() starts them
        loader.dataset.epoch = epoch
    generator.manual_seed(epoch_seed(seed, epoch) ^ 0x5EED)
    return iter(loader)


# -- iterable datasets (streams), custom collate, evaluation batches ---------------------------------


def is_stream(dataset: Any) -> bool:
    """An iterable-style dataset: read in order, no length, no indexing (torch ``IterableDataset``)."""
    return isinstance(dataset, IterableDataset)


def sized_len(dataset: Any) -> int | None:
    """The number of samples of a map-style dataset; None for a stream."""
    return None if is_stream(dataset) else len(dataset)


class StreamPosition:
    """Where a run is in a stream: the pass (``epoch``) and the optimizer steps already taken in it.

    It plays the part the :class:`ResumableSampler` plays for a sized dataset; the number of steps
    in a pass is unknown until the stream ends, so ``steps_per_epoch`` is None.
    """

    steps_per_epoch: int | None = None

    def __init__(self, plan: BatchPlan, rank: int, seed: int) -> None:
        self.plan, self.rank, self.seed = plan, rank, seed
        self.epoch, self.start_step = 0, 0

    def set_position(self, epoch: int, start_step: int) -> None:
        self.epoch, self.start_step = epoch, start_step


def make_position(dataset: Any, plan: BatchPlan, rank: int, seed: int) -> ResumableSampler | StreamPosition:
    """The resumable position in ``dataset``: a sampler for a sized one, a stream position otherwise."""
    if isinstance(dataset, StepSource):  # a stream whose steps per epoch are known in advance
        position = StreamPosition(plan, rank, seed)
        position.steps_per_epoch = dataset.steps_per_epoch(plan)
        return position
    if is_stream(dataset):
        return StreamPosition(plan, rank, seed)
    return ResumableSampler(len(dataset), plan, rank, seed)


@contextlib.contextmanager
def _stream_seeded(seed: int, epoch: int, block: int) -> Iterator[None]:
    """Randomness drawn while the stream makes block ``block`` comes from (seed, epoch, block).

    So a resumed run, which re-reads the skipped blocks, sees the same samples after them. In the
    main process the global generators are restored afterwards: the model's own randomness
    (dropout) keeps following the checkpointed generator states.
    """
    from trainer.seeding import batch_seed, seed_this_worker

    in_worker = get_worker_info() is not None
    saved = None if in_worker else (random.getstate(), np.random.get_state(), torch.get_rng_state())
    seed_this_worker(batch_seed(seed, epoch, block))
    try:
        yield
    finally:
        if saved is not None:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])


class StreamSteps(IterableDataset):
    """This rank's micro-batches of a stream, grouped by optimizer step, from a given position.

    The stream is cut into global blocks of ``global_batch`` samples (one optimizer step each); a
    last partial block is dropped, so every rank sees the same number of steps. A rank keeps its
    share of each block laid out as :class:`ResumableSampler` lays out an index block (2 ranks x 16
    see the samples of 1 x 32). Each item is the list of ``accum_steps`` collated micro-batches of
    one step: with DataLoader workers, whole steps go round-robin to the workers, so the order of
    steps is the same with any number of workers and after a resume. Resume reads the stream from
    the start of the pass (``set_epoch(epoch)`` is called when the dataset has it) and skips the
    blocks already trained on: it costs reading them again, and it is exact when the stream yields
    the same samples for the same epoch (randomness drawn while reading is seeded per block).
    Every worker and every rank reads the whole stream and keeps its share; a large stream that
    shards itself by rank and worker should be read with ``num_workers: 0`` or ``1``.
    """

    def __init__(
        self, source: IterableDataset, position: StreamPosition, collate: Callable[[list[Any]], Any]
    ) -> None:
        self.source, self.position, self.collate = source, position, collate

    def __iter__(self) -> Iterator[list[Any]]:
        pos, plan = self.position, self.position.plan
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        set_epoch = getattr(self.source, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(pos.epoch)
        samples = iter(self.source)
        block = 0
        while True:
            with _stream_seeded(pos.seed, pos.epoch, block):
                chunk = list(itertools.islice(samples, plan.global_batch))
            if len(chunk) < plan.global_batch:
                return
            relative = block - pos.start_step
            block += 1
            if relative < 0 or relative % workers != worker:
                continue
            micro = []
            for m in range(plan.accum_steps):
                first = (m * plan.world_size + pos.rank) * plan.micro_batch
                micro.append(self.collate(chunk[first : first + plan.micro_batch]))
            yield micro


class StepSource(IterableDataset):
    """A stream that can start at any step without reading what comes before it (trainer.shards).

    Unlike a plain stream (:class:`StreamSteps`, which re-reads and skips the steps already trained
    on), it knows its steps per epoch in advance from metadata, and it cuts each rank's share of an
    epoch into *windows* of whole steps: a worker reads only its own windows (no sample read twice),
    and the order of steps depends on (seed, epoch, world size) alone, never on the number of
    DataLoader workers. Iterating it directly yields plain samples in stored order (find-batch,
    estimate, evaluation).
    """

    def steps_per_epoch(self, plan: BatchPlan) -> int:
        """Optimizer steps in every epoch, the same on every rank."""
        raise NotImplementedError

    def prepare_epoch(self, position: StreamPosition) -> None:
        """Called in the main process before the workers start reading from ``position``."""

    def windows(
        self,
        position: StreamPosition,
        worker: int,
        workers: int,
        collate: Callable[[list[Any]], Any] | None,
    ) -> Iterator[list[list[Any]]]:
        """This worker's windows from ``position``, in order: each a list of steps, each step a list of
        ``accum_steps`` micro-batches. Window ``i`` (counted from the position) belongs to worker
        ``i % workers``, so the DataLoader's round-robin hands them back in order."""
        raise NotImplementedError


class WindowSteps(IterableDataset):
    """What a DataLoader iterates for a :class:`StepSource`: this worker's windows from the position."""

    def __init__(
        self, source: StepSource, position: StreamPosition, collate: Callable[[list[Any]], Any] | None
    ) -> None:
        self.source, self.position, self.collate = source, position, collate

    def __iter__(self) -> Iterator[list[list[Any]]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.source.windows(self.position, worker, workers, self.collate)


def take_samples(dataset: Any, count: int) -> list[Any]:
    """The first ``count`` samples (cycling through a smaller dataset); for find-batch and estimate."""
    length = sized_len(dataset)
    if length is not None:
        if length == 0:
            raise ValueError("the dataset is empty")
        return [dataset[i % length] for i in range(count)]
    taken: list[Any] = []
    while len(taken) < count:
        before = len(taken)
        taken.extend(itertools.islice(iter(dataset), count - len(taken)))
        if len(taken) == before:
            raise ValueError("the stream yielded no samples")
    return taken


def eval_batches(
    dataset: Any, batch_size: int, rank: int, world: int, collate: Callable[[list[Any]], Any] | None
) -> Iterator[Any]:
    """This rank's share of the eval set: index shards of a sized set, every world-th batch of a stream."""
    if is_stream(dataset):
        loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate or default_collate)
        yield from itertools.islice(iter(loader), rank, None, world)
        return
    indices = list(range(rank, len(dataset), world))
    fast = collate is None and isinstance(dataset, TensorDataset)
    for first in range(0, len(indices), batch_size):
        chunk = indices[first : first + batch_size]
        if fast:
            index = torch.as_tensor(chunk)
            yield tuple(t[index] for t in dataset.tensors)
        else:
            yield (collate or default_collate)([dataset[i] for i in chunk])
