"""forja's trainer: a PyTorch training loop that finds its limits, survives Spot preemption and reports.

Standalone on purpose: it is copied to the GPU host and imports nothing from ``forja``. Use it as
``python -m trainer train --config FILE.yaml`` or from Python::

    from trainer import load_config, train
    result = train(load_config("digits", ["steps=200"]), out_dir="runs/demo")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Relative: the collection ships this package as ansible_collections.forja.gpu.trainer, where the
# forja_format filter imports trainer.figures through it (plugins/plugin_utils/forja_format.py).
from .version import __version__

__all__ = ["__version__", "load_config", "train"]

if TYPE_CHECKING:
    from trainer.config import TrainConfig
    from trainer.train import RunResult


def load_config(path: str, overrides: list[str] | None = None) -> TrainConfig:
    """Read and validate a YAML config (a path or a built-in name: ``digits``, ``mnist``)."""
    from trainer.config import load

    return load(path, overrides)


def train(config: TrainConfig, out_dir: str | None = None, **kwargs: Any) -> RunResult:
    """Train or resume; see :func:`trainer.train.train`. Imported lazily: ``import trainer`` stays cheap."""
    from trainer.train import train as _train

    return _train(config, out_dir, **kwargs)
