"""Fixtures for the live view's tests: real training runs on CPU serving their metrics endpoint.

The trainer's test helpers (tests/training) build the tiny runs; this folder's own fakes
(live_fakes.py) make a run hang or evaluate slowly, as the stall detector's tests need.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
for folder in (HERE, HERE.parent / "training"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
