"""A model for the shard tests that writes down which samples each training step saw.

It takes dict batches (``data_args.columns: null``): ``image`` and ``id`` go to ``forward``, the
trainer takes ``label`` as the target. One line of ids per micro-batch, appended to ``path``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from trainer.shard_writer import demo_columns, write_shards


class IdRecorder(nn.Module):
    """A small classifier on the first 64 values of ``image`` (any numeric dtype, any size: the
    memory test's 64 KiB samples cost the model nothing, so what it measures is the data's)."""

    def __init__(self, path: str, classes: int = 10) -> None:
        super().__init__()
        self.path = path
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, classes))

    def forward(self, image: torch.Tensor, id: torch.Tensor) -> torch.Tensor:
        if self.training:
            with open(self.path, "a") as handle:
                handle.write(" ".join(map(str, id.tolist())) + "\n")
        return self.net(image.reshape(len(image), -1)[:, :64].float())


def seen(path: str) -> list[list[int]]:
    """The ids of each micro-batch, in training order."""
    with open(path) as handle:
        return [[int(i) for i in line.split()] for line in handle]


def write_digits_shards(out: Path) -> Path:
    """The digits demo as 4 train shards of 360 rows (row groups of ~120) and one eval shard."""
    splits = demo_columns("digits")
    train = splits["train"]
    (out / "train").mkdir(parents=True)
    for i, first in enumerate(range(0, len(train["label"]), 360)):
        part = {k: v[first : first + 360] for k, v in train.items()}
        (written,) = write_shards([part], out / "parts" / str(i), "train", row_group_mb=0.03)
        written.rename(out / "train" / f"shard-{i:06d}.parquet")
    write_shards([splits["eval"]], out, "eval")
    return out
