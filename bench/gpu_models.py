"""Model and data of ``bench/gpu_paths.sh``: a small GPT whose memory grows with batch x length².

Why this model: find-batch and the OOM fallback must meet a *real* CUDA out-of-memory, not the
simulated one of the CPU tests. A transformer with plain (materialised) attention keeps a
``heads x T x T`` score matrix per layer and sample for the backward pass, so its activation memory
is about ``8 x layers x heads x T²`` bytes per sample under bf16 autocast (6 layers, 8 heads,
T 2048: about 1.6 GB a sample), and an 80 GB GPU runs out at a batch of a few dozen while the
weights (about 20M parameters) stay small. That is the shape of a real long-context OOM.

The trainer loads these by file path (``./bench/gpu_models.py:gpt``), with ``project_dir`` at
the repository root.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, IterableDataset

VOCAB = 256


class Block(nn.Module):
    """Pre-norm attention (materialised scores, no fused kernel) + MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class Gpt(nn.Module):
    """Token ids (B, T) -> logits (B, T, VOCAB); the trainer's loss: auto flattens them."""

    def __init__(self, dim: int, layers: int, heads: int, max_len: int) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(VOCAB, dim), nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def gpt(dim: int = 512, layers: int = 6, heads: int = 8, max_len: int = 4096) -> nn.Module:
    return Gpt(dim, layers, heads, max_len)


def _sample(index: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A next-token pair from a seeded random sequence (deterministic per index)."""
    gen = torch.Generator().manual_seed(index)
    seq = torch.randint(0, VOCAB, (length + 1,), generator=gen)
    return seq[:-1], seq[1:]


class FixedTokens(Dataset):
    """``count`` sequences of ``length`` tokens (map-style)."""

    def __init__(self, count: int, length: int) -> None:
        self.count, self.length = count, length

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _sample(index, self.length)


class GrowingTokens(IterableDataset):
    """A stream whose first ``short_count`` sequences have ``short`` tokens and the rest ``long``.

    Long documents later in a corpus: the micro-batch that fit at the start runs out of memory there.
    Keep ``short_count`` a multiple of the global batch so no step mixes lengths.
    """

    def __init__(self, short: int, long: int, short_count: int, total: int) -> None:
        self.short, self.long, self.short_count, self.total = short, long, short_count, total

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for index in range(self.total):
            yield _sample(index, self.short if index < self.short_count else self.long)


def fixed_tokens(count: int = 4096, length: int = 2048) -> tuple[Dataset, None]:
    return FixedTokens(count, length), None


def growing_tokens(
    short: int = 512, long: int = 4096, short_count: int = 320, total: int = 100_000
) -> tuple[IterableDataset, None]:
    return GrowingTokens(short, long, short_count, total), None
