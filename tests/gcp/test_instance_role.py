"""The gcp_instance role as the playbooks run it: stopping a VM that is not there creates nothing.

teardown.yml stops the VM through the role (state stopped, no create_if_missing); before, a
misspelt name there created a 300 GB GPU VM and then stopped it.
"""

from __future__ import annotations

import subprocess

from gcp_helpers import REPO, emulator_env

PROJECT = "forja-sandbox"


def test_teardown_of_a_vm_that_does_not_exist_fails_naming_it_and_creates_nothing(
    emulator, key_file, tmp_path
):
    inventory = tmp_path / "forja.gcp_gpu.yml"
    inventory.write_text("plugin: forja.gpu.gcp_gpu\n")
    proc = subprocess.run(
        [
            str(REPO / ".venv/bin/ansible-playbook"),
            "-i",
            str(inventory),
            "playbooks/teardown.yml",
            "-e",
            "gcp_instance_name=forja-l4-typo",
        ],
        cwd=REPO,
        env=emulator_env(emulator, key_file),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0, proc.stdout[-3000:]
    expected = "no VM 'forja-l4-typo' in project 'forja-sandbox' (zone us-east1-d)"
    assert expected in proc.stdout, proc.stdout[-3000:]
    assert "gcp_instance_create_if_missing=true" in proc.stdout
    assert emulator.instances(PROJECT) == []
    assert "compute.instances.insert" not in emulator.stats["by_method"]
