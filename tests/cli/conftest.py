"""What the command-line tests share."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private forja home, and an inventory named (FORJA_INVENTORY) that has no GPU host."""
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    empty = tmp_path / "no-hosts.yml"
    empty.write_text(yaml.safe_dump({"all": {"children": {"forja_gpu": {"hosts": {}}}}}))
    monkeypatch.setenv("FORJA_INVENTORY", str(empty))
    return tmp_path / "home"
