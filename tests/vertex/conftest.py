"""One Vertex emulator (and one Cloud Storage emulator) per test module; the module tests run
playbooks with the GCP tests' helpers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from forja_sandbox.storage_emulator import StorageEmulator
from forja_sandbox.vertex_emulator import VertexEmulator

# Helpers in their one home: tests/gcp/gcp_helpers.py (run_module_tasks, offline_env) and
# tests/training/trainer_helpers.py (tiny_digits).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gcp"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))


@pytest.fixture(scope="module")
def emulator() -> Iterator[VertexEmulator]:
    with VertexEmulator() as emu:
        yield emu


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageEmulator]:
    with StorageEmulator(data_dir=tmp_path_factory.mktemp("gcs")) as running:
        yield running


@pytest.fixture
def sandbox(
    emulator: VertexEmulator, gcs: StorageEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> VertexEmulator:
    """Both emulators named the way forja and the replicas find them (their documented settings)."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.url)
    monkeypatch.setenv("FORJA_VERTEX_API_URL", f"{emulator.url}/v1/")
    monkeypatch.setenv("FORJA_LOGGING_API_URL", f"{emulator.url}/v2/")  # Cloud Logging, same port
    monkeypatch.setenv("FORJA_GCP_PROJECT", "forja-sandbox")
    monkeypatch.setenv("FORJA_GCP_ACCESS_TOKEN", "sandbox-token")  # the emulator takes any bearer token
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the replica's torch: one thread on the 2-core CI box
    for name in ("FORJA_INVENTORY", "ANSIBLE_INVENTORY", "FORJA_CHECKPOINT_BUCKET", "FORJA_RUN"):
        monkeypatch.delenv(name, raising=False)
    return emulator
