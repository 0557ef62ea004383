"""A researcher's own code in the shapes it really comes in: Hugging Face-style dict samples and
outputs, an object with ``.loss``, a stream (``IterableDataset``) with random augmentation, a custom
collate. All are small real models on scikit-learn's digits, so a run takes a second or two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from trainer.demo import digits


class DictDigits(Dataset):
    """Digits as Hugging Face-style samples: ``{"pixel_values": (1, 8, 8) float, "labels": int64}``."""

    def __init__(self, tensors: TensorDataset) -> None:
        self.x, self.y = tensors.tensors

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.x[index], "labels": self.y[index]}


def dict_digits() -> tuple[DictDigits, DictDigits]:
    train, held = digits()
    return DictDigits(train), DictDigits(held)


class StreamDigits(IterableDataset):
    """Digits as a stream, reshuffled per pass by ``set_epoch`` (as Hugging Face's IterableDataset is),
    with optional Gaussian noise drawn from the global torch generator while reading (augmentation)."""

    def __init__(self, tensors: TensorDataset, noise: float = 0.0) -> None:
        self.x, self.y = tensors.tensors
        self.noise, self.epoch = noise, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        order = torch.randperm(len(self.y), generator=torch.Generator().manual_seed(1000 + self.epoch))
        for i in order.tolist():
            x = self.x[i]
            if self.noise:
                x = x + self.noise * torch.randn_like(x)
            yield x, self.y[i]


def stream_digits(noise: float = 0.0) -> tuple[StreamDigits, StreamDigits]:
    train, held = digits()
    return StreamDigits(train, noise), StreamDigits(held)


def _mlp(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


class DictNet(nn.Module):
    """Returns ``{"logits", "loss"}`` as a Hugging Face model does when it is given labels."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.net = _mlp(hidden)

    def forward(
        self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        logits = self.net(pixel_values)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


@dataclass
class Output:
    """A model output read by attribute, like transformers' ``ModelOutput`` used as an object."""

    loss: torch.Tensor | None
    logits: torch.Tensor


class LossObjectNet(DictNet):
    """Returns an object with ``.loss`` and ``.logits`` (not a dict)."""

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> Output:  # type: ignore[override]
        logits = self.net(pixel_values)
        return Output(loss=F.cross_entropy(logits, labels) if labels is not None else None, logits=logits)


class MaskedNet(nn.Module):
    """Takes two named inputs and returns only logits: the trainer must compute the loss itself."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.net = _mlp(hidden)

    def forward(self, pixel_values: torch.Tensor, pixel_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.net(pixel_values * pixel_mask)}


def to_dict_batch(
    samples: list[tuple[torch.Tensor, torch.Tensor]], keep: float = 1.0
) -> dict[str, torch.Tensor]:
    """A custom collate: (image, label) tuples -> a dict batch with a mask the model needs."""
    images = torch.stack([s[0] for s in samples])
    return {
        "pixel_values": images,
        "pixel_mask": torch.full_like(images, keep),
        "labels": torch.stack([s[1] for s in samples]),
    }
