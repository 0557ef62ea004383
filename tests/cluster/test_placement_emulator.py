"""Compact placement policies on the Compute emulator, driven by Google's own google-cloud-compute.

The emulator must answer resourcePolicies and an instance's `resourcePolicies` the way Compute
Engine does: a COLLOCATED policy in the instance's region, refused for a machine series Google
refuses it for (E2, N1), and not deletable while a VM still uses it.
"""

from __future__ import annotations

from pathlib import Path

import google.api_core.exceptions
import pytest
import yaml
from gcp_helpers import REPO
from google.cloud import compute_v1
from google.oauth2 import service_account

PROJECT = "forja-sandbox"
VM = yaml.safe_load((REPO / "roles/gcp_instance/defaults/main.yml").read_text())
ZONE = VM["gcp_instance_zone"]
REGION = ZONE.rsplit("-", 1)[0]
pytestmark = pytest.mark.usefixtures("only_googles_background_lookup_left_the_machine")




class Clients:
    """google-cloud-compute's clients on the emulator's endpoint, and a wait on each operation kind."""

    def __init__(self, emulator, key_file: Path) -> None:
        creds = service_account.Credentials.from_service_account_file(str(key_file))
        options = {"api_endpoint": emulator.url}
        kw = {"credentials": creds, "transport": "rest", "client_options": options}
        self.policies = compute_v1.ResourcePoliciesClient(**kw)
        self.region_ops = compute_v1.RegionOperationsClient(**kw)
        self.instances = compute_v1.InstancesClient(**kw)
        self.zone_ops = compute_v1.ZoneOperationsClient(**kw)

    def wait_region(self, op) -> compute_v1.Operation:
        done = self.region_ops.wait(project=PROJECT, region=REGION, operation=op.name)
        assert done.status == compute_v1.Operation.Status.DONE and not done.error.errors, done
        return done

    def wait_zone(self, op) -> compute_v1.Operation:
        done = self.zone_ops.wait(project=PROJECT, zone=ZONE, operation=op.name)
        assert done.status == compute_v1.Operation.Status.DONE and not done.error.errors, done
        return done

    def compact_policy(self, name: str) -> str:
        policy = compute_v1.ResourcePolicy(
            name=name,
            group_placement_policy=compute_v1.ResourcePolicyGroupPlacementPolicy(collocation="COLLOCATED"),
        )
        self.wait_region(
            self.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=policy)
        )
        return f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/{name}"

    def insert_vm(self, name: str, machine_type: str, policies: list[str]):
        image = (
            f"projects/{VM['gcp_instance_image_project']}/global/images/family/"
            f"{VM['gcp_instance_image_family']}"
        )
        instance = compute_v1.Instance(
            name=name,
            machine_type=f"zones/{ZONE}/machineTypes/{machine_type}",
            scheduling=compute_v1.Scheduling(on_host_maintenance="TERMINATE"),
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(source_image=image),
                )
            ],
            network_interfaces=[compute_v1.NetworkInterface(network="global/networks/default")],
            resource_policies=policies,
        )
        return self.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance)


@pytest.fixture
def gcc(emulator, key_file: Path) -> Clients:
    return Clients(emulator, key_file)


def test_a_compact_policy_round_trips_through_googles_client(gcc: Clients) -> None:
    path = gcc.compact_policy("team-compact")
    got = gcc.policies.get(project=PROJECT, region=REGION, resource_policy="team-compact")
    assert got.group_placement_policy.collocation == "COLLOCATED"
    assert got.self_link.endswith(path) and got.region.endswith(f"/regions/{REGION}")
    assert [p.name for p in gcc.policies.list(project=PROJECT, region=REGION)] == ["team-compact"]
    gcc.wait_region(gcc.policies.delete(project=PROJECT, region=REGION, resource_policy="team-compact"))
    with pytest.raises(google.api_core.exceptions.NotFound):
        gcc.policies.get(project=PROJECT, region=REGION, resource_policy="team-compact")


def test_a_g2_vm_joins_the_policy_which_cannot_go_while_it_is_used(gcc: Clients) -> None:
    path = gcc.compact_policy("team-compact")
    gcc.wait_zone(gcc.insert_vm("node-0", VM["gcp_instance_machine_type"], [path]))
    vm = gcc.instances.get(project=PROJECT, zone=ZONE, instance="node-0")
    assert [p.rsplit("/", 1)[-1] for p in vm.resource_policies] == ["team-compact"]
    assert vm.resource_policies[0].startswith("http")  # full URL, as Google stores it
    with pytest.raises(google.api_core.exceptions.BadRequest) as refused:
        gcc.policies.delete(project=PROJECT, region=REGION, resource_policy="team-compact")
    assert f"is already being used by 'projects/{PROJECT}/zones/{ZONE}/instances/node-0'" in str(
        refused.value
    )
    gcc.wait_zone(gcc.instances.delete(project=PROJECT, zone=ZONE, instance="node-0"))
    gcc.wait_region(gcc.policies.delete(project=PROJECT, region=REGION, resource_policy="team-compact"))


@pytest.mark.parametrize("machine_type", ["e2-standard-4", "n1-standard-8"])
def test_a_series_without_compact_placement_is_refused_and_nothing_is_made(
    gcc: Clients, emulator, machine_type: str
) -> None:
    path = gcc.compact_policy("team-compact")
    with pytest.raises(google.api_core.exceptions.BadRequest) as refused:
        gcc.insert_vm("node-0", machine_type, [path])
    series = machine_type.split("-", 1)[0].upper()
    assert "resource.resourcePolicies[0]" in str(refused.value)
    assert f"not supported for the machine series {series}" in str(refused.value)
    assert emulator.instances(PROJECT) == []


def test_a_policy_of_another_region_or_a_missing_one_is_refused(gcc: Clients, emulator) -> None:
    with pytest.raises(google.api_core.exceptions.NotFound):
        gcc.insert_vm(
            "node-0",
            VM["gcp_instance_machine_type"],
            [f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/nothing-here"],
        )
    other = compute_v1.ResourcePolicy(
        name="far",
        group_placement_policy=compute_v1.ResourcePolicyGroupPlacementPolicy(collocation="COLLOCATED"),
    )
    op = gcc.policies.insert(project=PROJECT, region="europe-west4", resource_policy_resource=other)
    gcc.region_ops.wait(project=PROJECT, region="europe-west4", operation=op.name)
    with pytest.raises(google.api_core.exceptions.BadRequest) as refused:
        gcc.insert_vm(
            "node-0",
            VM["gcp_instance_machine_type"],
            [f"projects/{PROJECT}/regions/europe-west4/resourcePolicies/far"],
        )
    assert "same region as the instance" in str(refused.value)
    assert emulator.instances(PROJECT) == []
