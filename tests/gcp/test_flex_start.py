"""Flex-start VMs (provisioningModel FLEX_START): the request Google's own client sends is accepted,
waits PENDING for capacity, runs with an end time and ends at its max run duration; what Google
refuses is refused; forja's module queues the request and returns while it waits.

Google's rules, as the emulator states them (forja_sandbox/compute_emulator/catalog.py): the A2,
A3, A4, G2 and H4D series only, a max run duration of at most 7 days, a request that waits at most
2 hours, no reservation, no automatic restart.
"""

from __future__ import annotations

import time
from pathlib import Path

import google.api_core.exceptions
import pytest
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import instance_facts
from gcp_helpers import emulator_env, role_vm, run_module_tasks
from google.cloud import compute_v1
from google.oauth2 import service_account
from test_google_clients import PROJECT, VM, ZONE, GoogleCloudCompute, l4_instance

pytestmark = pytest.mark.usefixtures("only_googles_background_lookup_left_the_machine")


def flex_instance(name: str, run_s: int, wait_s: int = 600, machine_type: str = "") -> compute_v1.Instance:
    """forja's VM as Google's "Create a Flex-start VM" asks for it, in the client's own types."""
    instance = l4_instance(name)
    if machine_type:
        instance.machine_type = f"zones/{ZONE}/machineTypes/{machine_type}"
    instance.scheduling = compute_v1.Scheduling(
        provisioning_model="FLEX_START",
        max_run_duration=compute_v1.Duration(seconds=run_s),
        instance_termination_action="DELETE",
        on_host_maintenance="TERMINATE",
        automatic_restart=False,
    )
    instance.reservation_affinity = compute_v1.ReservationAffinity(consume_reservation_type="NO_RESERVATION")
    wait = compute_v1.Duration(seconds=wait_s)
    instance.params = compute_v1.InstanceParams(request_valid_for_duration=wait)
    return instance


@pytest.fixture
def gcc(emulator, key_file: Path) -> GoogleCloudCompute:
    return GoogleCloudCompute(emulator, service_account.Credentials.from_service_account_file(str(key_file)))


def until(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("the condition never held")


def status_of(gcc: GoogleCloudCompute, name: str) -> str:
    try:
        return gcc.get(name).status
    except google.api_core.exceptions.NotFound:
        return "GONE"


def test_googles_client_queues_a_flex_start_vm_that_runs_then_ends_at_its_max_run_duration(emulator, gcc):
    # queued 3 s: the two looks below fit in it (after 1 s, a loaded machine once saw it RUNNING)
    emulator.configure_project(PROJECT, flex_start_wait_s=3.0)
    vm = flex_instance("flex", run_s=3)
    insert = gcc.instances.insert(project=PROJECT, zone=ZONE, instance_resource=vm)
    assert status_of(gcc, "flex") == "PENDING"  # queued for capacity; the insert still runs
    assert gcc.operations.get(project=PROJECT, zone=ZONE, operation=insert.name).status != (
        compute_v1.Operation.Status.DONE
    )
    gcc.wait(insert)
    vm = gcc.get("flex")
    assert vm.status == "RUNNING"
    assert vm.scheduling.provisioning_model == "FLEX_START" and vm.scheduling.max_run_duration.seconds == 3
    assert vm.reservation_affinity.consume_reservation_type == "NO_RESERVATION"
    ends = vm.resource_status.scheduling.termination_timestamp
    assert ends > vm.last_start_timestamp  # both RFC 3339 in UTC
    until(lambda: status_of(gcc, "flex") == "GONE")  # DELETE at the end of its run
    assert emulator.instances(PROJECT) == []


def test_a_flex_start_request_without_capacity_in_time_fails_and_leaves_nothing(emulator, gcc):
    emulator.configure_project(PROJECT, flex_start_wait_s=2.0)
    insert = gcc.instances.insert(
        project=PROJECT, zone=ZONE, instance_resource=flex_instance("late", run_s=3600, wait_s=1)
    )
    for _ in range(20):
        done = gcc.operations.wait(project=PROJECT, zone=ZONE, operation=insert.name)
        if done.status == compute_v1.Operation.Status.DONE:
            break
    assert done.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert status_of(gcc, "late") == "GONE"


def test_deleting_a_pending_request_withdraws_it(emulator, gcc):
    emulator.configure_project(PROJECT, flex_start_wait_s=60.0)
    gcc.instances.insert(project=PROJECT, zone=ZONE, instance_resource=flex_instance("queued", run_s=3600))
    assert status_of(gcc, "queued") == "PENDING"
    gcc.wait(gcc.instances.delete(project=PROJECT, zone=ZONE, instance="queued"))
    assert status_of(gcc, "queued") == "GONE"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"machine_type": "n1-standard-8"}, "is not supported with the FLEX_START provisioning model"),
        ({"run_s": 7 * 24 * 3600 + 1}, "at most 604800 seconds"),
        ({"wait_s": 2 * 3600 + 1}, "can wait at most 7200 seconds"),
    ],
)
def test_what_google_refuses_for_flex_start_is_refused(emulator, gcc, change, says):
    instance = flex_instance("refused", **{"run_s": 3600, **change})
    with pytest.raises(google.api_core.exceptions.BadRequest, match=says):
        gcc.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance)
    assert emulator.instances(PROJECT) == []


