"""Helpers for the trainer's tests: tiny real runs on CPU, and the environment for child processes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
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


def launcher_env(tmp_path: Path, run: str, spec: dict[str, Any], project: Path, *, nproc: int = 1,
                 grace: int = 20, **extra: str) -> dict[str, str]:
    """forja-train-launch's environment, as the role's env file (run.env.j2) gives it, for one node
    running `spec` (the run spec, written to tmp_path/run.yaml) from `project`."""
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    return subprocess_env(
        FORJA_RUN=run, FORJA_OUT=str(tmp_path / "out"), FORJA_CODE=str(REPO), FORJA_CONFIG=str(path),
        FORJA_PYTHON=sys.executable, FORJA_NNODES="1", FORJA_NODE_RANK="0", FORJA_NPROC_PER_NODE=str(nproc),
        FORJA_STOP_GRACE_S=str(grace), FORJA_PROJECT_DIR=str(project), **extra,
    )


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


def objects(bucket: Any, prefix: str) -> dict[str, bytes]:
    """Every object of ``bucket`` under ``prefix``, name to bytes."""
    return {b.name: b.download_as_bytes() for b in bucket.client.list_blobs(bucket.name, prefix=prefix)}


def until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something true (that value), else fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")

