"""Instances: Google's shapes, the status lifecycle through operations, and Google's errors."""

from __future__ import annotations

import ipaddress
import threading

from emulator_helpers import PROJECT, ZONE, Client, eventually, l4_body, small_body

from forja_sandbox.compute_emulator import ComputeEmulator

TEST_NETS = [
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "198.18.0.0/15")
]


def test_insert_returns_a_pending_zone_operation_with_googles_fields(
    emu: ComputeEmulator, client: Client
) -> None:
    emu.operation_delay_s = 0.05
    op = client.ok(client.post(f"zones/{ZONE}/instances", l4_body()))
    assert op["kind"] == "compute#operation"
    assert op["status"] == "PENDING"
    assert op["operationType"] == "insert"
    assert op["name"].startswith("operation-")
    assert op["id"].isdigit() and op["targetId"].isdigit()
    assert op["zone"] == f"{emu.base_url}projects/{PROJECT}/zones/{ZONE}"
    assert op["targetLink"] == f"{emu.base_url}projects/{PROJECT}/zones/{ZONE}/instances/l4-vm-1"
    assert op["selfLink"] == f"{emu.base_url}projects/{PROJECT}/zones/{ZONE}/operations/{op['name']}"
    done = client.wait(op)
    assert done["status"] == "DONE" and done["progress"] == 100 and "error" not in done
    assert done["insertTime"] <= done["startTime"] <= done["endTime"]


def test_a_created_instance_has_full_urls_string_int64s_and_server_defaults(
    emu: ComputeEmulator, client: Client
) -> None:
    client.insert(l4_body())
    vm = client.ok(client.get(f"zones/{ZONE}/instances/l4-vm-1"))
    zone_url = f"{emu.base_url}projects/{PROJECT}/zones/{ZONE}"
    assert vm["kind"] == "compute#instance"
    assert vm["status"] == "RUNNING"
    assert isinstance(vm["id"], str) and vm["id"].isdigit()
    assert vm["selfLink"] == f"{zone_url}/instances/l4-vm-1"
    assert vm["selfLink"].split("/")[6] == PROJECT  # where google.cloud's inventory finds the project
    assert vm["zone"] == zone_url
    assert vm["machineType"] == f"{zone_url}/machineTypes/g2-standard-8"
    assert vm["guestAccelerators"] == [
        {"acceleratorType": f"{zone_url}/acceleratorTypes/nvidia-l4", "acceleratorCount": 1}
    ]
    disk = vm["disks"][0]
    assert disk["diskSizeGb"] == "300" and disk["interface"] == "NVME" and disk["boot"] is True
    assert disk["deviceName"] == "persistent-disk-0" and disk["source"].endswith("/disks/l4-vm-1")
    assert vm["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": True,
        "provisioningModel": "STANDARD",
        "preemptible": False,
    }
    nic = vm["networkInterfaces"][0]
    assert nic["network"] == f"{emu.base_url}projects/{PROJECT}/global/networks/default"
    assert ipaddress.ip_address(nic["networkIP"]) in ipaddress.ip_network("10.142.0.0/20")
    nat_ip = ipaddress.ip_address(nic["accessConfigs"][0]["natIP"])
    assert any(nat_ip in net for net in TEST_NETS)
    assert vm["labels"] == {"managed-by": "forja"} and vm["labelFingerprint"]
    assert vm["metadata"]["items"] == [{"key": "install-nvidia-driver", "value": "True"}]
    assert vm["metadata"]["fingerprint"]
    assert vm["lastStartTimestamp"] >= vm["creationTimestamp"]


def test_spot_instances_get_the_server_filled_spot_defaults(client: Client) -> None:
    client.insert(l4_body(scheduling={"provisioningModel": "SPOT", "onHostMaintenance": "TERMINATE"}))
    scheduling = client.ok(client.get(f"zones/{ZONE}/instances/l4-vm-1"))["scheduling"]
    assert scheduling == {
        "provisioningModel": "SPOT",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
        "preemptible": True,
        "instanceTerminationAction": "STOP",
    }


def test_insert_walks_provisioning_staging_running_while_the_operation_runs(
    emu: ComputeEmulator, client: Client
) -> None:
    emu.operation_delay_s = 0.15
    seen: list[str] = []
    op = client.ok(client.post(f"zones/{ZONE}/instances", small_body("walker")))
    ops_seen = {op["status"]}
    while True:
        vm = client.get(f"zones/{ZONE}/instances/walker").json()
        if not seen or seen[-1] != vm["status"]:
            seen.append(vm["status"])
        current = client.ok(client.get(op["selfLink"]))
        ops_seen.add(current["status"])
        if current["status"] == "DONE" and vm["status"] == "RUNNING":
            break
    assert seen == ["PROVISIONING", "STAGING", "RUNNING"]
    assert ops_seen == {"PENDING", "RUNNING", "DONE"}


