"""Contract tests on real hosts reuse the API tests' host helpers (tests/api/apihosts.py): one copy."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