def test_a_flex_start_vm_needs_its_max_run_duration_and_no_reservation(emulator, gcc):
    no_end = flex_instance("no-end", run_s=3600)
    no_end.scheduling = compute_v1.Scheduling(
        provisioning_model="FLEX_START", instance_termination_action="DELETE", on_host_maintenance="TERMINATE"
    )
    with pytest.raises(google.api_core.exceptions.BadRequest, match="maxRunDuration"):
        gcc.instances.insert(project=PROJECT, zone=ZONE, instance_resource=no_end)
    reserved = flex_instance("reserved", run_s=3600)
    reserved.reservation_affinity = compute_v1.ReservationAffinity(consume_reservation_type="ANY_RESERVATION")
    with pytest.raises(google.api_core.exceptions.BadRequest, match="NO_RESERVATION"):
        gcc.instances.insert(project=PROJECT, zone=ZONE, instance_resource=reserved)


def test_the_module_queues_a_flex_start_vm_and_returns_while_it_waits(emulator, key_file, tmp_path):
    """forja's request is the one Google documents; the module reports it PENDING instead of blocking,
    a second run leaves the queued request alone, and once it runs the facts carry its end."""
    emulator.configure_project(PROJECT, flex_start_wait_s=2.5)
    vm = {"name": "forja-flex", **role_vm(), "provisioning_model": "flex_start", "max_run_duration": "2h",
          "request_valid_for_duration": "30m"}
    module = "forja.gpu.gcp_gpu_instance"
    results = run_module_tasks(tmp_path, emulator_env(emulator, key_file), [
        {module: vm, "register": "queued"},
        {module: {**vm, "state": "started"}, "register": "again"},
    ])
    queued, again = results["queued"], results["again"]
    assert queued["changed"] and queued["pending"] and queued["instance"]["status"] == "PENDING"
    assert queued["instance"]["provisioning_model"] == "FLEX_START"
    assert queued["instance"]["instance_termination_action"] == "DELETE"
    assert queued["instance"]["max_run_duration_s"] == 7200
    assert again["actions"] == [] and again["pending"]  # not started: it starts when Google has room
    stored = emulator.instances(PROJECT)[0]
    assert stored["scheduling"]["maxRunDuration"] == {"seconds": "7200"}
    assert stored["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}

    until(lambda: emulator.instances(PROJECT)[0]["status"] == "RUNNING", timeout_s=15)
    ran = instance_facts(emulator.instances(PROJECT)[0])  # what the module and the inventory report
    assert ran["ends_at"] > ran["last_start_timestamp"] and ran["max_run_duration_s"] == 7200
    assert VM["gcp_instance_machine_type"] == ran["machine_type"]


@pytest.mark.slow  # an ansible-playbook run of the whole role plus a 3 s wait: the host tier, not make check
def test_the_role_waits_for_a_flex_start_vm_with_progress_and_publishes_it_running(
    emulator, key_file, tmp_path
):
    """gcp_instance with gcp_instance_provisioning_model=flex_start: each look at the queued request
    prints a progress line, and the facts the next plays read are those of the running VM."""
    import subprocess

    from gcp_helpers import REPO

    emulator.configure_project(PROJECT, flex_start_wait_s=3.0)
    playbook = tmp_path / "flex.yml"
    playbook.write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n"
        "  roles:\n    - role: forja.gpu.gcp_instance\n"
        "      vars:\n        gcp_instance_create_if_missing: true\n"
        "  tasks:\n    - name: Show the facts\n      ansible.builtin.debug:\n"
        "        msg: \"FACTS {{ gcp_instance_facts.status }} {{ gcp_instance_facts.ends_at }}\"\n"
    )
    extra = {"gcp_instance_provisioning_model": "flex_start", "gcp_instance_max_run_duration": "3d",
             "gcp_instance_flex_start_poll_s": 1, "gcp_instance_check": False,
             "gcp_instance_wait_for_ssh": False,
             "gcp_instance_ssh_key_file": "", "ansible_python_interpreter": str(REPO / ".venv/bin/python")}
    import json
    proc = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", str(playbook),
         "-e", json.dumps(extra)],
        cwd=REPO, env=emulator_env(emulator, key_file), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "FAILED - RETRYING: [localhost]: Wait while Google finds capacity" in proc.stdout, proc.stdout
    shown = proc.stdout.split("FACTS ", 1)[1].split('"', 1)[0].split()
    assert shown[0] == "RUNNING" and shown[1].startswith("20"), proc.stdout[-2000:]
    vm = emulator.instance(PROJECT, ZONE, "forja-l4")
    assert vm["scheduling"]["provisioningModel"] == "FLEX_START"
    assert vm["scheduling"]["maxRunDuration"] == {"seconds": str(3 * 86400)}


def test_the_wait_knob_is_set_over_http_for_a_sandbox_of_another_process(emulator) -> None:
    import requests

    url = f"{emulator.url}/emulator/v1/projects/{PROJECT}"
    answer = requests.put(url, json={"flex_start_wait_s": 30}, timeout=10)
    assert answer.status_code == 200 and answer.json()["flex_start_wait_s"] == 30.0
    for bad in (-1, "soon", True, 8000):
        assert requests.put(url, json={"flex_start_wait_s": bad}, timeout=10).status_code == 400, bad
    assert emulator.project_settings(PROJECT)["flex_start_wait_s"] == 30.0
