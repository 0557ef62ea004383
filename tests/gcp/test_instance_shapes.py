"""Instance JSON <-> forja: facts, the insert body, and the normalisation behind "changed"."""

from __future__ import annotations

import copy

import pytest
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import (
    SpecError,
    choose_ip,
    comparable_view,
    immutable_differences,
    insert_body,
    instance_facts,
    validate_source_ranges,
    validate_spec,
    wanted_labels,
    wanted_metadata,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_machines import resolve_gpus

BASE = "https://compute.googleapis.com/compute/v1/projects/p1"
SERVER_L4 = {
    "kind": "compute#instance",
    "id": "123",
    "name": "forja-l4",
    "zone": f"{BASE}/zones/us-east1-d",
    "machineType": f"{BASE}/zones/us-east1-d/machineTypes/g2-standard-8",
    "status": "RUNNING",
    "selfLink": f"{BASE}/zones/us-east1-d/instances/forja-l4",
    "creationTimestamp": "2026-11-22T04:00:00.000-08:00",
    "lastStartTimestamp": "2026-11-22T04:00:10.000-08:00",
    "guestAccelerators": [
        {"acceleratorType": f"{BASE}/zones/us-east1-d/acceleratorTypes/nvidia-l4", "acceleratorCount": 1}
    ],
    "scheduling": {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": True,
        "provisioningModel": "STANDARD",
    },
    "networkInterfaces": [
        {
            "network": f"{BASE}/global/networks/default",
            "networkIP": "10.142.0.2",
            "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "natIP": "34.1.2.3"}],
        }
    ],
    "disks": [{"boot": True, "diskSizeGb": "300", "interface": "NVME", "type": "PERSISTENT"}],
    "labels": {"forja": "managed"},
    "labelFingerprint": "abc=",
    "metadata": {
        "fingerprint": "def=",
        "items": [{"key": "ssh-keys", "value": "ansible:ssh-ed25519 AAAA x"}],
    },
    "tags": {"items": ["forja-ssh"], "fingerprint": "ghi="},
}

PARAMS = {
    "name": "forja-l4",
    "zone": "us-east1-d",
    "fallback_zones": [],
    "machine_type": "g2-standard-8",
    "image_family": "pytorch-2-7-cu128-ubuntu-2204-nvidia-570",
    "image": None,
    "image_project": "deeplearning-platform-release",
    "boot_disk_size_gb": 300,
    "boot_disk_type": "pd-balanced",
    "boot_disk_interface": "NVME",
    "network": "default",
    "subnetwork": None,
    "external_ip": True,
    "tags": ["forja-ssh"],
    "labels": {},
    "metadata": {},
    "ssh_keys": ["ansible:ssh-ed25519 AAAA x"],
    "service_account_email": None,
    "scopes": None,
    "spot": False,
    "instance_termination_action": None,
}


def spec_of(**changes):
    params = {**PARAMS, **changes}
    gpus = resolve_gpus(params["machine_type"], params.get("gpu_type"), params.get("gpu_count"))
    return validate_spec(params, "p1", gpus)


def test_facts_use_short_names_and_hide_metadata_values():
    facts = instance_facts(SERVER_L4)
    assert facts["zone"] == "us-east1-d"
    assert facts["machine_type"] == "g2-standard-8"
    assert (facts["gpu_type"], facts["gpu_count"]) == ("nvidia-l4", 1)
    assert facts["project"] == "p1"
    assert facts["provisioning_model"] == "STANDARD"
    assert facts["ip"] == facts["public_ip"] == "34.1.2.3"
    assert facts["private_ip"] == "10.142.0.2"
    assert facts["metadata_keys"] == ["ssh-keys"]
    assert facts["boot_disk_size_gb"] == 300
    assert "AAAA" not in repr(facts)


def test_facts_fall_back_to_the_gpu_the_machine_type_attaches():
    instance = copy.deepcopy(SERVER_L4)
    del instance["guestAccelerators"]
    assert instance_facts(instance)["gpu_type"] == "nvidia-l4"


@pytest.mark.parametrize(
    ("scheduling", "model", "action"),
    [
        ({}, "STANDARD", None),
        ({"provisioningModel": "SPOT"}, "SPOT", "STOP"),
        ({"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}, "SPOT", "DELETE"),
        ({"preemptible": True}, "SPOT", "STOP"),
        (
            {
                "provisioningModel": "SPOT",
                "instanceTerminationAction": "INSTANCE_TERMINATION_ACTION_UNSPECIFIED",
            },
            "SPOT",
            "STOP",
        ),
    ],
)
def test_provisioning_model_makes_server_defaults_explicit(scheduling, model, action):
    facts = instance_facts({**SERVER_L4, "scheduling": scheduling})
    assert (facts["provisioning_model"], facts["instance_termination_action"]) == (model, action)


@pytest.mark.parametrize(
    ("public", "private", "preference", "expected"),
    [
        ("34.1.2.3", "10.0.0.2", ("public_ip", "private_ip"), "34.1.2.3"),
        (None, "10.0.0.2", ("public_ip", "private_ip"), "10.0.0.2"),
        ("34.1.2.3", "10.0.0.2", ("private_ip", "public_ip"), "10.0.0.2"),
        (None, None, ("public_ip", "private_ip"), None),
    ],
)
def test_ip_follows_the_preference_order(public, private, preference, expected):
    assert choose_ip(public, private, preference) == expected


def test_insert_body_reproduces_the_users_vm():
    body = insert_body(spec_of(), "us-east1-d", "p1")
    assert body["machineType"] == "zones/us-east1-d/machineTypes/g2-standard-8"
    assert "guestAccelerators" not in body, "G2 brings its L4; the request must not attach one"
    assert body["scheduling"] == {
        "provisioningModel": "STANDARD",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": True,
    }
    disk = body["disks"][0]
    assert disk["interface"] == "NVME"
    assert disk["initializeParams"] == {
        "sourceImage": "projects/deeplearning-platform-release/global/images/family/"
        "pytorch-2-7-cu128-ubuntu-2204-nvidia-570",
        "diskSizeGb": "300",
        "diskType": "zones/us-east1-d/diskTypes/pd-balanced",
    }
    assert body["labels"] == {"forja": "managed"}
    assert body["metadata"]["items"] == [{"key": "ssh-keys", "value": "ansible:ssh-ed25519 AAAA x"}]


def test_spot_body_sets_the_provisioning_model_and_terminate():
    body = insert_body(spec_of(spot=True, instance_termination_action="DELETE"), "us-east1-b", "p1")
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["disks"][0]["initializeParams"]["diskType"] == "zones/us-east1-b/diskTypes/pd-balanced"


def test_the_nic_type_is_sent_only_when_asked():
    assert "nicType" not in insert_body(spec_of(), "us-east1-d", "p1")["networkInterfaces"][0]
    nic = insert_body(spec_of(nic_type="GVNIC"), "us-east1-d", "p1")["networkInterfaces"][0]
    assert nic["nicType"] == "GVNIC"


def test_n1_gets_its_gpu_attached_with_a_zone_url():
    body = insert_body(
        spec_of(machine_type="n1-standard-8", gpu_type="nvidia-tesla-t4", gpu_count=2), "us-east1-c", "p1"
    )
    assert body["guestAccelerators"] == [
        {
            "acceleratorType": "projects/p1/zones/us-east1-c/acceleratorTypes/nvidia-tesla-t4",
            "acceleratorCount": 2,
        }
    ]


def test_a_server_answer_with_full_urls_and_defaults_matches_the_request():
    assert immutable_differences(spec_of(), SERVER_L4) == []


def test_spot_matches_when_the_server_fills_in_stop():
    server = {**SERVER_L4, "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}}
    assert immutable_differences(spec_of(spot=True), server) == []


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"machine_type": "g2-standard-4"}, "machine_type"),
        ({"spot": True}, "provisioning_model"),
        ({"boot_disk_size_gb": 200}, "boot_disk_size_gb"),
        ({"boot_disk_interface": "SCSI"}, "boot_disk_interface"),
    ],
)
def test_immutable_differences_are_named(changes, field):
    differences = immutable_differences(spec_of(**changes), SERVER_L4)
    assert len(differences) >= 1
    assert differences[0].startswith(field)


