"""playbooks/provision.yml and teardown.yml against the emulator, with the repo's group_vars.

The inventory is a folder like the user's: a gcp_gpu.yml source plus inventory/group_vars copied
from the repo, so these runs also prove the group_vars reproduce the user's VM.
"""

from __future__ import annotations

import re
import shutil

import pytest
from gcp_helpers import REPO, emulator_env, run_playbook

PROJECT = "forja-sandbox"


@pytest.fixture
def inventory_dir(tmp_path):
    folder = tmp_path / "inventory"
    folder.mkdir()
    (folder / "forja.gcp_gpu.yml").write_text("plugin: forja.gpu.gcp_gpu\n")
    shutil.copytree(REPO / "inventory" / "group_vars", folder / "group_vars")
    return folder


def play(env, inventory_dir, playbook, *extra):
    proc = run_playbook(env, inventory_dir, playbook, *extra)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    recap = dict(re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", proc.stdout, re.M))
    return {host: int(changed) for host, changed in recap.items()}, proc.stdout


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_provision_then_teardown_stop_then_delete(emulator, key_file, inventory_dir, tmp_path):
    env = emulator_env(emulator, key_file)
    ssh_key = tmp_path / "keys" / "id_forja"
    no_ssh = ("-e", "gcp_instance_wait_for_ssh=false", "-e", f"gcp_instance_ssh_key_file={ssh_key}")

    changed, out = play(env, inventory_dir, "playbooks/provision.yml", *no_ssh)
    assert changed["localhost"] == 3, out  # the firewall rule, the SSH key the user lacked, the VM
    assert ssh_key.stat().st_mode & 0o777 == 0o600 and ssh_key.parent.stat().st_mode & 0o777 == 0o700
    public = ssh_key.with_suffix(".pub").read_text().strip()
    assert "PRIVATE" not in out and public.split()[1] not in out, "the key is never shown"
    assert "forja-l4" in changed, "refresh_inventory must bring the new VM into the second play"
    vm = emulator.instance(PROJECT, "us-east1-d", "forja-l4")
    assert vm["status"] == "RUNNING" and vm["labels"]["forja"] == "managed"
    assert vm["machineType"].endswith("/g2-standard-8") and vm["tags"]["items"] == ["forja-ssh"]
    metadata = {i["key"]: i["value"] for i in vm["metadata"]["items"]}
    assert metadata["ssh-keys"] == f"ansible:{public}", "the key reaches the VM as Google's agent reads it"
    rule = emulator.store.firewalls[PROJECT]["forja-allow-ssh"]
    assert rule["sourceRanges"] == ["35.235.240.0/20"] and rule["allowed"] == [
        {"IPProtocol": "tcp", "ports": ["22"]}
    ]

    changed, out = play(env, inventory_dir, "playbooks/provision.yml", *no_ssh)
    assert set(changed.values()) == {0}, out

    changed, out = play(env, inventory_dir, "playbooks/teardown.yml",
                        "-e", f"gcp_instance_ssh_key_file={tmp_path / 'nokey' / 'id'}")
    assert not (tmp_path / "nokey").exists(), "stopping a VM creates no key"
    assert changed["localhost"] == 1, out
    assert emulator.instance(PROJECT, "us-east1-d", "forja-l4")["status"] == "TERMINATED"

    changed, out = play(env, inventory_dir, "playbooks/teardown.yml", "-e", "forja_teardown_delete=true")
    assert changed["localhost"] == 1, out
    assert emulator.instances(PROJECT) == []
