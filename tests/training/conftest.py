"""Fixtures for the trainer's tests: tiny real runs on CPU, one thread each.

One intra-op thread per process: the CI machine has 2 cores shared with other work, and two
processes (DDP) with two spinning OpenMP threads each run several times slower than with one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

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
