"""Helpers for API tests on real test hosts: inventories for test hosts, ssh."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from forja_sandbox import hostlayers, testhosts

REPO = Path(__file__).resolve().parents[2]


def write_inventory(path: Path, hosts: dict[str, dict[str, object]]) -> Path:
    """An inventory with the given hosts in forja_gpu, as forja's playbooks expect."""
    path.write_text(yaml.safe_dump({"all": {"children": {"forja_gpu": {"hosts": hosts}}}}))
    return path


def ssh(host: testhosts.Host, command: str) -> str:
    """Run a command on a test host as its login user (outside forja: what the test checks)."""
    proc = subprocess.run(host.ssh_argv(command), capture_output=True, text=True, check=True, timeout=60)
    return proc.stdout


def host_vars(host: testhosts.Host) -> dict[str, object]:
    return {
        "ansible_host": host.address,
        "ansible_user": host.user,
        "ansible_ssh_private_key_file": str(host.key),
        "trainer_run_pip_extra_args": hostlayers.PIP_ARGS,
    }
