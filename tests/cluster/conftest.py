"""Fixtures of the cluster tests: a fresh Compute emulator over real HTTP and a key for it.

The helpers that run Ansible against the emulator, and the guard that fails a test whose code
reaches past loopback, have their one home in tests/gcp (gcp_helpers.py, conftest.py).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

GCP_TESTS = Path(__file__).resolve().parents[1] / "gcp"
sys.path.insert(0, str(GCP_TESTS))

_spec = importlib.util.spec_from_file_location("gcp_tests_conftest", GCP_TESTS / "conftest.py")
assert _spec is not None and _spec.loader is not None
_gcp_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gcp_conftest)
no_outbound_network = _gcp_conftest.no_outbound_network  # autouse: nothing leaves this machine
only_googles_background_lookup_left_the_machine = (  # a test module asks for it (usefixtures)
    _gcp_conftest.only_googles_background_lookup_left_the_machine
)


@pytest.fixture
def emulator() -> Iterator[object]:
    from forja_sandbox.compute_emulator import ComputeEmulator

    with ComputeEmulator() as emu:
        yield emu


@pytest.fixture
def key_file(emulator, tmp_path: Path) -> Path:
    return emulator.write_service_account_key(tmp_path / "sa-key.json")
