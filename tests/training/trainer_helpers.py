"""Helpers for the trainer's tests: tiny real runs on CPU, and the environment for child processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
REPO = HERE.parent.parent


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for `python -m trainer` children: this repo and the helper models importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")])
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **extra})
    return env


def tiny_digits(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """A raw config for a small digits CNN that trains in about a second."""
    raw: dict[str, Any] = {
        "model": "trainer.demo:digits_cnn",
        "model_args": {"width": 8, "hidden": 32},
        "data": "trainer.demo:digits",
        "steps": 60,
        "batch_size": 16,
        "lr": 0.003,
        "precision": "fp32",
        "log_every_steps": 1,
        "checkpoint_every_s": 0,
        "device": "cpu",
        "out_dir": str(tmp_path / "run"),
        "cache_dir": str(tmp_path / "cache"),
        "render_plots": False,  # matplotlib is slow on a busy machine; the demo and report tests draw
    }
    raw.update(overrides)
    return raw
