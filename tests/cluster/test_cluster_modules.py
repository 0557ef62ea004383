"""The cluster's modules on their own, through ansible-playbook against the emulator: bad input first."""

from __future__ import annotations

import pytest
from gcp_helpers import emulator_env, run_module_tasks

PROJECT = "forja-sandbox"


def policy(**options) -> dict:
    return {"forja.gpu.gcp_gpu_placement_policy": {"name": "team-compact", "zone": "us-east1-d", **options}}


@pytest.mark.slow  # 7 s or more: the host tier's CPU lane, not make check
def test_placement_policy_and_cluster_rule_refuse_bad_input_and_converge(emulator, key_file, tmp_path):
    results = run_module_tasks(
        tmp_path,
        emulator_env(emulator, key_file),
        [
            {**policy(machine_type="e2-standard-4"), "register": "e2"},
            {**policy(machine_type="e2-standard-4", unsupported="skip"), "register": "e2_skipped"},
            {**policy(machine_type="g2-standard-24"), "register": "made"},
            {**policy(machine_type="g2-standard-24"), "register": "again"},
            {
                "forja.gpu.gcp_gpu_firewall": {
                    "name": "team-cluster",
                    "cluster_tag": "team-cluster",
                    "admit_source": "203.0.113.7",
                },
                "register": "rule_with_address",
            },
            {**policy(state="absent"), "register": "gone"},
        ],
    )
    assert results["e2"]["failed"]
    assert results["e2"]["msg"].startswith("machine_type: Compute Engine takes no compact placement policy")
    assert "gcp_instance_compact_placement=false" in results["e2"]["msg"]
    assert results["e2_skipped"]["supported"] is False and not results["e2_skipped"]["changed"]
    assert results["made"]["changed"] and results["made"]["supported"]
    assert results["made"]["policy"].endswith("/regions/us-east1/resourcePolicies/team-compact")
    assert not results["again"]["changed"]
    assert results["rule_with_address"]["failed"]
    assert results["rule_with_address"]["msg"].startswith("admit_source: a cluster rule admits no address")
    assert "team-cluster" not in emulator.api.store.firewalls[PROJECT]
    assert results["gone"]["changed"]
    assert emulator.api.store.resource_policies.get(PROJECT, {}) == {}
    inserts = [r for r in emulator.requests if r[0] == "compute.resourcePolicies.insert"]
    assert len(inserts) == 1  # the refused and the skipped calls made nothing
