"""Backends bind instances to real hosts; the state file survives restarts; the CLI serves."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests
from emulator_helpers import PROJECT, ZONE, Client, eventually, l4_body, small_body

from forja_sandbox.compute_emulator import ComputeEmulator


class RecordingBackend:
    """Stands in for the sandbox's host pool: records calls and the thread they ran on."""

    def __init__(self, address: str = "10.213.0.20", boot_s: float = 0.0, fail_on: str = "") -> None:
        self.address = address
        self.boot_s = boot_s
        self.fail_on = fail_on
        self.calls: list[tuple[str, str, str]] = []

    def _record(self, what: str, instance: dict[str, Any]) -> None:
        self.calls.append((what, instance["name"], threading.current_thread().name))
        if what == self.fail_on:
            raise RuntimeError(f"host pool refused to {what}")

    def create(self, instance: dict[str, Any]) -> str | None:
        self._record("create", instance)
        time.sleep(self.boot_s)
        return self.address

    def start(self, instance: dict[str, Any]) -> str | None:
        self._record("start", instance)
        return self.address

    def stop(self, instance: dict[str, Any]) -> None:
        self._record("stop", instance)

    def delete(self, instance: dict[str, Any]) -> None:
        self._record("delete", instance)


def test_the_backend_runs_on_operation_workers_and_its_address_is_published(
    emu: ComputeEmulator, client: Client
) -> None:
    backend = RecordingBackend()
    emu.backend = backend
    client.insert(l4_body())
    nic = client.ok(client.get(f"zones/{ZONE}/instances/l4-vm-1"))["networkInterfaces"][0]
    assert nic["networkIP"] == nic["accessConfigs"][0]["natIP"] == "10.213.0.20"
    for verb in ("stop", "start"):
        client.wait(client.ok(client.post(f"zones/{ZONE}/instances/l4-vm-1/{verb}")))
    client.wait(client.ok(client.delete(f"zones/{ZONE}/instances/l4-vm-1")))
    assert [(what, name) for what, name, _thread in backend.calls] == [
        ("create", "l4-vm-1"),
        ("stop", "l4-vm-1"),
        ("start", "l4-vm-1"),
        ("delete", "l4-vm-1"),
    ]
    assert all(thread.startswith("op-operation-") for _what, _name, thread in backend.calls)


def test_a_slow_boot_keeps_the_operation_running(emu: ComputeEmulator, client: Client) -> None:
    emu.backend = RecordingBackend(boot_s=0.5)
    op = client.ok(client.post(f"zones/{ZONE}/instances", small_body("slowboot")))
    eventually(lambda: client.ok(client.get(op["selfLink"]))["status"] == "RUNNING")
    assert client.ok(client.get(f"zones/{ZONE}/instances/slowboot"))["status"] == "STAGING"
    assert client.wait(op)["status"] == "DONE"


def test_a_backend_failure_ends_the_operation_with_an_error(emu: ComputeEmulator, client: Client) -> None:
    emu.backend = RecordingBackend(fail_on="create")
    done = client.insert(small_body("broken"))
    assert done["status"] == "DONE"
    assert "host pool refused to create" in done["error"]["errors"][0]["message"]
    assert client.get(f"zones/{ZONE}/instances/broken").status_code == 404


def test_preempting_a_spot_instance_stops_it_and_records_a_system_operation(
    emu: ComputeEmulator, client: Client
) -> None:
    client.insert(l4_body(scheduling={"provisioningModel": "SPOT", "onHostMaintenance": "TERMINATE"}))
    op = emu.preempt(PROJECT, ZONE, "l4-vm-1")
    assert op["operationType"] == "compute.instances.preempted" and op["status"] == "DONE"
    vm = client.ok(client.get(f"zones/{ZONE}/instances/l4-vm-1"))
    assert vm["status"] == "TERMINATED" and vm["lastStopTimestamp"]
    listed = client.ok(
        client.get(f"zones/{ZONE}/operations", filter="operationType = compute.instances.preempted")
    )
    assert [o["name"] for o in listed["items"]] == [op["name"]]


def test_a_simulated_maintenance_event_preempts_a_spot_vm_through_the_api(
    emu: ComputeEmulator, client: Client
) -> None:
    backend = RecordingBackend()
    emu.backend = backend
    client.insert(l4_body(scheduling={"provisioningModel": "SPOT", "onHostMaintenance": "TERMINATE"}))
    done = client.wait(client.ok(client.post(f"zones/{ZONE}/instances/l4-vm-1/simulateMaintenanceEvent")))
    assert done["operationType"] == "simulateMaintenanceEvent" and "error" not in done
    vm = client.ok(client.get(f"zones/{ZONE}/instances/l4-vm-1"))
    assert vm["status"] == "TERMINATED"
    assert "natIP" not in vm["networkInterfaces"][0]["accessConfigs"][0]
    preempted = client.ok(client.get(f"zones/{ZONE}/operations",
                                     filter="operationType = compute.instances.preempted"))["items"]
    assert [o["targetId"] for o in preempted] == [vm["id"]]
    assert [what for what, _name, _thread in backend.calls] == ["create", "stop"]
    # a second event on the stopped VM is refused, as on GCE, and changes nothing
    again = client.wait(client.ok(client.post(f"zones/{ZONE}/instances/l4-vm-1/simulateMaintenanceEvent")))
    assert again["error"]["errors"][0]["code"] == "UNSUPPORTED_OPERATION"
    assert [what for what, _name, _thread in backend.calls] == ["create", "stop"]


