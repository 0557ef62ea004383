"""Fixtures for API tests on real test hosts: the host th6, booted from the Deep Learning VM layer."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from apihosts import ensure_wheelhouse

from forja_sandbox import testhosts


@pytest.fixture(scope="session")
def th6() -> Iterator[testhosts.Host]:
    """One th6 for every API test module: its trainer environment is built once per session.

    It boots the Deep Learning VM layer, as forja's VMs do: trainer_run layers its environment on the
    image's own PyTorch instead of installing a second one (the install path on a plain image is
    molecule/trainer_run's th3). The wheelhouse holds the trainer's other pins.
    """
    if os.geteuid() != 0:
        pytest.skip("test hosts need root")
    ensure_wheelhouse()
    host = testhosts.up(6, image="dlvm")
    try:
        yield host
    finally:
        testhosts.down(6)
