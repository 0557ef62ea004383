"""Requests are checked against Google's discovery document and Google's semantic rules."""

from __future__ import annotations

from typing import Any

import pytest
from emulator_helpers import ZONE, Client, l4_body, small_body


def error_of(response: Any, status: int = 400) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["errors"][0]["message"] == error["message"]
    return str(error["message"])


def test_an_unknown_field_fails_naming_where_it_is(client: Client) -> None:
    body = l4_body()
    body["scheduling"]["provisioning_model"] = "SPOT"  # snake_case: what a careless client sends
    message = error_of(client.post(f"zones/{ZONE}/instances", body))
    assert message == (
        "Invalid JSON payload received. Unknown name \"provisioning_model\" at 'resource.scheduling': "
        "Cannot find field."
    )


def test_a_bad_enum_fails_naming_the_field_path_and_the_value(client: Client) -> None:
    body = l4_body(scheduling={"provisioningModel": "SPOTT", "onHostMaintenance": "TERMINATE"})
    message = error_of(client.post(f"zones/{ZONE}/instances", body))
    assert message.startswith("Invalid value for field 'resource.scheduling.provisioningModel': 'SPOTT'.")
    assert "SPOT" in message and "STANDARD" in message


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b["disks"][0].update(interface="NVMe"), "resource.disks[0].interface"),
        (lambda b: b["disks"][0].update(type="SSD"), "resource.disks[0].type"),
        (
            lambda b: b["disks"][0]["initializeParams"].update(diskSizeGb="big"),
            "resource.disks[0].initializeParams.diskSizeGb",
        ),
        (lambda b: b["scheduling"].update(onHostMaintenance="STOP"), "resource.scheduling.onHostMaintenance"),
        (lambda b: b["scheduling"].update(automaticRestart="yes"), "resource.scheduling.automaticRestart"),
        (lambda b: b.update(networkInterfaces={"network": "default"}), "resource.networkInterfaces"),
        (lambda b: b.update(name="L4_VM"), "resource.name"),
        (lambda b: b.update(labels={"Team": "x"}), "resource.labels.Team"),
    ],
)
def test_wrong_types_enums_and_names_fail_naming_the_field(client: Client, mutate: Any, field: str) -> None:
    body = l4_body()
    mutate(body)
    assert f"'{field}'" in error_of(client.post(f"zones/{ZONE}/instances", body))


def test_int64_fields_accept_strings_and_integers(client: Client) -> None:
    as_int = l4_body("as-int")
    as_int["disks"][0]["initializeParams"]["diskSizeGb"] = 200
    client.insert(as_int)
    assert client.ok(client.get(f"zones/{ZONE}/instances/as-int"))["disks"][0]["diskSizeGb"] == "200"


def test_the_name_is_required(client: Client) -> None:
    body = l4_body()
    del body["name"]
    assert (
        error_of(client.post(f"zones/{ZONE}/instances", body))
        == "Required field 'resource.name' not specified"
    )


def test_gpu_instances_must_not_live_migrate(client: Client) -> None:
    body = l4_body(scheduling={"onHostMaintenance": "MIGRATE"})
    assert "do not support live migration" in error_of(client.post(f"zones/{ZONE}/instances", body))
    body = l4_body(scheduling={})  # the default is MIGRATE, so leaving it out fails too
    assert "onHostMaintenance" in error_of(client.post(f"zones/{ZONE}/instances", body))


def test_a_termination_action_needs_a_spot_instance(client: Client) -> None:
    body = l4_body(scheduling={"onHostMaintenance": "TERMINATE", "instanceTerminationAction": "DELETE"})
    message = error_of(client.post(f"zones/{ZONE}/instances", body))
    assert "'resource.scheduling.instanceTerminationAction'" in message


def test_preemptible_with_a_standard_provisioning_model_is_refused(client: Client) -> None:
    scheduling = {"onHostMaintenance": "TERMINATE", "preemptible": True, "provisioningModel": "STANDARD"}
    message = error_of(client.post(f"zones/{ZONE}/instances", l4_body(scheduling=scheduling)))
    assert "only allowed provisioning_model value is SPOT" in message


def test_spot_instances_cannot_restart_automatically(client: Client) -> None:
    scheduling = {"onHostMaintenance": "TERMINATE", "provisioningModel": "SPOT", "automaticRestart": True}
    assert "'resource.scheduling.automaticRestart'" in error_of(
        client.post(f"zones/{ZONE}/instances", l4_body(scheduling=scheduling))
    )


