"""forja-train-state, the host-side reader of run folders, loaded as a module for tests on this machine."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

STATE_READER = Path(__file__).resolve().parents[1] / "roles" / "trainer_run" / "files" / "forja-train-state"


def state_reader(name: str = "forja_train_state") -> ModuleType:
    """forja-train-state (a script without .py) as a module."""
    loader = importlib.machinery.SourceFileLoader(name, str(STATE_READER))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
