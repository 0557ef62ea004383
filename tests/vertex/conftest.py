"""One Vertex emulator per test module; the module tests run playbooks with the GCP tests' helpers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from forja_sandbox.vertex_emulator import VertexEmulator

# Helpers in their one home: tests/gcp/gcp_helpers.py (run_module_tasks, offline_env) and
# tests/training/trainer_helpers.py (tiny_digits).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gcp"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))


@pytest.fixture(scope="module")
def emulator() -> Iterator[VertexEmulator]:
    with VertexEmulator() as emu:
        yield emu
