"""What a managed run's watcher sees: gcp_gpu_instance_info and playbooks/observe.yml against the emulator.

A preemption is told apart from a stop by the user only through the zone's
`compute.instances.preempted` operations; these tests take the VM away the way Google does.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from gcp_helpers import emulator_env, role_vm, run_module_tasks

from forja.api import Forja
from forja.history import History

PROJECT = "forja-sandbox"
SPOT = {"forja.gpu.gcp_gpu_instance": {"name": "forja-l4", **role_vm(), "spot": True, "state": "present"}}


def info(**options):
    return {"forja.gpu.gcp_gpu_instance_info": {"name": "forja-l4", "zone": "us-east1-d", **options}}


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
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


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
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


def _forja(tmp_path: Path, inventory: Path) -> Forja:
    return Forja(tmp_path, inventory=inventory, private_data_dir=tmp_path / "runner",
                 history=History(tmp_path / "history.sqlite"))


def test_a_watcher_of_an_on_demand_vm_says_what_it_watches_and_leaves_a_vm_its_user_stopped(
    emulator, gcp_env, tmp_path, monkeypatch
):
    """The watcher's whole loop (observe.yml through ansible-runner, the lock, the policy) with a VM
    and no host: an on-demand VM stopped by its user is not brought back."""
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    (tmp_path / "made").mkdir()
    on_demand = {"forja.gpu.gcp_gpu_instance": {"name": "forja-l4", **role_vm(), "state": "stopped",
                                                "create_if_missing": True}}
    run_module_tasks(tmp_path / "made", dict(os.environ), [on_demand])
    said: list[str] = []
    forja = _forja(tmp_path, gcp_env)
    why = forja.watch("digits-1", fallback_zones=["us-east1-b"], poll_s=0.1, say=said.append)
    assert "stopped (TERMINATED) by its user" in why
    assert any("on-demand, so Google does not preempt it" in line for line in said), said


def test_a_watcher_whose_budget_is_spent_gives_up_saying_why_and_records_it(emulator, gcp_env, tmp_path,
                                                                          monkeypatch):
    from forja.managed import RecoveryBudget, Tally, WatchError, start_state

    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    (tmp_path / "made").mkdir()
    run_module_tasks(tmp_path / "made", dict(os.environ), [SPOT])
    emulator.preempt(PROJECT, "us-east1-d", "forja-l4")
    forja = _forja(tmp_path, gcp_env)
    forja.history.start("digits-1", name="digits-1")
    kept = start_state("digits-1", ["us-east1-d", "us-east1-b"])
    kept.tally = Tally(down_s=3000.0, down_since=time.time() - 700)  # down for most of an hour already
    kept.save()
    with pytest.raises(WatchError, match=r"gave up on run digits-1: down 1h 0\dm in all.*--max-down 1h 00m"):
        forja.watch("digits-1", fallback_zones=["us-east1-b"], budget=RecoveryBudget(max_down_s=3600),
                    poll_s=0.1, say=lambda line: None)
    (gave_up,) = [e for e in forja.history.events("digits-1") if e.kind == "gave_up"]
    assert "--max-down 1h 00m" in gave_up.data["reason"] and gave_up.data["seconds_down"] > 3600
    assert emulator.instance(PROJECT, "us-east1-d", "forja-l4")["status"] == "TERMINATED"  # left as it is


def test_a_run_that_spent_its_budget_is_refused_and_bad_managed_input_sends_nothing(
    emulator, gcp_env, tmp_path, monkeypatch
):
    from forja import errors
    from forja.managed import RecoveryBudget, Tally, WatchError, start_state

    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    (tmp_path / "made").mkdir()
    run_module_tasks(tmp_path / "made", dict(os.environ), [SPOT])
    forja = _forja(tmp_path, gcp_env)
    kept = start_state("digits-1", ["us-east1-d", "us-east1-b"])
    kept.tally = Tally(down_usd=5.0)
    kept.save()
    with pytest.raises(WatchError, match=r"digits-1 has spent its budget already: \$5.00 spent while down"):
        forja.watch("digits-1", fallback_zones=["us-east1-b"], budget=RecoveryBudget(max_down_usd=5.0),
                    say=print)
    spent = RecoveryBudget(max_down_usd=0.0)
    for bad, field in (({"fallback_zones": []}, "--fallback-zone"),
                       ({"fallback_zones": ["us-east1-b"], "budget": spent}, "--max-down-usd")):
        with pytest.raises(errors.ConfigError) as caught:
            forja.train_managed("trainer/configs/digits.yaml", **bad)
        assert caught.value.field == field
    assert forja.history.list() == []  # nothing was sent
