"""Optimistic locking (fingerprints, 412) and injected faults (429, 503, stock-outs, slow ops)."""

from __future__ import annotations

import socket
import struct
import time

import pytest
import requests
from emulator_helpers import PROJECT, ZONE, Client, l4_body, small_body

from forja_sandbox.compute_emulator import ComputeEmulator

VM = f"zones/{ZONE}/instances/vm"


@pytest.fixture
def vm(client: Client) -> dict:
    client.insert(small_body("vm", labels={"team": "ml"}, metadata={"items": [{"key": "a", "value": "1"}]}))
    return client.ok(client.get(VM))


def test_set_labels_with_the_current_fingerprint_replaces_labels_and_changes_it(
    client: Client, vm: dict
) -> None:
    op = client.ok(
        client.post(
            f"{VM}/setLabels",
            {"labels": {"team": "ml", "run": "r1"}, "labelFingerprint": vm["labelFingerprint"]},
        )
    )
    assert op["operationType"] == "setLabels"
    assert "error" not in client.wait(op)
    after = client.ok(client.get(VM))
    assert after["labels"] == {"team": "ml", "run": "r1"}
    assert after["labelFingerprint"] != vm["labelFingerprint"]


def test_set_labels_with_a_stale_fingerprint_is_412_condition_not_met(client: Client, vm: dict) -> None:
    client.wait(
        client.ok(
            client.post(f"{VM}/setLabels", {"labels": {"x": "1"}, "labelFingerprint": vm["labelFingerprint"]})
        )
    )
    response = client.post(
        f"{VM}/setLabels", {"labels": {"y": "2"}, "labelFingerprint": vm["labelFingerprint"]}
    )
    assert response.status_code == 412
    error = response.json()["error"]
    assert error["errors"][0]["reason"] == "conditionNotMet" and error["status"] == "FAILED_PRECONDITION"
    assert client.ok(client.get(VM))["labels"] == {"x": "1"}  # unchanged


def test_set_labels_without_a_fingerprint_is_refused(client: Client, vm: dict) -> None:
    response = client.post(f"{VM}/setLabels", {"labels": {"y": "2"}})
    assert response.status_code == 400 and "labelFingerprint" in response.json()["error"]["message"]


def test_empty_labels_have_googles_empty_fingerprint(client: Client) -> None:
    client.insert(small_body("bare"))
    vm = client.ok(client.get(f"zones/{ZONE}/instances/bare"))
    assert "labels" not in vm and vm["labelFingerprint"] == "42WmSpB8rSM="


def test_set_metadata_replaces_the_whole_item_list(client: Client, vm: dict) -> None:
    body = {"fingerprint": vm["metadata"]["fingerprint"], "items": [{"key": "b", "value": "2"}]}
    client.wait(client.ok(client.post(f"{VM}/setMetadata", body)))
    metadata = client.ok(client.get(VM))["metadata"]
    assert metadata["items"] == [{"key": "b", "value": "2"}]
    assert metadata["fingerprint"] != vm["metadata"]["fingerprint"]


def test_metadata_over_512_kb_in_all_or_with_a_bad_key_is_400_and_changes_nothing(
    client: Client, vm: dict
) -> None:
    """Compute Engine's limits: 512 KB for all keys and values, keys of [a-zA-Z0-9_-]{1,128}. 600
    values of 1,000 bytes fit under the wire's 1 MiB, so only the total can refuse them."""
    many = [{"key": f"key-{i:03d}", "value": "v" * 1000} for i in range(600)]
    insert = client.post(f"zones/{ZONE}/instances", small_body("crowded", metadata={"items": many}))
    assert insert.status_code == 400 and "'resource.metadata'" in insert.json()["error"]["message"]
    assert client.get(f"zones/{ZONE}/instances/crowded").status_code == 404
    for items in (many, [{"key": "has space", "value": "1"}], [{"key": "k" * 129, "value": "1"}]):
        body = {"fingerprint": vm["metadata"]["fingerprint"], "items": items}
        response = client.post(f"{VM}/setMetadata", body)
        assert response.status_code == 400, response.text
    assert client.ok(client.get(VM))["metadata"]["items"] == [{"key": "a", "value": "1"}]
    at_the_limit = [{"key": f"k{i:04d}", "value": "v" * 251} for i in range(2048)]  # 2048 x 256 bytes: 512 KB
    assert sum(len(i["key"]) + len(i["value"]) for i in at_the_limit) == 512 * 1024
    body["items"] = at_the_limit
    client.wait(client.ok(client.post(f"{VM}/setMetadata", body)))


