"""Fixtures for API tests on real test hosts: the host th6, booted from the Deep Learning VM layer."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from forja_sandbox import hostlayers, testhosts


@pytest.fixture(scope="session")
def th6() -> Iterator[testhosts.Host]:
    """One th6 for every API test module.

    It boots the Deep Learning VM layer, as forja's VMs do (trainer_run layers its environment on the
    image's own PyTorch; the install path on a plain image is molecule/trainer_run's th3), with the
    trainer's environment already built over it (forja_sandbox/hostlayers.py: built once, by the
    role's own tasks, until what it is built from changes). The wheelhouse holds the trainer's pins.
    """
    if os.geteuid() != 0:
        pytest.skip("test hosts need root")
    layer = hostlayers.trainer_env()
    testhosts.down(6)  # a th6 left by an interrupted run may have other layers
    host = testhosts.up(6, image="dlvm", over=layer)
    try:
        yield host
    finally:
        testhosts.down(6)
