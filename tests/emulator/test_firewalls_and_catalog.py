"""Global firewalls with global operations, and the catalog forja chooses machines from."""

from __future__ import annotations

import pytest
from emulator_helpers import PROJECT, Client

from forja_sandbox.compute_emulator import ComputeEmulator

SSH_RULE = {
    "name": "forja-allow-ssh",
    "network": "global/networks/default",
    "direction": "INGRESS",
    "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
    "sourceRanges": ["203.0.113.7/32"],
    "targetTags": ["forja"],
}


def test_firewall_insert_get_patch_list_delete(emu: ComputeEmulator, client: Client) -> None:
    op = client.ok(client.post("global/firewalls", SSH_RULE))
    assert op["selfLink"] == f"{emu.base_url}projects/{PROJECT}/global/operations/{op['name']}"
    assert "zone" not in op and client.wait(op)["operationType"] == "insert"
    rule = client.ok(client.get("global/firewalls/forja-allow-ssh"))
    assert rule["kind"] == "compute#firewall" and rule["priority"] == 1000 and rule["disabled"] is False
    assert rule["network"] == f"{emu.base_url}projects/{PROJECT}/global/networks/default"
    assert rule["selfLink"] == f"{emu.base_url}projects/{PROJECT}/global/firewalls/forja-allow-ssh"
    client.wait(
        client.ok(
            client.patch(
                "global/firewalls/forja-allow-ssh",
                {"name": "forja-allow-ssh", "sourceRanges": ["198.51.100.0/24"]},
            )
        )
    )
    patched = client.ok(client.get("global/firewalls/forja-allow-ssh"))
    assert patched["sourceRanges"] == ["198.51.100.0/24"] and patched["allowed"] == SSH_RULE["allowed"]
    assert [r["name"] for r in client.ok(client.get("global/firewalls"))["items"]] == ["forja-allow-ssh"]
    client.wait(client.ok(client.delete("global/firewalls/forja-allow-ssh")))
    assert client.get("global/firewalls/forja-allow-ssh").status_code == 404


def test_an_ingress_rule_without_sources_opens_to_the_world_as_google_does(client: Client) -> None:
    rule = {k: v for k, v in SSH_RULE.items() if k != "sourceRanges"}
    client.wait(client.ok(client.post("global/firewalls", rule)))
    assert client.ok(client.get("global/firewalls/forja-allow-ssh"))["sourceRanges"] == ["0.0.0.0/0"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"allowed": [{"IPProtocol": "tcp", "ports": ["22-"]}]}, "resource.allowed[0].ports[0]"),
        ({"allowed": [{"IPProtocol": "tcpp"}]}, "resource.allowed[0].IPProtocol"),
        ({"allowed": [{"protocol": "tcp"}]}, "resource.allowed[0]"),
        ({"sourceRanges": ["300.1.1.1/32"]}, "resource.sourceRanges[0]"),
        ({"direction": "INBOUND"}, "resource.direction"),
        ({"denied": [{"IPProtocol": "all"}]}, "resource.allowed"),
    ],
)
def test_bad_firewall_rules_fail_naming_the_field(client: Client, change: dict, field: str) -> None:
    response = client.post("global/firewalls", dict(SSH_RULE, **change))
    assert response.status_code == 400
    assert f"'{field}'" in response.json()["error"]["message"]


def test_a_duplicate_firewall_is_409(client: Client) -> None:
    client.wait(client.ok(client.post("global/firewalls", SSH_RULE)))
    assert client.post("global/firewalls", SSH_RULE).status_code == 409


def test_zones_list_includes_the_zones_forja_uses(client: Client) -> None:
    zones = {z["name"]: z for z in client.ok(client.get("zones"))["items"]}
    for name in ("us-east1-b", "us-east1-c", "us-east1-d", "us-central1-a", "europe-west4-a", "asia-east1-a"):
        assert zones[name]["status"] == "UP"
    assert zones["us-east1-d"]["region"].endswith(f"projects/{PROJECT}/regions/us-east1")
    assert client.ok(client.get("zones/us-east1-d"))["name"] == "us-east1-d"