def test_a_simulated_maintenance_event_restarts_a_standard_gpu_vm(
    emu: ComputeEmulator, client: Client
) -> None:
    backend = RecordingBackend()
    emu.backend = backend
    client.insert(l4_body(scheduling={"onHostMaintenance": "TERMINATE", "automaticRestart": True}))
    first = client.ok(client.get(f"zones/{ZONE}/instances/l4-vm-1"))["lastStartTimestamp"]
    client.wait(client.ok(client.post(f"zones/{ZONE}/instances/l4-vm-1/simulateMaintenanceEvent")))
    vm = client.ok(client.get(f"zones/{ZONE}/instances/l4-vm-1"))
    assert vm["status"] == "RUNNING" and vm["lastStartTimestamp"] >= first and vm["lastStopTimestamp"]
    assert [what for what, _name, _thread in backend.calls] == ["create", "stop", "start"]


def test_a_guest_that_powers_off_becomes_terminated(emu: ComputeEmulator, client: Client) -> None:
    client.insert(small_body("selfstop"))
    (running,) = emu.instances_with_status("RUNNING")
    assert emu.guest_powered_off(running) is True
    assert client.ok(client.get(f"zones/{ZONE}/instances/selfstop"))["status"] == "TERMINATED"
    assert emu.instances_with_status("RUNNING") == []


def test_the_state_file_keeps_instances_firewalls_and_keys_across_restarts(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    with ComputeEmulator(state_file=state) as first:
        key_file = first.write_service_account_key(tmp_path / "sa.json")
        client = Client(first, first.issue_token())
        client.insert(small_body("keeper"))
        client.wait(
            client.ok(client.post("global/firewalls", {"name": "fw", "allowed": [{"IPProtocol": "icmp"}]}))
        )
        token = client.session.headers["Authorization"]
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    with ComputeEmulator(state_file=state) as second:
        again = Client(second, None)
        again.session.headers["Authorization"] = token  # tokens survive too: clients need not re-auth
        vm = again.ok(again.get(f"zones/{ZONE}/instances/keeper"))
        assert vm["status"] == "RUNNING"
        assert vm["selfLink"].startswith(second.base_url)  # URLs follow the new port
        assert again.ok(again.get("global/firewalls/fw"))["name"] == "fw"
        key = json.loads(key_file.read_text())
        assert key["private_key_id"] in second.store.keyring.keys


def test_the_standalone_server_prints_its_url_serves_and_saves_on_sigterm(tmp_path: Path) -> None:
    state, key = tmp_path / "state.json", tmp_path / "key.json"
    command = [sys.executable, "-m", "forja_sandbox.compute_emulator", "--port", "0", "--state", str(state)]
    process = subprocess.Popen([*command, "--key-out", str(key)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/compute/v1/")
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert json.loads(key.read_text())["token_uri"] == base_url.replace("/compute/v1/", "/token")
        assert requests.get(f"{base_url}projects/{PROJECT}/zones", timeout=10).status_code == 401
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    assert json.loads(state.read_text())["auth"]["keys"]
    assert os.access(state, os.R_OK)


def test_preempting_a_spot_instance_with_action_delete_removes_it(
    emu: ComputeEmulator, client: Client
) -> None:
    scheduling = {
        "provisioningModel": "SPOT",
        "onHostMaintenance": "TERMINATE",
        "instanceTerminationAction": "DELETE",
    }
    client.insert(l4_body(scheduling=scheduling))
    emu.preempt(PROJECT, ZONE, "l4-vm-1")
    assert client.get(f"zones/{ZONE}/instances/l4-vm-1").status_code == 404


def test_old_finished_operations_are_forgotten_to_bound_memory(
    emu: ComputeEmulator, client: Client, monkeypatch: Any
) -> None:
    from forja_sandbox.compute_emulator import operations

    monkeypatch.setattr(operations, "MAX_OPERATIONS", 10)
    client.insert(small_body("busy"))
    for _ in range(12):
        client.wait(client.ok(client.post(f"zones/{ZONE}/instances/busy/stop")))
    assert len(emu.store.operations) <= 10
