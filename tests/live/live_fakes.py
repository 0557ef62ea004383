"""Data for live-view tests, imported by `python -m trainer` children through the config's data path.

`hanging_digits`: the digits train set, whose reads block for good once a file exists (a stuck data
source: the loop makes no progress, the process and its metrics endpoint stay up).
`slow_eval_digits`: the digits, with an evaluation set whose reads are slow (a long evaluation that
reports progress batch by batch). Both build on trainer.demo's digits, so the runs are real.
"""

from __future__ import annotations

import os
import time

from torch.utils.data import Dataset, TensorDataset

from trainer.demo import digits


class HangWhen(Dataset):
    """``base``, except that every read blocks (sleeping) while the file ``hang`` exists."""

    def __init__(self, base: TensorDataset, hang: str) -> None:
        self.base, self.hang = base, hang

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        while os.path.exists(self.hang):
            time.sleep(0.05)
        return self.base[index]


class Slow(Dataset):
    """``base`` repeated ``times`` times, each read taking ``delay_s`` (a long, steady evaluation)."""

    def __init__(self, base: TensorDataset, times: int, delay_s: float) -> None:
        self.base, self.times, self.delay_s = base, times, delay_s

    def __len__(self) -> int:
        return len(self.base) * self.times

    def __getitem__(self, index: int):
        time.sleep(self.delay_s)
        return self.base[index % len(self.base)]


def hanging_digits(hang: str) -> tuple[Dataset, TensorDataset]:
    train, held = digits()
    return HangWhen(train, hang), held


def slow_eval_digits(times: int = 4, delay_s: float = 0.005) -> tuple[TensorDataset, Dataset]:
    train, held = digits()
    return train, Slow(held, times, delay_s)
