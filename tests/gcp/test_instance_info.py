"""What a managed run's watcher sees: gcp_gpu_instance_info and playbooks/observe.yml against the emulator.

A preemption is told apart from a stop by the user only through the zone's
`compute.instances.preempted` operations; these tests take the VM away the way Google does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from gcp_helpers import emulator_env, role_vm, run_module_tasks

from forja.api import Forja
from forja.history import History

PROJECT = "forja-sandbox"
SPOT = {"forja.gpu.gcp_gpu_instance": {"name": "forja-l4", **role_vm(), "spot": True, "state": "present"}}


def info(**options):
    return {"forja.gpu.gcp_gpu_instance_info": {"name": "forja-l4", "zone": "us-east1-d", **options}}


def test_info_tells_a_preemption_from_a_stop_and_finds_the_vm_elsewhere(emulator, key_file, tmp_path):
    env = emulator_env(emulator, key_file)
    for step in ("made", "after"):
        (tmp_path / step).mkdir()
    made = run_module_tasks(tmp_path / "made", env,
                            [{**SPOT, "register": "made"}, {**info(), "register": "up"}])
    assert made["made"]["instance"]["status"] == "RUNNING"
    assert made["up"]["exists"] and made["up"]["preempted_at"] == "" and made["up"]["preemptions"] == []
    assert made["up"]["changed"] is False
    emulator.preempt(PROJECT, "us-east1-d", "forja-l4")
    stop = {"forja.gpu.gcp_gpu_instance": {"name": "forja-l4", "zone": "us-east1-d", "state": "stopped"}}
    start = {"forja.gpu.gcp_gpu_instance": {"name": "forja-l4", "zone": "us-east1-d", "state": "started"}}
    results = run_module_tasks(
        tmp_path / "after",
        env,
        [
            {**info(), "register": "preempted"},
            {**info(zone="us-east1-b", fallback_zones=["us-central1-a", "us-east1-d"]),
             "register": "elsewhere"},
            {**start, "register": "started"},
            {**stop, "register": "stopped"},
            {**info(), "register": "stopped_by_user"},
            {**info(name="forja-nowhere"), "register": "missing"},
            {**info(project="no-such-project"), "register": "wrong_project"},
        ],
    )
    preempted = results["preempted"]
    assert preempted["instance"]["status"] == "TERMINATED" and preempted["preempted_at"]
    assert preempted["preemptions"] == [preempted["preempted_at"]]
    assert results["elsewhere"]["zone"] == "us-east1-d" and results["elsewhere"]["preempted_at"]
    # stopped by its user after a restart: not preempted now, though the old preemption is still listed
    assert results["stopped_by_user"]["instance"]["status"] == "TERMINATED"
    assert results["stopped_by_user"]["preempted_at"] == ""
    assert results["stopped_by_user"]["preemptions"] == preempted["preemptions"]
    assert results["missing"]["exists"] is False and results["missing"]["zone"] == ""
    assert results["wrong_project"]["failed"] and "no-such-project" in results["wrong_project"]["msg"]


@pytest.fixture
def gcp_env(emulator, key_file, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process's environment pointed at the emulator, as ansible-runner passes it on; an inventory
    with only localhost (observe.yml runs there)."""
    for name, value in emulator_env(emulator, key_file).items():
        monkeypatch.setenv(name, value)
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    return inventory


def test_observe_publishes_the_vm_through_the_data_contract(emulator, gcp_env, tmp_path):
    """Forja.observe runs playbooks/observe.yml through ansible-runner and reads contract.InstanceState."""
    forja = Forja(tmp_path, inventory=gcp_env, private_data_dir=tmp_path / "runner",
                  history=History(tmp_path / "history.sqlite"))
    assert forja.observe() == {"forja-l4": forja.observe()["forja-l4"]}
    absent = forja.observe()["forja-l4"]
    assert absent.exists is False and absent.running is False
    (tmp_path / "made").mkdir()
    run_module_tasks(tmp_path / "made", dict(os.environ), [SPOT])
    up = forja.observe()["forja-l4"]
    assert up.running and up.spot and up.zone == "us-east1-d" and up.boot_disk_size_gb == 300
    emulator.preempt(PROJECT, "us-east1-d", "forja-l4")
    down = forja.observe({"gcp_instance_zone": "us-east1-b", "gcp_instance_fallback_zones": ["us-east1-d"]})
    vm = down["forja-l4"]
    assert vm.exists and vm.status == "TERMINATED" and vm.zone == "us-east1-d"
    assert vm.preempted_at and vm.preemptions == [vm.preempted_at]