def test_the_l4_is_not_offered_in_us_east1_c(client: Client) -> None:
    message = error_of(client.post("zones/us-east1-c/instances", l4_body(zone="us-east1-c")))
    assert message == (
        "Invalid value for field 'resource.machineType': 'zones/us-east1-c/machineTypes/g2-standard-8'. "
        "Machine type with name 'g2-standard-8' does not exist in zone 'us-east1-c'."
    )
    n1 = small_body("n1-l4", zone="us-east1-c", machine="n1-standard-8")
    n1["guestAccelerators"] = [
        {"acceleratorType": "zones/us-east1-c/acceleratorTypes/nvidia-l4", "acceleratorCount": 1}
    ]
    n1["scheduling"] = {"onHostMaintenance": "TERMINATE"}
    message = error_of(client.post("zones/us-east1-c/instances", n1))
    assert (
        "'resource.guestAccelerators[0].acceleratorType'" in message and "does not exist in zone" in message
    )


def test_n1_machines_accept_an_attached_t4(client: Client) -> None:
    body = small_body("n1-t4", machine="n1-standard-4", scheduling={"onHostMaintenance": "TERMINATE"})
    body["guestAccelerators"] = [
        {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 1}
    ]
    client.insert(body)
    vm = client.ok(client.get(f"zones/{ZONE}/instances/n1-t4"))
    assert vm["guestAccelerators"][0]["acceleratorType"].endswith(
        f"/zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4"
    )


def test_e2_machines_take_no_gpus(client: Client) -> None:
    body = small_body("e2-gpu", scheduling={"onHostMaintenance": "TERMINATE"})
    body["guestAccelerators"] = [
        {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 1}
    ]
    assert "not compatible" in error_of(client.post(f"zones/{ZONE}/instances", body))


def test_g2_takes_its_own_l4_only(client: Client) -> None:
    matching = l4_body("g2-explicit")
    matching["guestAccelerators"] = [
        {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-l4", "acceleratorCount": 1}
    ]
    client.insert(matching)
    extra = l4_body("g2-two")
    extra["guestAccelerators"] = [
        {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-l4", "acceleratorCount": 2}
    ]
    assert "'resource.guestAccelerators'" in error_of(client.post(f"zones/{ZONE}/instances", extra))


def test_a_machine_type_from_another_zone_is_refused(client: Client) -> None:
    body = l4_body(machineType="zones/us-east1-b/machineTypes/g2-standard-8")
    assert "'resource.machineType'" in error_of(client.post(f"zones/{ZONE}/instances", body))


def test_an_unknown_image_family_is_404(client: Client) -> None:
    body = l4_body()
    body["disks"][0]["initializeParams"]["sourceImage"] = (
        "projects/deeplearning-platform-release/global/images/family/pytorch-9"
    )
    assert "was not found" in error_of(client.post(f"zones/{ZONE}/instances", body), 404)


def test_a_disk_smaller_than_its_image_is_refused(client: Client) -> None:
    body = l4_body()
    body["disks"][0]["initializeParams"]["diskSizeGb"] = "20"
    assert "cannot be smaller than the image size (50 GB)" in error_of(
        client.post(f"zones/{ZONE}/instances", body)
    )


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"maxResults": "501"}, "'maxResults': '501'"),
        ({"maxResults": "-1"}, "'maxResults': '-1'"),
        ({"maxResults": "many"}, "'maxResults': 'many'"),
        ({"max_results": "5"}, 'Unknown name "max_results"'),
        ({"filter": "status = "}, "'filter'"),
        ({"pageToken": "garbage"}, "'pageToken'"),
        ({"orderBy": "zone"}, "'orderBy'"),
    ],
)
def test_bad_query_parameters_fail_naming_the_parameter(
    client: Client, params: dict[str, str], needle: str
) -> None:
    assert needle in error_of(client.get("aggregated/instances", **params))


def test_return_partial_success_and_standard_parameters_are_accepted(client: Client) -> None:
    response = client.get(
        "aggregated/instances", returnPartialSuccess="true", prettyPrint="false", includeAllScopes="true"
    )
    assert response.status_code == 200


def test_a_body_that_is_not_json_is_a_parse_error(emu: Any, client: Client) -> None:
    response = client.session.post(client.url(f"zones/{ZONE}/instances"), data=b"{not json", timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["errors"][0]["reason"] == "parseError"


def test_a_subnetwork_must_be_the_default_one_of_the_zones_region(client: Client) -> None:
    body = small_body("subnet", networkInterfaces=[{"subnetwork": "regions/us-central1/subnetworks/default"}])
    assert "'resource.networkInterfaces[0].subnetwork'" in error_of(
        client.post(f"zones/{ZONE}/instances", body)
    )
    body = small_body("subnet", networkInterfaces=[{"subnetwork": "regions/us-east1/subnetworks/lab"}])
    assert "subnetworks/lab' was not found" in error_of(client.post(f"zones/{ZONE}/instances", body), 404)
    body = small_body("subnet", networkInterfaces=[{"subnetwork": "regions/us-east1/subnetworks/default"}])
    client.insert(body)
