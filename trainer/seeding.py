"""Random augmentation in DataLoader workers that a resumed run repeats bit for bit.

Why: a worker process seeds its generators once, when the loader's iterator is created, and batch
``i`` goes to worker ``i % num_workers``. A run resumed mid-epoch starts a fresh iterator at
another batch, so a given batch lands on another worker whose generators are elsewhere in their
streams: the random crops and flips differ, and so does the run (a drill measured a max weight
difference of 4.5e-3 from the first resumed step). Checkpointing the workers' generator states is
not possible (they live in other processes), so each batch's randomness is made a pure function
of checkpointed state instead: before a worker fetches a batch, it seeds Python's ``random``,
NumPy's global generator and torch's from (run seed, epoch, the batch's first sample index).
Within an epoch every sample index appears once, so that triple names the batch; it does not
depend on which worker fetches it, how many workers there are, or where the iterator started.

In the main process (``num_workers: 0``) nothing is re-seeded: the augmentation draws from the
global generators, whose states every checkpoint saves, which is exact already.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info


def batch_seed(seed: int, epoch: int, first_index: int) -> int:
    """A well-mixed 63-bit seed for one batch of one epoch of one run."""
    entropy = [abs(seed), 1 if seed < 0 else 0, epoch, first_index, 0xBA7C]
    return int(np.random.SeedSequence(entropy).generate_state(2, np.uint64)[0] >> 1)


def seed_this_worker(value: int) -> None:
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


class WorkerSeeded(Dataset):
    """Wraps a map-style dataset; in a worker, each batch is fetched under a seed of its own.

    ``epoch`` is set by the loop before each epoch's iterator is created (workers are started by
    that call and copy it).
    """

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset, self.seed, self.epoch = dataset, seed, 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        if get_worker_info() is not None:
            seed_this_worker(batch_seed(self.seed, self.epoch, int(index)))
        return self.dataset[index]

    def __getitems__(self, indices: Sequence[int]) -> Any:
        if get_worker_info() is not None and len(indices):
            seed_this_worker(batch_seed(self.seed, self.epoch, int(indices[0])))
        fetch = getattr(self.dataset, "__getitems__", None)
        return fetch(indices) if fetch is not None else [self.dataset[i] for i in indices]
