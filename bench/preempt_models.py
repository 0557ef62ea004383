"""The model and data of ``bench/preempt_bench.py``: a 50M-parameter MLP on synthetic samples.

Imported by the trainer through the config (``preempt_models:mlp50m``), with bench/ on PYTHONPATH.
The eval set is built sample by sample (a map-style dataset, as most users' are) and is large, so
an evaluation takes many seconds on a CPU: long enough to send a SIGTERM into.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

FEATURES, CLASSES = 1024, 10


def mlp50m() -> nn.Module:
    """1024 -> 4096 -> 4096 -> 4096 -> 3072 -> 10: 50.4M parameters (600 MB of fp32 weights + AdamW)."""
    widths = [FEATURES, 4096, 4096, 4096, 3072]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(widths[-1], CLASSES))


class Samples(Dataset):
    """Deterministic random samples made on demand; ``marker`` is created at the first read."""

    def __init__(self, count: int, seed: int, marker: str | None = None) -> None:
        self.count, self.seed, self.marker = count, seed, marker

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.marker and not os.path.exists(self.marker):
            Path(self.marker).touch()
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return torch.randn(FEATURES, generator=gen), torch.tensor(index % CLASSES)


def synthetic(
    train: int = 2048, evaluate: int = 20_000, marker: str | None = None
) -> tuple[Dataset, Dataset]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(train, FEATURES, generator=gen)
    y = torch.randint(0, CLASSES, (train,), generator=gen)
    return TensorDataset(x, y), Samples(evaluate, seed=1, marker=marker)
