"""Run a playbook on this machine with the repository's ansible.cfg, as a user's shell would.

Tests that check what a role computes (its defaults, the host contract) run a real localhost play
instead of re-implementing Ansible's variable precedence; none of the caller's ANSIBLE_*/FORJA_*
settings leak in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_local_play(play: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """ansible-playbook on localhost (local connection, this Python); fails the test when it fails."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FORJA_"))},
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCALHOST_WARNING": "false",
    }
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(play), *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc
