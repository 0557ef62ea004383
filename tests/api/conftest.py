"""Fixtures for API tests on real test hosts: the host th6 with a wheelhouse for its PyTorch."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from apihosts import ensure_wheelhouse

from forja_sandbox import testhosts


@pytest.fixture(scope="session")
def th6() -> Iterator[testhosts.Host]:
    """One th6 for every API test module: its PyTorch install is paid once per session."""
    if os.geteuid() != 0:
        pytest.skip("test hosts need root")
    ensure_wheelhouse()
    host = testhosts.up(6)
    try:
        yield host
    finally:
        testhosts.down(6)
