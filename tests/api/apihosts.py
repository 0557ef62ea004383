"""Helpers for API tests on real test hosts: the wheelhouse, inventories for test hosts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from forja_sandbox import testhosts

REPO = Path(__file__).resolve().parents[2]
#: Inside the test hosts, the controller's pip cache folder (bind-mounted by the fixture).
HOST_WHEELHOUSE = "/var/cache/forja-pip/wheelhouse"


def wheelhouse_requirements() -> list[str]:
    """What the trainer_run role installs, read from its defaults and the trainer's requirements.txt
    (the lists the role reads, not copies)."""
    defaults = yaml.safe_load((REPO / "roles/trainer_run/defaults/main.yml").read_text())
    pins = (REPO / "trainer/requirements.txt").read_text().splitlines()
    return [defaults["trainer_run_torch_package"], f"pip=={defaults['trainer_run_pip_version']}",
            *(line.strip() for line in pins if line.strip() and not line.lstrip().startswith("#"))]


def ensure_wheelhouse() -> Path:
    """Download the hosts' wheels once on the controller (Python 3.10, manylinux).

    PyPI's responses are not cacheable through this machine's egress, so pip's shared HTTP cache
    stays empty and every host would download ~3 GB again; a wheelhouse in the folder the hosts
    mount makes the second and later installs local. Purely a test-speed fixture. The marker is
    named by the list's hash (testhosts.ensure_wheelhouse), so a new trainer pin is fetched too.
    """
    return testhosts.ensure_wheelhouse(tuple(wheelhouse_requirements()))


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
        "trainer_run_pip_extra_args": f"--find-links {HOST_WHEELHOUSE}",
    }
