"""Fixtures of the emulator tests: a real emulator on a loopback port and an HTTP client for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from emulator_helpers import Client

from forja_sandbox.compute_emulator import ComputeEmulator


@pytest.fixture
def emu() -> Iterator[ComputeEmulator]:
    with ComputeEmulator() as emulator:
        yield emulator


@pytest.fixture
def client(emu: ComputeEmulator) -> Client:
    return Client(emu, emu.issue_token())


@pytest.fixture
def anonymous(emu: ComputeEmulator) -> Client:
    return Client(emu, None)
