"""Models for the export tests: weights tied between two layers, and a BatchNorm buffer."""

from __future__ import annotations

import torch
from torch import nn


class TiedNet(nn.Module):
    """Two square layers sharing one weight (as a language model ties its embedding and head)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(64, 64)
        self.norm = nn.BatchNorm1d(64)
        self.second = nn.Linear(64, 64)
        self.second.weight = self.first.weight
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.norm(self.first(x.flatten(1))))
        return self.head(torch.relu(self.second(x)))
