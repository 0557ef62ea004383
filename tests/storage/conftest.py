"""A storage emulator per test module, reached the way forja reaches GCS: google-cloud-storage with
STORAGE_EMULATOR_HOST (forja_sandbox/storage_emulator.py)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from forja_sandbox.service import PROJECT
from forja_sandbox.storage_emulator import StorageEmulator

# The module tests run playbooks with the GCP tests' helpers (tests/gcp/gcp_helpers.py, their one home).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gcp"))


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageEmulator]:
    with StorageEmulator(data_dir=tmp_path_factory.mktemp("gcs")) as running:
        yield running


@pytest.fixture
def client(emulator: StorageEmulator, monkeypatch: pytest.MonkeyPatch) -> storage.Client:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
    return storage.Client(project=PROJECT, credentials=AnonymousCredentials())


@pytest.fixture
def bucket_name() -> str:
    return f"forja-test-{uuid.uuid4().hex[:12]}"
