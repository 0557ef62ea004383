"""Where forja's things are: its Ansible content (`REPO_ROOT`) and the user's forja folder (`forja_home`).

Why a module of their own: nearly every part of forja needs one of these two paths, and most of those
parts run no play (the inventory reader, the host contract, the history, a role's `python -m
forja.history record`). Kept here, with nothing but the standard library, they pull neither
ansible-runner nor the events into those processes, and they tie no module to the runner.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The forja repository (or FORJA_ROOT): playbooks/, roles/, plugins/ and ansible.cfg live here.
REPO_ROOT = Path(os.environ.get("FORJA_ROOT") or Path(__file__).resolve().parents[1])


def forja_home() -> Path:
    """The user's forja folder (history, runner data); FORJA_HOME overrides it (tests use a temp dir)."""
    return Path(os.environ.get("FORJA_HOME") or Path.home() / ".local" / "share" / "forja").resolve()
