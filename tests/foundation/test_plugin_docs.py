"""Every plugin forja ships renders in ansible-doc with a description and examples.

The list comes from the plugins/ folder itself, so a plugin added without its DOCUMENTATION or
EXAMPLES fails here rather than in a user's `ansible-doc`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# ansible-doc's type for each plugins/ folder, and the file suffix that holds a plugin's docs
# (a filter's docs live in a YAML file next to the Python file that holds several filters).
KINDS = {"modules": ("module", ".py"), "inventory": ("inventory", ".py"),
         "filter": ("filter", ".yml"), "strategy": ("strategy", ".py")}


def _plugins() -> list[tuple[str, str]]:
    found = []
    for folder, (kind, suffix) in KINDS.items():
        found += [(kind, p.stem) for p in sorted((ROOT / "plugins" / folder).glob(f"*{suffix}"))
                  if not p.name.startswith("_")]
    return found


def test_every_plugin_folder_is_covered() -> None:
    folders = {p.name for p in (ROOT / "plugins").iterdir() if p.is_dir()}
    assert folders - set(KINDS) == {"module_utils", "callback"}


@pytest.mark.parametrize(("kind", "name"), _plugins(), ids=lambda v: v)
def test_the_plugin_renders_with_a_description_and_examples(kind: str, name: str) -> None:
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-doc"), "-j", "-t", kind, name], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and "[ERROR]" not in proc.stderr, proc.stderr
    entry = json.loads(proc.stdout)[name]
    assert entry["doc"]["short_description"] and entry["doc"]["description"]
    assert entry["examples"].strip()
