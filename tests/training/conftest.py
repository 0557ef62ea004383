"""Fixtures for the trainer's tests: tiny real runs on CPU, one thread each.

One intra-op thread per process: the CI machine has 2 cores shared with other work, and two
processes (DDP) with two spinning OpenMP threads each run several times slower than with one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

HERE = Path(__file__).parent

# the helper modules (trainer_helpers, trainer_fakes) are imported by tests and by config paths
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The sandbox's Cloud Storage emulator, one per test module (imported here only when asked for)."""
    from forja_sandbox.storage_emulator import StorageEmulator

    with StorageEmulator(data_dir=tmp_path_factory.mktemp("gcs")) as running:
        yield running


@pytest.fixture
def bucket(emulator: Any, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Any:
    """A new bucket for each test, on the module's emulator, with the trainer's mirror settings
    cleared (a test names its own bucket URL) and the run named "run"."""
    storage = pytest.importorskip("google.cloud.storage")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
    monkeypatch.delenv("FORJA_CHECKPOINT_BUCKET", raising=False)
    monkeypatch.setenv("FORJA_RUN", "run")
    name = request.node.name.lower().replace("_", "-")[:50].strip("-")
    return storage.Client().create_bucket(name)