@pytest.mark.parametrize(
    ("machine", "gpu", "count"),
    [
        ("g2-standard-8", "nvidia-l4", 1),
        ("g2-standard-24", "nvidia-l4", 2),
        ("g2-standard-96", "nvidia-l4", 8),
        ("a2-highgpu-4g", "nvidia-tesla-a100", 4),
        ("a2-ultragpu-1g", "nvidia-a100-80gb", 1),
        ("a3-highgpu-8g", "nvidia-h100-80gb", 8),
    ],
)
def test_accelerator_optimized_types_carry_their_gpus(
    client: Client, machine: str, gpu: str, count: int
) -> None:
    resource = client.ok(client.get(f"zones/us-central1-a/machineTypes/{machine}"))
    assert resource["accelerators"] == [{"guestAcceleratorType": gpu, "guestAcceleratorCount": count}]
    assert resource["kind"] == "compute#machineType" and resource["zone"] == "us-central1-a"


def test_g2_standard_8_has_8_vcpus_and_32_gb(client: Client) -> None:
    resource = client.ok(client.get("zones/us-east1-d/machineTypes/g2-standard-8"))
    assert (resource["guestCpus"], resource["memoryMb"]) == (8, 32768)
    assert "accelerators" not in client.ok(client.get("zones/us-east1-d/machineTypes/n1-standard-4"))


def test_the_l4_and_g2_are_missing_from_us_east1_c(client: Client) -> None:
    accelerators = {a["name"] for a in client.ok(client.get("zones/us-east1-c/acceleratorTypes"))["items"]}
    assert "nvidia-l4" not in accelerators and "nvidia-tesla-t4" in accelerators
    assert client.get("zones/us-east1-c/acceleratorTypes/nvidia-l4").status_code == 404
    assert client.get("zones/us-east1-c/machineTypes/g2-standard-8").status_code == 404
    l4 = client.ok(client.get("zones/us-east1-d/acceleratorTypes/nvidia-l4"))
    assert l4["description"] == "NVIDIA L4" and l4["maximumCardsPerInstance"] == 8


def test_machine_type_lists_filter_by_name(client: Client) -> None:
    names = [
        m["name"]
        for m in client.ok(client.get("zones/us-east1-d/machineTypes", filter="name eq g2-.*"))["items"]
    ]
    assert names == sorted(f"g2-standard-{n}" for n in (4, 8, 12, 16, 24, 32, 48, 96))


@pytest.mark.parametrize(
    ("project", "family", "prefix"),
    [
        (
            "deeplearning-platform-release",
            "pytorch-2-7-cu128-ubuntu-2204-nvidia-570",
            "pytorch-2-7-cu128-ubuntu-2204-nvidia-570-v",
        ),
        ("ubuntu-os-cloud", "ubuntu-2204-lts", "ubuntu-2204-jammy-v"),
    ],
)
def test_image_families_resolve_to_the_newest_ready_image(
    emu: ComputeEmulator, client: Client, project: str, family: str, prefix: str
) -> None:
    image = client.ok(client.get(f"{emu.base_url}projects/{project}/global/images/family/{family}"))
    assert image["name"].startswith(prefix) and image["family"] == family
    assert image["status"] == "READY" and "deprecated" not in image
    assert image["selfLink"] == f"{emu.base_url}projects/{project}/global/images/{image['name']}"
    assert client.ok(client.get(image["selfLink"]))["id"] == image["id"]


def test_an_unknown_image_family_is_404(emu: ComputeEmulator, client: Client) -> None:
    response = client.get(f"{emu.base_url}projects/ubuntu-os-cloud/global/images/family/ubuntu-1404")
    assert response.status_code == 404
