"""Changing a cluster's size: a smaller gcp_instance_count removes the highest ranks, a larger adds them.

The gcp_instance role run by ansible-playbook against the Compute emulator over real HTTP (no VM
boots); the inventory is the gcp_gpu plugin's listing of what the emulator holds.
"""

from __future__ import annotations

import pytest
import yaml
from cluster_plays import role_play
from gcp_helpers import REPO, emulator_env, inventory_json, run_inventory, run_playbook
from test_cluster_role import recap

PROJECT = "forja-sandbox"
ZONE = yaml.safe_load((REPO / "roles/gcp_instance/defaults/main.yml").read_text())["gcp_instance_zone"]
REGION = ZONE.rsplit("-", 1)[0]


def sized(count: int, *extra: str) -> tuple[str, ...]:
    return ("-e", "gcp_instance_name=team", "-e", f"gcp_instance_count={count}", *extra)


def members(emulator) -> dict[str, dict]:
    return {vm["name"]: vm for vm in emulator.instances(PROJECT)}


def sizes(emulator) -> dict[str, str]:
    return {name: vm["labels"]["forja-cluster-size"] for name, vm in members(emulator).items()}


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_a_smaller_count_removes_the_highest_ranks_and_a_larger_adds_them_back(emulator, key_file, tmp_path):
    env = emulator_env(emulator, key_file)
    play = str(role_play(tmp_path))
    spot = ("-e", "gcp_instance_spot=true")
    made = run_playbook(env, "localhost,", play, *sized(3, *spot))
    assert recap(made)["failed"] == 0, made.stdout[-4000:]
    emulator.preempt(PROJECT, ZONE, "team-2")  # a stopped member runs nothing: it goes without asking

    shrunk = run_playbook(env, "localhost,", play, *sized(2, *spot))
    assert recap(shrunk)["failed"] == 0, shrunk.stdout[-4000:]
    assert sizes(emulator) == {"team-0": "2", "team-1": "2"}
    policy = f"{emulator.base_url}projects/{PROJECT}/regions/{REGION}/resourcePolicies/team-compact"
    assert all(vm["resourcePolicies"] == [policy] for vm in members(emulator).values())
    again = run_playbook(env, "localhost,", play, *sized(2, *spot))
    assert recap(again)["changed"] == 0, again.stdout[-4000:]

    source = tmp_path / "forja.gcp_gpu.yml"
    source.write_text("plugin: forja.gpu.gcp_gpu\n")
    listed = inventory_json(run_inventory(env, source))
    assert sorted(listed["cluster_team"]["hosts"]) == ["team-0", "team-1"]
    hostvars = listed["_meta"]["hostvars"]
    ranks = {h: (hostvars[h]["forja_node_rank"], hostvars[h]["forja_node_count"]) for h in hostvars}
    assert ranks == {"team-0": (0, 2), "team-1": (1, 2)}

    grown = run_playbook(env, "localhost,", play, *sized(3, *spot))
    assert recap(grown)["failed"] == 0, grown.stdout[-4000:]
    assert sizes(emulator) == {"team-0": "3", "team-1": "3", "team-2": "3"}
    assert members(emulator)["team-2"]["resourcePolicies"] == [policy]
    assert members(emulator)["team-2"]["labels"]["forja-rank"] == "2"


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_a_running_member_is_removed_only_when_you_confirm_it(emulator, key_file, tmp_path):
    env = emulator_env(emulator, key_file)
    play = str(role_play(tmp_path))
    made = run_playbook(env, "localhost,", play, *sized(3))
    assert recap(made)["failed"] == 0, made.stdout[-4000:]

    refused = run_playbook(env, "localhost,", play, *sized(2))
    assert refused.returncode != 0
    said = " ".join(refused.stdout.split())
    assert "gcp_instance_count 2 removes team-2, which is running" in said, said[-3000:]
    assert "-e gcp_instance_remove_running_members=true" in said
    assert sizes(emulator) == {"team-0": "3", "team-1": "3", "team-2": "3"}  # nothing changed

    confirm = ("-e", "gcp_instance_remove_running_members=true")
    confirmed = run_playbook(env, "localhost,", play, *sized(2, *confirm))
    assert recap(confirmed)["failed"] == 0, confirmed.stdout[-4000:]
    assert sizes(emulator) == {"team-0": "2", "team-1": "2"}


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_teardown_removes_every_member_even_with_a_smaller_count(emulator, key_file, tmp_path):
    env = emulator_env(emulator, key_file)
    made = run_playbook(env, "localhost,", str(role_play(tmp_path)), *sized(3))
    assert recap(made)["failed"] == 0, made.stdout[-4000:]
    source = tmp_path / "forja.gcp_gpu.yml"
    source.write_text("plugin: forja.gpu.gcp_gpu\n")
    down = run_playbook(env, source, "playbooks/teardown.yml", *sized(2, "-e", "forja_teardown_delete=true"))
    assert down.returncode == 0, down.stdout[-4000:]
    assert emulator.instances(PROJECT) == []
    assert emulator.api.store.resource_policies.get(PROJECT, {}) == {}
    assert "team-cluster" not in emulator.api.store.firewalls[PROJECT]
