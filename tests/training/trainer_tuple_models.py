"""Models that return plain tuples, as Hugging Face models do with ``return_dict=False``.

Given labels such a model returns ``(loss, logits, ...)``; without them ``(logits, ...)``. The loss
here uses label smoothing, so it differs from the cross-entropy the trainer would compute itself:
a test can tell whose loss was used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SMOOTHING = 0.2


class TupleNet(nn.Module):
    """``(loss, logits, hidden)`` given labels, ``(logits, hidden)`` without."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 10)

    def forward(
        self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        hidden = self.body(pixel_values)
        logits = self.head(hidden)
        if labels is None:
            return logits, hidden
        return F.cross_entropy(logits, labels, label_smoothing=SMOOTHING), logits, hidden


class LossOnlyNet(TupleNet):
    """``(loss,)``: a model that gives its loss and nothing else."""

    def forward(  # type: ignore[override]
        self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        return super().forward(pixel_values, labels)[:1]
