"""Resolve the user's ``package.module:callable`` paths (model, data, loss) with errors naming the key."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from trainer.config import ConfigError


def load_callable(path: str, key: str) -> Callable[..., Any]:
    """Import ``package.module`` and return its ``callable``; ConfigError(key) when it is not there."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            [f"{key}: cannot import module {module_name!r} ({exc}); check the path and that it is installed"]
        ) from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ConfigError([f"{key}: module {module_name!r} has no attribute {attr!r} (check the name)"])
    if not callable(target):
        raise ConfigError([f"{key}: {path!r} is not callable (point it at a function or class)"])
    return target
