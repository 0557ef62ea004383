"""Users' code for the robustness drills: real models and datasets with the properties a drill needs.

Nothing here stands in for forja's own code. Each is something a researcher could write: an eval set
that is slow because it is big and built sample by sample in Python, a dataset with random
augmentation, a model that runs out of memory above some batch size once a run is under way, and a
data factory that reads a file.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from trainer.demo import digits, digits_cnn


class Repeated(Dataset):
    """``times`` passes over a TensorDataset, one sample at a time (default_collate path: slow in Python).

    ``marker``, when given, is created at the first read: the test knows the evaluation has begun.
    """

    def __init__(self, base: TensorDataset, times: int, marker: str | None = None) -> None:
        self.base, self.times, self.marker = base, times, marker

    def __len__(self) -> int:
        return len(self.base) * self.times

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.marker is not None and not os.path.exists(self.marker):
            Path(self.marker).touch()
        x, y = self.base[index % len(self.base)]
        return x * 1.0, y


def digits_big_eval(times: int = 300, marker: str | None = None) -> tuple[TensorDataset, Dataset]:
    """The digits training set and an eval set of ``times`` x 359 samples (300: about 108k)."""
    train, held = digits()
    return train, Repeated(held, times, marker)


class Augmented(Dataset):
    """Digits with random noise, shifts and flips drawn from torch, NumPy and Python's random."""

    def __init__(self, base: TensorDataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.base[index]
        x = x + 0.1 * torch.randn_like(x)
        x = torch.roll(x, shifts=int(np.random.randint(-1, 2)), dims=-1)
        if random.random() < 0.5:
            x = torch.flip(x, dims=[-2])
        return x, y


def augmented_digits() -> tuple[Dataset, TensorDataset]:
    train, held = digits()
    return Augmented(train), held


class OomAbove(nn.Module):
    """A real CNN on a device that, after ``after`` forward passes, has room for ``limit`` samples only.

    Memory that shrinks during a run (fragmentation, a longer batch, a second process on the GPU) is
    what makes an OOM happen mid-run rather than at the first step; ``style`` picks how the error
    reads: ``type`` raises torch.OutOfMemoryError, ``message`` the RuntimeError older builds raise.
    """

    def __init__(self, limit: int, after: int, style: str = "type") -> None:
        super().__init__()
        self.inner = digits_cnn(width=4, hidden=16)
        self.limit, self.after, self.style, self.calls = limit, after, style, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > self.after and x.shape[0] > self.limit:
            text = f"CUDA out of memory. Tried to allocate {x.shape[0]} MiB (room for {self.limit} samples)"
            raise torch.OutOfMemoryError(text) if self.style == "type" else RuntimeError(text)
        return self.inner(x)


def oom_above(limit: int = 16, after: int = 10, style: str = "type") -> nn.Module:
    return OomAbove(limit, after, style)


def digits_from_file(path: str) -> tuple[TensorDataset, TensorDataset]:
    """A data factory that reads its file first, as most real ones do (a missing file raises)."""
    with open(path, "rb") as handle:
        handle.read(1)
    return digits()


class BadLossAt:
    """Cross-entropy, except at the given calls with gradients (training forward passes; the trainer's
    FLOP count makes one before the first step), where the loss is times ``value`` ("nan", "inf"),
    its gradient too: the bad batch a diverging run meets. The final evaluation (no gradients) is
    left alone."""

    def __init__(self, calls: list[int], value: str = "nan") -> None:
        self.at, self.value, self.calls = set(calls), float(value), 0

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(output, target)
        if not torch.is_grad_enabled():
            return loss
        self.calls += 1
        return loss * self.value if self.calls in self.at else loss