def test_labels_and_metadata_merge_unless_purged():
    spec = spec_of(labels={"owner": "alice"}, metadata={"startup-script": "echo hi"})
    assert wanted_labels(spec, {"team": "x"}, purge=False) == {
        "team": "x",
        "owner": "alice",
        "forja": "managed",
    }
    assert wanted_labels(spec, {"team": "x"}, purge=True) == {"owner": "alice", "forja": "managed"}
    kept = wanted_metadata(spec, {"ssh-keys": "gcloud-added"}, purge=False)
    assert kept["ssh-keys"] == "ansible:ssh-ed25519 AAAA x"
    assert kept["startup-script"] == "echo hi"


def test_diff_view_shows_metadata_only_as_digests():
    view = comparable_view(instance_facts(SERVER_L4), {"ssh-keys": "ansible:ssh-ed25519 AAAA x"})
    assert view["metadata"]["ssh-keys"].startswith("sha256:")
    assert "AAAA" not in repr(view)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": "Forja_L4"}, "name:"),
        ({"zone": "us-east1"}, "zone:"),
        ({"fallback_zones": ["east"]}, "fallback_zones:"),
        ({"instance_termination_action": "STOP"}, "instance_termination_action:"),
        ({"boot_disk_size_gb": 5}, "boot_disk_size_gb:"),
        ({"labels": {"Owner": "x"}}, "labels:"),
        ({"labels": {"owner": "Alice Smith"}}, "labels:"),
        ({"tags": ["Has Space"]}, "tags:"),
        ({"ssh_keys": ["no-user-part"]}, "ssh_keys:"),
        ({"image_family": None}, "image_family:"),
        ({"image": "ubuntu-2204"}, "image:"),
        ({"metadata": {"ssh-keys": "a:ssh-ed25519 B"}}, "metadata:"),
    ],
)
def test_bad_input_names_the_field(changes, field):
    with pytest.raises(SpecError) as caught:
        spec_of(**changes)
    assert str(caught.value).startswith(field)


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0", "not-an-ip", "10.0.0.0/33"])
def test_ssh_source_ranges_refuse_the_internet_and_garbage(cidr):
    with pytest.raises(SpecError, match="source_ranges:"):
        validate_source_ranges([cidr])


def test_ssh_source_ranges_accept_iap_and_a_host():
    assert validate_source_ranges(["35.235.240.0/20", "203.0.113.7"]) == ["35.235.240.0/20", "203.0.113.7/32"]
