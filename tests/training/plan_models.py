"""Models for the plan's tests: one that fake tensors cannot follow (its forward reads a value)."""

from __future__ import annotations

import torch
from torch import nn

from trainer.demo import digits_cnn


class ReadsAValue(nn.Module):
    """Decides its control flow on a tensor's value: data-dependent, so FakeTensorMode cannot trace it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if float(x.sum().item()) > 0 else x


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = ReadsAValue()
        self.body = digits_cnn(width=4, hidden=16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.gate(x))


def gated() -> nn.Module:
    return Gated()
