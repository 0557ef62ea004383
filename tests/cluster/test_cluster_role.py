"""The gcp_instance role with gcp_instance_count > 1, run by ansible-playbook against the emulator.

No VM boots: the emulator has no backend here, so the role's Compute calls are what is tested
(the VMs, their compact placement policy, the cluster's firewall rule, the inventory's ranks,
teardown), over real HTTP with a real service-account key.
"""

from __future__ import annotations

import re

import pytest
import yaml
from cluster_plays import role_play
from gcp_helpers import REPO, emulator_env, inventory_json, run_inventory, run_playbook

PROJECT = "forja-sandbox"
DEFAULTS = yaml.safe_load((REPO / "roles/gcp_instance/defaults/main.yml").read_text())
ZONE = DEFAULTS["gcp_instance_zone"]
REGION = ZONE.rsplit("-", 1)[0]


def recap(proc) -> dict[str, int]:
    found = re.search(
        r"localhost\s*: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout
    )
    assert found, proc.stdout[-3000:] + proc.stderr[-2000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, found.groups()), strict=True))


def cluster(emulator) -> dict[str, dict]:
    return {vm["name"]: vm for vm in emulator.instances(PROJECT)}


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_two_vms_become_one_ranked_cluster_and_teardown_removes_it_all(emulator, key_file, tmp_path):
    env = emulator_env(emulator, key_file)
    play = role_play(tmp_path)
    size = ("-e", "gcp_instance_name=team", "-e", "gcp_instance_count=2")

    first = run_playbook(env, "localhost,", str(play), *size)
    assert recap(first)["failed"] == 0, first.stdout[-4000:]
    vms = cluster(emulator)
    assert sorted(vms) == ["team-0", "team-1"]
    policy = f"{emulator.base_url}projects/{PROJECT}/regions/{REGION}/resourcePolicies/team-compact"
    for rank, name in enumerate(["team-0", "team-1"]):
        vm = vms[name]
        assert vm["zone"].endswith(f"/zones/{ZONE}")
        assert vm["resourcePolicies"] == [policy]
        assert {k: vm["labels"][k] for k in ("forja-cluster", "forja-rank", "forja-cluster-size")} == {
            "forja-cluster": "team",
            "forja-rank": str(rank),
            "forja-cluster-size": "2",
        }
        assert "team-cluster" in vm["tags"]["items"]
    rule = emulator.api.store.firewalls[PROJECT]["team-cluster"]
    assert rule["sourceTags"] == rule["targetTags"] == ["team-cluster"]
    assert "sourceRanges" not in rule
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["29400", "32768-60999"]}]

    again = run_playbook(env, "localhost,", str(play), *size)
    assert recap(again)["changed"] == 0, again.stdout[-4000:]

    emulator.api.store.remove_instance(emulator.api.store.instance(PROJECT, ZONE, "team-1"))
    healed = run_playbook(env, "localhost,", str(play), *size)
    assert recap(healed)["failed"] == 0 and recap(healed)["changed"] >= 1, healed.stdout[-4000:]
    assert cluster(emulator)["team-1"]["resourcePolicies"] == [policy]

    source = tmp_path / "forja.gcp_gpu.yml"
    source.write_text("plugin: forja.gpu.gcp_gpu\n")
    listed = run_inventory(env, source)
    assert listed.returncode == 0, listed.stderr[-3000:]
    inventory = inventory_json(listed)
    assert sorted(inventory["cluster_team"]["hosts"]) == ["team-0", "team-1"]
    hostvars = inventory["_meta"]["hostvars"]
    rank0_ip = cluster(emulator)["team-0"]["networkInterfaces"][0]["networkIP"]
    wanted = (
        "forja_cluster",
        "forja_node_rank",
        "forja_node_count",
        "forja_rendezvous_host",
        "forja_rendezvous_port",
    )
    for rank, name in enumerate(["team-0", "team-1"]):
        assert [hostvars[name].get(k) for k in wanted] == ["team", rank, 2, rank0_ip, 29400]

    # Deleting checks only what deleting needs: the site's fallback zones and a lowered cap stay set.
    creation_only = (
        "-e", '{"gcp_instance_fallback_zones": ["us-east1-b"]}',
        "-e", "gcp_instance_max_count=1",
    )  # fmt: skip
    down = run_playbook(env, source, "playbooks/teardown.yml", *size, *creation_only,
                        "-e", "forja_teardown_delete=true")  # fmt: skip
    assert down.returncode == 0, down.stdout[-4000:]
    assert emulator.instances(PROJECT) == []
    assert emulator.api.store.resource_policies.get(PROJECT, {}) == {}
    assert "team-cluster" not in emulator.api.store.firewalls[PROJECT]


def test_a_cluster_larger_than_the_users_cap_is_refused_before_anything_is_made(emulator, key_file, tmp_path):
    proc = run_playbook(
        emulator_env(emulator, key_file),
        "localhost,",
        str(role_play(tmp_path)),
        *("-e", "gcp_instance_count=5", "-e", "gcp_instance_max_count=4"),
    )
    assert proc.returncode != 0
    assert "gcp_instance_count is 5, larger than gcp_instance_max_count 4" in proc.stdout, proc.stdout[-3000:]
    assert emulator.stats["requests"] == 0  # not one Compute call: nothing was created or looked at
    assert emulator.instances(PROJECT) == []


def test_a_series_without_compact_placement_gets_its_vms_without_a_policy(emulator, key_file, tmp_path):
    proc = run_playbook(
        emulator_env(emulator, key_file),
        "localhost,",
        str(role_play(tmp_path)),
        *("-e", "gcp_instance_count=2", "-e", "gcp_instance_machine_type=n1-standard-8"),
        *("-e", "gcp_instance_gpu_type=nvidia-tesla-t4", "-e", "gcp_instance_gpu_count=1"),
    )
    assert recap(proc)["failed"] == 0, proc.stdout[-4000:]
    vms = cluster(emulator)
    assert sorted(vms) == ["forja-l4-0", "forja-l4-1"]
    assert all("resourcePolicies" not in vm for vm in vms.values())
    assert emulator.api.store.resource_policies.get(PROJECT, {}) == {}