def test_set_metadata_with_a_stale_fingerprint_is_412(client: Client, vm: dict) -> None:
    response = client.post(f"{VM}/setMetadata", {"fingerprint": "c3RhbGU=", "items": []})
    assert response.status_code == 412
    assert (
        response.json()["error"]["message"]
        == "Supplied fingerprint does not match current metadata fingerprint."
    )


def test_a_429_fault_fires_the_given_number_of_times_then_clears(
    emu: ComputeEmulator, client: Client
) -> None:
    emu.faults.add(method="instances.list", status=429, times=2)
    first, second, third = (client.get(f"zones/{ZONE}/instances") for _ in range(3))
    assert (first.status_code, second.status_code, third.status_code) == (429, 429, 200)
    error = first.json()["error"]
    assert error["status"] == "RESOURCE_EXHAUSTED" and error["errors"][0]["reason"] == "rateLimitExceeded"
    assert emu.faults.rules == []


def test_a_503_fault_can_target_one_zone(emu: ComputeEmulator, client: Client) -> None:
    emu.faults.add(method="compute.instances.list", status=503, zone="us-east1-b", times=None)
    assert client.get("zones/us-east1-b/instances").status_code == 503
    assert client.get(f"zones/{ZONE}/instances").status_code == 200
    assert client.get("zones/us-east1-b/instances").json()["error"]["errors"][0]["reason"] == "backendError"


def test_a_403_quota_fault_uses_googles_quota_reason(emu: ComputeEmulator, client: Client) -> None:
    emu.faults.add(method="instances.insert", status=403)
    response = client.post(f"zones/{ZONE}/instances", l4_body())
    assert response.status_code == 403 and response.json()["error"]["errors"][0]["reason"] == "quotaExceeded"
    assert emu.instances() == []


def test_a_stock_out_ends_the_insert_operation_done_with_an_error_and_no_instance(
    emu: ComputeEmulator, client: Client
) -> None:
    emu.faults.add(method="instances.insert", error="ZONE_RESOURCE_POOL_EXHAUSTED", zone=ZONE)
    op = client.ok(client.post(f"zones/{ZONE}/instances", l4_body()))  # accepted: 200 with an operation
    done = client.wait(op)
    assert done["status"] == "DONE"
    assert done["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert done["error"]["errors"][0]["message"].startswith(
        f"The zone 'projects/{PROJECT}/zones/{ZONE}' does not have enough resources"
    )
    assert done["httpErrorStatusCode"] == 503
    assert client.get(f"zones/{ZONE}/instances/l4-vm-1").status_code == 404
    client.insert(l4_body())  # the fault fired once; the retry succeeds
    assert client.ok(client.get(f"zones/{ZONE}/instances/l4-vm-1"))["status"] == "RUNNING"


def test_a_quota_error_on_start_leaves_the_instance_terminated(emu: ComputeEmulator, client: Client) -> None:
    client.insert(small_body("quota"))
    client.wait(client.ok(client.post(f"zones/{ZONE}/instances/quota/stop")))
    emu.faults.add(method="instances.start", error="QUOTA_EXCEEDED")
    done = client.wait(client.ok(client.post(f"zones/{ZONE}/instances/quota/start")))
    assert done["error"]["errors"][0]["code"] == "QUOTA_EXCEEDED" and done["httpErrorStatusCode"] == 403
    assert client.ok(client.get(f"zones/{ZONE}/instances/quota"))["status"] == "TERMINATED"


def test_a_slow_operation_stays_unfinished_until_its_delay_passes(
    emu: ComputeEmulator, client: Client
) -> None:
    emu.faults.add(method="instances.stop", delay_s=0.4)
    client.insert(small_body("slow"))
    started = time.monotonic()
    op = client.ok(client.post(f"zones/{ZONE}/instances/slow/stop"))
    assert client.ok(client.get(op["selfLink"]))["status"] != "DONE"
    assert client.wait(op)["status"] == "DONE"
    assert time.monotonic() - started >= 0.4


def test_wait_returns_the_unfinished_operation_after_its_timeout(
    emu: ComputeEmulator, client: Client
) -> None:
    emu.api.wait_timeout_s = 0.1
    emu.faults.add(method="instances.stop", delay_s=1.0)
    client.insert(small_body("slower"))
    op = client.ok(client.post(f"zones/{ZONE}/instances/slower/stop"))
    assert client.ok(client.post(op["selfLink"] + "/wait"))["status"] in ("PENDING", "RUNNING")


