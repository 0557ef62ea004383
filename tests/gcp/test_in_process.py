"""forja's controller-side GCP modules run inside Ansible's process, and as modules where they must.

Their action plugins (plugin_utils/forja_in_process.py) run each module's run() in Ansible's own process
when the task runs on the controller; a task with an `environment` (or become, or another host's
connection) ships the module as usual. Both paths must give the same answers, against the emulator.
"""

from __future__ import annotations

from gcp_helpers import emulator_env, role_vm, run_module_tasks

# Any environment makes Ansible ship the module; the shipped module reads its project from it.
SHIPPED = {"environment": {"FORJA_GCP_PROJECT": "forja-sandbox"}}
ELSEWHERE = {"environment": {"FORJA_GCP_PROJECT": "forja-elsewhere"}}


def test_the_firewall_and_instance_modules_answer_alike_in_process_and_shipped(emulator, key_file, tmp_path):
    rule = {"forja.gpu.gcp_gpu_firewall": {"name": "forja-allow-ssh"}}
    other = {"forja.gpu.gcp_gpu_firewall": {"name": "forja-allow-ssh", "source_ranges": ["203.0.113.7/32"]}}
    vm = {"forja.gpu.gcp_gpu_instance": {"name": "forja-l4", **role_vm()}}
    bad_vm = {"forja.gpu.gcp_gpu_instance": {"name": "forja-l4", **role_vm(), "ip_preference": ["ipv6"]}}
    results = run_module_tasks(tmp_path, emulator_env(emulator, key_file), [
        {**rule, "register": "rule_in_process"},
        {**rule, **SHIPPED, "register": "rule_shipped"},
        {**other, "check_mode": True, "diff": True, "register": "plan_in_process"},
        {**other, **SHIPPED, "check_mode": True, "diff": True, "register": "plan_shipped"},
        {**vm, "check_mode": True, "diff": True, "register": "vm_in_process"},
        {**vm, **SHIPPED, "check_mode": True, "diff": True, "register": "vm_shipped"},
        {**bad_vm, "register": "bad_in_process"},
        {**bad_vm, **SHIPPED, "register": "bad_shipped"},
        {"forja.gpu.gcp_gpu_firewall": {"name": "forja-allow-ssh", "priority": "high"},
         "register": "type_in_process"},
        {**rule, **ELSEWHERE, "register": "rule_elsewhere"},
    ])
    assert results["rule_in_process"]["changed"] is True
    assert results["rule_shipped"]["changed"] is False
    # Only a shipped module sees the task's environment: here, a project the emulator does not have.
    assert results["rule_elsewhere"]["failed"] and "forja-elsewhere" in results["rule_elsewhere"]["msg"]
    assert results["rule_shipped"]["firewall"] == results["rule_in_process"]["firewall"]

    def same(a: dict, b: dict) -> None:
        def strip(r: dict) -> dict:
            return {k: v for k, v in r.items() if k not in ("invocation", "warnings", "deprecations")}
        assert strip(a) == strip(b), (a, b)

    same(results["plan_in_process"], results["plan_shipped"])
    assert results["plan_in_process"]["changed"] is True
    assert results["plan_in_process"]["diff"]["after"]["source_ranges"] == ["203.0.113.7/32"]
    same(results["vm_in_process"], results["vm_shipped"])
    assert results["vm_in_process"]["actions"] == ["insert in us-east1-d"]
    for key in ("bad_in_process", "bad_shipped"):
        assert results[key]["failed"], results[key]
        assert results[key]["msg"] == "ip_preference: 'ipv6' must be public_ip or private_ip"
    assert results["type_in_process"]["failed"] and "priority" in results["type_in_process"]["msg"]
    assert not any(m == "compute.instances.insert" for m, *_ in emulator.requests), "check mode inserted a VM"