def test_stop_then_start_walks_the_lifecycle_and_records_timestamps(
    emu: ComputeEmulator, client: Client
) -> None:
    client.insert(small_body("cycler"))
    first = client.ok(client.get(f"zones/{ZONE}/instances/cycler"))
    emu.operation_delay_s = 0.1
    stop = client.ok(client.post(f"zones/{ZONE}/instances/cycler/stop"))
    assert stop["operationType"] == "stop"
    eventually(lambda: client.get(f"zones/{ZONE}/instances/cycler").json()["status"] == "STOPPING")
    client.wait(stop)
    stopped = client.ok(client.get(f"zones/{ZONE}/instances/cycler"))
    assert stopped["status"] == "TERMINATED"
    assert stopped["lastStopTimestamp"] >= first["lastStartTimestamp"]
    assert "natIP" not in stopped["networkInterfaces"][0]["accessConfigs"][0]  # ephemeral IP released
    start = client.ok(client.post(f"zones/{ZONE}/instances/cycler/start"))
    eventually(lambda: client.get(f"zones/{ZONE}/instances/cycler").json()["status"] == "STAGING")
    client.wait(start)
    started = client.ok(client.get(f"zones/{ZONE}/instances/cycler"))
    assert started["status"] == "RUNNING"
    assert started["lastStartTimestamp"] > first["lastStartTimestamp"]
    assert started["networkInterfaces"][0]["accessConfigs"][0]["natIP"]


def test_stopping_a_stopped_instance_is_a_successful_no_op(client: Client) -> None:
    client.insert(small_body("idle"))
    client.wait(client.ok(client.post(f"zones/{ZONE}/instances/idle/stop")))
    again = client.wait(client.ok(client.post(f"zones/{ZONE}/instances/idle/stop")))
    assert "error" not in again
    assert client.ok(client.get(f"zones/{ZONE}/instances/idle"))["status"] == "TERMINATED"


def test_delete_removes_the_instance_and_later_gets_are_404(client: Client) -> None:
    client.insert(small_body("doomed"))
    op = client.wait(client.ok(client.delete(f"zones/{ZONE}/instances/doomed")))
    assert op["operationType"] == "delete" and "error" not in op
    response = client.get(f"zones/{ZONE}/instances/doomed")
    assert response.status_code == 404
    error = response.json()["error"]
    assert (
        error["message"] == f"The resource 'projects/{PROJECT}/zones/{ZONE}/instances/doomed' was not found"
    )
    assert error["errors"][0] == {"message": error["message"], "domain": "global", "reason": "notFound"}
    assert error["status"] == "NOT_FOUND"


def test_inserting_an_existing_name_is_409_already_exists(client: Client) -> None:
    client.insert(small_body("twin"))
    response = client.post(f"zones/{ZONE}/instances", small_body("twin"))
    assert response.status_code == 409
    assert response.json()["error"]["errors"][0]["reason"] == "alreadyExists"


def test_the_same_request_id_returns_the_same_operation(client: Client) -> None:
    first = client.ok(client.post(f"zones/{ZONE}/instances", small_body("once"), requestId="4b1c6c7e-1"))
    second = client.ok(client.post(f"zones/{ZONE}/instances", small_body("once"), requestId="4b1c6c7e-1"))
    assert first["name"] == second["name"]
    assert first["clientOperationId"] == second["clientOperationId"] == "4b1c6c7e-1"
    assert client.wait(first)["clientOperationId"] == "4b1c6c7e-1"


def test_unknown_project_zone_and_instance_are_googles_404s(emu: ComputeEmulator, client: Client) -> None:
    cases = {
        f"{emu.base_url}projects/nope/zones/{ZONE}/instances": "projects/nope",
        "zones/mars-north1-a/instances": f"projects/{PROJECT}/zones/mars-north1-a",
        f"zones/{ZONE}/instances/ghost": f"projects/{PROJECT}/zones/{ZONE}/instances/ghost",
        f"zones/{ZONE}/machineTypes/g9-huge": f"projects/{PROJECT}/zones/{ZONE}/machineTypes/g9-huge",
    }
    for path, resource in cases.items():
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["message"] == f"The resource '{resource}' was not found"


def test_public_image_projects_are_readable_for_images_only(emu: ComputeEmulator, client: Client) -> None:
    image_project = f"{emu.base_url}projects/ubuntu-os-cloud"
    assert client.get(f"{image_project}/global/images/family/ubuntu-2204-lts").status_code == 200
    response = client.get(f"{image_project}/zones/{ZONE}/instances")
    assert response.status_code == 403
    assert response.json()["error"]["status"] == "PERMISSION_DENIED"


def test_an_unimplemented_method_says_so_with_501(client: Client) -> None:
    response = client.post(
        f"zones/{ZONE}/instances/x/setMachineType", {"machineType": "zones/us-east1-d/machineTypes/e2-small"}
    )
    assert response.status_code == 501
    assert "compute.instances.setMachineType" in response.json()["error"]["message"]


def test_concurrent_inserts_are_all_created_once(emu: ComputeEmulator, client: Client) -> None:
    names = [f"par-{i}" for i in range(16)]
    results: dict[str, int] = {}

    def insert(name: str) -> None:
        results[name] = (
            Client(emu, emu.issue_token()).post(f"zones/{ZONE}/instances", small_body(name)).status_code
        )

    threads = [threading.Thread(target=insert, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(results.values()) == {200}
    eventually(
        lambda: all(i["status"] == "RUNNING" for i in emu.instances(PROJECT)) and len(emu.instances()) == 16
    )
    ids = {i["id"] for i in emu.instances(PROJECT)}
    assert len(ids) == 16
