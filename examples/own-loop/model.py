"""The example's own model: a small MLP with a separate head, so the loop can give each part its optimizer."""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    """Body (features) + head (prediction): trained by SGD and AdamW respectively in train.py."""

    def __init__(self, inputs: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(inputs, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU())
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)).squeeze(-1)


def make_batch(seed: int, step: int, rank: int, world_size: int, batch: int, inputs: int = 16):
    """The batch of (step, rank): drawn from a generator seeded by both, so a resumed run sees the same data.

    The target is a fixed smooth function of the inputs (its weights come from ``seed`` alone), so the
    loss falls steadily and a resumed run continues the same curve.
    """
    target = torch.Generator().manual_seed(seed)
    w = torch.randn(inputs, generator=target)
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * world_size + rank)
    x = torch.randn(batch, inputs, generator=g)
    y = torch.sin(x @ w / inputs**0.5) + 0.1 * x[:, 0] ** 2
    return x, y
