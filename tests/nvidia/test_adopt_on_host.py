"""nvidia_stack on a host whose image brought its own driver, as a Deep Learning VM does.

The molecule scenario covers the install path (on th2); this covers the other two decisions on a
real test host (th48): a 570 driver installed outside apt is adopted as it is (nothing installed over
it, pins and report still done, a second run changes nothing), and a driver of another branch
is refused with the variable to set, leaving /etc/apt untouched. The "image" is made of the
files such a driver leaves (the NVML library carrying its version, a CUDA toolkit's
version.json, the DLVM marker folder); the host has no GPU, which the role is told to accept.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from forja_sandbox import testhosts

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
INDEX = 48  # its own host: the molecule scenario (th2) may run at the same time
LIB = "/usr/lib/x86_64-linux-gnu"
APT_STATE = ("ls -la --time-style=full-iso /etc/apt/sources.list.d /etc/apt/preferences.d "
             "/etc/apt/apt.conf.d; dpkg-query -W")


@pytest.fixture(scope="module")
def host() -> Iterator[testhosts.Host]:
    testhosts.down(INDEX)
    yield testhosts.up(INDEX)
    testhosts.down(INDEX)


def ssh(host: testhosts.Host, script: str) -> str:
    return host.run_as_root(script)


def image_driver(host: testhosts.Host, version: str) -> None:
    """Leave what an image's own (runfile) driver and CUDA 12.8 leave, outside dpkg."""
    ssh(host, f"""set -e
mkdir -p /opt/deeplearning /usr/local/cuda-12.8
rm -f {LIB}/libnvidia-ml.so.*
touch {LIB}/libnvidia-ml.so.{version}
ln -sf libnvidia-ml.so.{version} {LIB}/libnvidia-ml.so.1
echo '{{"cuda": {{"name": "CUDA SDK", "version": "12.8.93"}}}}' > /usr/local/cuda-12.8/version.json
""")


def apply_role(host: testhosts.Host, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    facts_file = tmp_path / "facts.json"
    playbook = tmp_path / "play.yml"
    playbook.write_text(f"""
- hosts: all
  become: true
  vars:
    nvidia_stack_allow_no_gpu: true
  roles:
    - forja.gpu.nvidia_stack
  post_tasks:
    - ansible.builtin.copy:
        content: "{{{{ nvidia_stack_facts | to_json }}}}"
        dest: {facts_file}
        mode: "0600"
      delegate_to: localhost
      become: false
      changed_when: false  # the test's own record, not a change on the host
""")
    inventory = tmp_path / "hosts"
    inventory.write_text(
        f"th{INDEX} ansible_host={host.address} ansible_user={host.user} "
        f"ansible_ssh_private_key_file={host.key} "
        "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'\n")
    facts_file.unlink(missing_ok=True)
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory),
                           str(playbook)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")), check=False)
    facts = json.loads(facts_file.read_text()) if facts_file.exists() else {}
    return proc, facts


def changed(stdout: str) -> int:
    return int(re.search(r"changed=(\d+)", stdout.split("PLAY RECAP", 1)[1]).group(1))


def test_an_image_driver_of_the_branch_is_adopted_as_it_is(host, tmp_path):
    image_driver(host, "570.133.20")
    first, facts = apply_role(host, tmp_path)
    assert first.returncode == 0, first.stdout[-4000:]
    assert "Adopting the driver of the image, 570.133.20" in first.stdout
    assert {k: facts[k] for k in ("source", "driver_version", "cuda_version", "gpu_present", "pinned")} == {
        "source": "dlvm", "driver_version": "570.133.20", "cuda_version": "12.8", "gpu_present": False,
        "pinned": True}
    assert ssh(host, "dpkg-query -W -f='${Package}\\n' | grep -E '^(nvidia|libnvidia|cuda)-' || true") == ""
    assert "Pin: version 570.*" in ssh(host, "cat /etc/apt/preferences.d/forja-nvidia-stack.pref")
    assert ssh(host, "ls /etc/apt/sources.list.d") == ""  # no repository added for an adopted driver
    assert ssh(host, "test -e /run/forja/nvidia-stack-reboot-required && echo pending || true") == ""

    second, _ = apply_role(host, tmp_path)
    assert second.returncode == 0 and changed(second.stdout) == 0, second.stdout[-4000:]


def test_a_driver_of_another_branch_is_refused_and_nothing_changes(host, tmp_path):
    image_driver(host, "580.95.05")
    before = ssh(host, APT_STATE)
    proc, facts = apply_role(host, tmp_path)
    assert proc.returncode != 0 and facts == {}
    assert re.search(r'Set nvidia_stack_driver_branch: \\?"580\\?"', proc.stdout), proc.stdout[-3000:]
    assert ssh(host, APT_STATE) == before


def simulate(host: testhosts.Host, tmp_path: Path) -> dict:
    """One nvidia_facts call with the upgrade simulation, as the role makes it; its result."""
    inventory = tmp_path / "hosts"
    inventory.write_text(
        f"th{INDEX} ansible_host={host.address} ansible_user={host.user} "
        f"ansible_ssh_private_key_file={host.key} "
        "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'\n")
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible")), "-i", str(inventory), "all", "-b",
                           "-m", "forja.gpu.nvidia_facts", "-a", "simulate_upgrade=true pinned_branch=570",
                           "-o"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")), check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout.split("=>", 1)[1])


def test_the_upgrade_simulation_is_reused_only_while_apt_inputs_are_unchanged(host, tmp_path):
    first = simulate(host, tmp_path)
    again = simulate(host, tmp_path)
    assert again["upgrade_simulation_cached"] is True
    assert again["upgrade_moves"] == first["upgrade_moves"]
    # Drift in anything apt reads (here a new apt.conf snippet; a pin file or the dpkg status alike)
    # makes the next call simulate again.
    ssh(host, "echo 'APT::Get::Show-Versions \"true\";' > /etc/apt/apt.conf.d/99forja-test")
    try:
        assert simulate(host, tmp_path)["upgrade_simulation_cached"] is False
        assert simulate(host, tmp_path)["upgrade_simulation_cached"] is True
    finally:
        ssh(host, "rm -f /etc/apt/apt.conf.d/99forja-test")
    assert simulate(host, tmp_path)["upgrade_simulation_cached"] is False