def test_a_token_endpoint_fault_answers_googles_retryable_error(emu: ComputeEmulator) -> None:
    emu.faults.add(method="token", status=503)
    response = requests.post(emu.token_uri, data={"grant_type": "x"}, timeout=10)
    assert response.status_code == 503 and response.json()["error"] == "internal_failure"
    assert emu.stats["token_requests"] == 1


def test_stats_count_requests_per_method_and_reset(emu: ComputeEmulator, client: Client) -> None:
    client.get(f"zones/{ZONE}/instances")
    client.get("aggregated/instances", maxResults=10)
    stats = emu.stats
    assert stats["requests"] == 2
    assert stats["by_method"] == {"compute.instances.list": 1, "compute.instances.aggregatedList": 1}
    method, path, query, body = emu.requests[-1]
    assert (method, path, query, body) == (
        "compute.instances.aggregatedList",
        "projects/forja-sandbox/aggregated/instances",
        {"maxResults": ["10"]},
        None,
    )
    emu.stats_reset()
    assert emu.stats == {"token_requests": 0, "requests": 0, "by_method": {}}


def test_set_tags_needs_the_current_tags_fingerprint(client: Client, vm: dict) -> None:
    body = {"items": ["forja", "jupyter"], "fingerprint": vm["tags"]["fingerprint"]}
    client.wait(client.ok(client.post(f"{VM}/setTags", body)))
    tags = client.ok(client.get(VM))["tags"]
    assert tags["items"] == ["forja", "jupyter"] and tags["fingerprint"] != vm["tags"]["fingerprint"]
    assert client.post(f"{VM}/setTags", body).status_code == 412
    bad = client.post(f"{VM}/setTags", {"items": ["Bad_Tag"], "fingerprint": tags["fingerprint"]})
    assert bad.status_code == 400 and "'resource.items[0]'" in bad.json()["error"]["message"]


def test_a_client_that_gives_up_waiting_leaves_the_emulator_serving_quietly(
    emu: ComputeEmulator, client: Client, capfd: pytest.CaptureFixture[str]
) -> None:
    emu.faults.add(method="instances.stop", delay_s=0.5)
    client.insert(small_body("patient"))
    op = client.ok(client.post(f"zones/{ZONE}/instances/patient/stop"))
    path = op["selfLink"].split(emu.url, 1)[1] + "/wait"
    with socket.create_connection((emu.host, emu.port)) as impatient:
        request = (
            f"POST {path} HTTP/1.1\r\nHost: {emu.host}\r\nContent-Length: 0\r\n"
            f"Authorization: {client.session.headers['Authorization']}\r\n\r\n"
        )
        impatient.sendall(request.encode())
        time.sleep(0.1)
        # Close with a reset (linger 0), as a client killed by its own timeout does.
        impatient.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert client.wait(op)["status"] == "DONE"
    time.sleep(0.1)
    assert "Traceback" not in capfd.readouterr().err


def test_a_fault_added_over_http_fires_like_one_added_in_process(emu: ComputeEmulator,
                                                                 client: Client) -> None:
    """The control path a drill uses while another process (the sandbox service) runs the emulator."""
    client.insert(small_body("drill"))
    client.wait(client.ok(client.post(f"zones/{ZONE}/instances/drill/stop")))
    rule = {"method": "instances.start", "error": "ZONE_RESOURCE_POOL_EXHAUSTED", "zone": ZONE}
    assert requests.post(f"{emu.url}/emulator/v1/faults", json=rule, timeout=10).json()["times"] == 1
    done = client.wait(client.ok(client.post(f"zones/{ZONE}/instances/drill/start")))
    assert done["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    refused = requests.post(f"{emu.url}/emulator/v1/faults", json={"method": "instances.start"}, timeout=10)
    assert refused.status_code == 400 and "needs status=, error= or delay_s=" in refused.text
    requests.post(f"{emu.url}/emulator/v1/faults", json={**rule, "times": None}, timeout=10)
    assert requests.delete(f"{emu.url}/emulator/v1/faults", timeout=10).status_code == 200
    done = client.wait(client.ok(client.post(f"zones/{ZONE}/instances/drill/start")))
    assert "error" not in done
    assert client.ok(client.get(f"zones/{ZONE}/instances/drill"))["status"] == "RUNNING"
