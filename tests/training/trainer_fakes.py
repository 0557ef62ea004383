"""Helper models for find-batch tests: real CNNs whose "device" runs out of memory above a known batch.

On a CPU there is no allocator limit to hit, so the limit is simulated the way the CUDA caching
allocator reports it: ``torch.OutOfMemoryError`` raised from inside the forward pass, for any batch
larger than ``limit``. Under torchrun, ``limits_by_rank`` gives each rank its own limit (a node with
less free memory), to check that every rank ends up with the minimum.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from trainer.demo import digits_cnn


class BatchLimited(nn.Module):
    """Wraps a real model; a batch above ``limit`` fails like a CUDA OOM would."""

    def __init__(self, inner: nn.Module, limit: int) -> None:
        super().__init__()
        self.inner = inner
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {x.shape[0] * 3} MiB (simulated limit {self.limit})"
            )
        return self.inner(x)


def limited_digits(limit: int = 37, limits_by_rank: list[int] | None = None) -> nn.Module:
    if limits_by_rank is not None:
        limit = limits_by_rank[int(os.environ.get("RANK", "0"))]
    return BatchLimited(digits_cnn(width=4, hidden=16), limit)


def broken_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A loss that fails for a reason other than memory (must not be mistaken for an OOM)."""
    raise RuntimeError("shape mismatch in the loss")
