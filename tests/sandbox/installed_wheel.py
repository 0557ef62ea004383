"""What the tests of the product's wheel share: what it is built from, and an install of it.

A plain module, not the conftest (tests/sandbox/conftest.py holds the fixtures), so that test files
can import these names: every conftest.py is a module named `conftest`.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: The Python packages' sources, and what the build reads beside them.
PYTHON_SOURCES = ("forja", "forja_sandbox", "trainer", "requirements")
BUILD_FILES = ("pyproject.toml", "README.md", "setup.py", "MANIFEST.in")
#: What would choose forja's content, cloud or credentials for the installed copy from the test run.
CHOOSING = ("FORJA_ROOT", "FORJA_INVENTORY", "VIRTUAL_ENV", "PYTHONPATH", "FORJA_GCP_PROJECT",
            "FORJA_GCP_CREDENTIALS_FILE", "FORJA_GCP_ACCESS_TOKEN", "FORJA_GCP_API_URL",
            "GOOGLE_APPLICATION_CREDENTIALS")


def shipped_content() -> tuple[str, ...]:
    """The repository's Ansible content that the wheel carries: setup.py's CONTENT, its one home."""
    for node in ast.parse((REPO / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CONTENT" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no CONTENT")


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


@dataclass(frozen=True)
class Installed:
    """The wheel installed into a fresh venv outside the clone."""

    venv: Path
    site_packages: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def content(self) -> Path:
        """The Ansible content the installed forja carries (forja.paths.SHIPPED_ROOT there)."""
        return self.site_packages / "forja" / "_collection" / "ansible_collections" / "forja" / "gpu"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a user of this install: its bin first on PATH, not the clone's .venv,
        and nothing of the test run that chooses forja's content, cloud or credentials."""
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != BIN]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k not in CHOOSING}
        return {**env, "PATH": os.pathsep.join([str(self.bin), *path]), "ANSIBLE_NOCOLOR": "1",
                "COLUMNS": "200", **extra}


def help_commands(text: str) -> set[str]:
    """The command names `forja --help` lists (click's plain help: a "Commands:" section of
    "  NAME  summary" lines, the summary's wrapped lines indented further)."""
    listed = text.split("\nCommands:\n", 1)[-1].splitlines()
    return {line.split()[0] for line in listed if line.startswith("  ") and not line.startswith("   ")}
