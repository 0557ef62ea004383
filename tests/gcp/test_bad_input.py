"""Every bad input fails with a message naming the field, its true cause (once) and the fix, and
creates nothing.

One ansible-playbook run checks them all (each step keeps its failure), then the emulator is
asked what exists: nothing, and no insert was even attempted except the two quota cases.
"""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from gcp_helpers import emulator_env, role_vm, run_module_tasks

PROJECT = "forja-sandbox"


@pytest.fixture
def bad_keys(key_file, tmp_path):
    malformed = tmp_path / "malformed.json"
    malformed.write_text('{"type": "service_account", "client_email": ')
    refused = tmp_path / "refused.json"
    info = json.loads(key_file.read_text())
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    info["private_key"] = other.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    refused.write_text(json.dumps(info))
    user_credentials = tmp_path / "adc.json"
    user_credentials.write_text(
        json.dumps({"type": "authorized_user", "client_id": "x", "refresh_token": "y"})
    )
    (tmp_path / "keys").mkdir()
    return {
        "malformed": str(malformed),
        "refused": str(refused),
        "missing": str(tmp_path / "missing.json"),
        "directory": str(tmp_path / "keys"),
        "user_credentials": str(user_credentials),
        "email": info["client_email"],
    }


CASES = {
    # register: (module options, the message starts with, and contains)
    "unknown_zone": (
        {"zone": "us-east9-z"},
        "zone:",
        "'us-east9-z' does not exist in project 'forja-sandbox'",
    ),
    "wrong_project": ({"project": "forja-sandbx"}, "project:", "'forja-sandbx' does not exist"),
    "unknown_machine_type": ({"machine_type": "n2-standard-8"}, "machine_type:", "not offered in us-east1-d"),
    "gpu_not_in_zone": ({"zone": "us-east1-c"}, "zone:", "nvidia-l4 is not offered in zone us-east1-c"),
    "gpu_not_in_fallback_zone": ({"fallback_zones": ["us-east1-c"]}, "fallback_zones:", "us-east1-c"),
    "l4_on_n1": ({"machine_type": "n1-standard-8", "gpu_type": "nvidia-l4"}, "gpu_type:", "G2"),
    "gpu_count": ({"gpu_count": 2}, "gpu_count:", "set gpu_count to 1"),
    "termination_without_spot": (
        {"instance_termination_action": "STOP"},
        "instance_termination_action:",
        "spot: true",
    ),
    "flex_start_on_n1": (
        {"provisioning_model": "flex_start", "max_run_duration": "1d", "machine_type": "n1-standard-8",
         "gpu_type": "nvidia-tesla-t4", "gpu_count": 1},
        "machine_type:",
        "'n1-standard-8' cannot be a Flex-start VM",
    ),
    "flex_start_over_7_days": (
        {"provisioning_model": "flex_start", "max_run_duration": "8d"}, "max_run_duration:", "at most 7 days",
    ),
    "flex_start_without_end": (
        {"provisioning_model": "flex_start"}, "max_run_duration:", "max_run_duration: 3d",
    ),
    "max_run_without_flex_start": (
        {"max_run_duration": "1d"}, "max_run_duration:", "provisioning_model: flex_start",
    ),
    "spot_against_model": (
        {"provisioning_model": "flex_start", "max_run_duration": "1d", "spot": True}, "spot:", "drop spot",
    ),
    "bad_name": ({"name": "Forja_L4"}, "name:", "lowercase"),
    "bad_label": ({"labels": {"Owner": "Alice"}}, "labels:", "lowercase"),
}


def test_bad_input_is_named_and_changes_nothing(emulator, key_file, bad_keys, tmp_path):
    emulator.faults.add(
        "instances.insert",
        status=403,
        zone="us-east1-d",
        reason="quotaExceeded",
        message="Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-east1.",
    )
    emulator.faults.add("instances.insert", error="QUOTA_EXCEEDED", zone="us-east1-b")
    base = {"name": "forja-l4", **role_vm()}
    module = "forja.gpu.gcp_gpu_instance"
    tasks = [{module: {**base, **options}, "register": name} for name, (options, _, _) in CASES.items()]
    tasks += [
        {module: {**base, "credentials_file": bad_keys["missing"]}, "register": "missing_key"},
        {module: {**base, "credentials_file": bad_keys["malformed"]}, "register": "malformed_key"},
        {module: {**base, "credentials_file": bad_keys["refused"]}, "register": "refused_key"},
        {module: {**base, "credentials_file": bad_keys["directory"]}, "register": "directory_key"},
        {module: {**base, "credentials_file": bad_keys["user_credentials"]}, "register": "user_key"},
        {module: {**base, "project": "forja-sandbx", "state": "absent"}, "register": "wrong_project_absent"},
        {
            "forja.gpu.gcp_gpu_firewall": {"project": "forja-sandbx"},
            "register": "wrong_project_firewall",
        },
        {
            module: {**base, "project": ""},
            "register": "no_project",
            "environment": {"FORJA_GCP_PROJECT": ""},
        },
        {module: base, "register": "quota_sync"},
        {module: {**base, "zone": "us-east1-b"}, "register": "quota_operation"},
    ]
    results = run_module_tasks(tmp_path, emulator_env(emulator, key_file), tasks)

    for name, (_options, field, fix) in CASES.items():
        result = results[name]
        assert result.get("failed"), (name, result)
        assert result["msg"].startswith(field), (name, result["msg"])
        assert fix in result["msg"], (name, result["msg"])
        assert not result.get("changed")
    for name in CASES:
        assert results[name]["msg"].count("What to do") <= 1, results[name]["msg"]
    assert "gcloud projects list" in results["wrong_project"]["msg"]
    for name in ("wrong_project_absent", "wrong_project_firewall"):
        assert results[name]["failed"] and results[name]["msg"].startswith("project: 'forja-sandbx'"), name
    assert (
        results["missing_key"]["msg"].startswith("credentials_file:")
        and "does not exist" in (results["missing_key"]["msg"])
    )
    directory = results["directory_key"]["msg"]
    assert directory.startswith("credentials_file:") and "is a directory, not a key file" in directory
    assert "does not exist" not in directory
    user_key = results["user_key"]["msg"]
    assert "type 'authorized_user'" in user_key and "auth_kind: application" in user_key
    assert (
        results["malformed_key"]["msg"].startswith("credentials_file:")
        and "not JSON" in (results["malformed_key"]["msg"])
    )
    refused = results["refused_key"]["msg"]
    assert refused.startswith("credentials:") and bad_keys["email"] in refused and "new key" in refused
    assert refused.count("invalid_grant") == 1, refused
    assert results["no_project"]["msg"].startswith("project:")
    assert "quota" in results["quota_sync"]["msg"].lower() and "HTTP 403" in results["quota_sync"]["msg"]
    assert results["quota_operation"]["error_code"] == "QUOTA_EXCEEDED"
    assert "request an increase" in results["quota_operation"]["msg"]

    assert emulator.instances(PROJECT) == []
    assert emulator.stats["by_method"].get("compute.instances.insert") == 2, (
        "only the two quota cases got that far"
    )
    assert "compute.firewalls.insert" not in emulator.stats["by_method"]
    assert "PRIVATE KEY" not in results["_stdout"]


def test_a_token_endpoint_that_answers_500_is_named_as_the_cause(emulator, key_file, tmp_path):
    emulator.faults.add("token", status=500, times=None)
    module = {"name": "forja-l4", **role_vm(), "state": "started", "create_if_missing": True}
    results = run_module_tasks(
        tmp_path, emulator_env(emulator, key_file), [{"forja.gpu.gcp_gpu_instance": module, "register": "vm"}]
    )
    msg = results["vm"]["msg"]
    assert msg.startswith("credentials: the token endpoint ") and "answered HTTP 500" in msg, msg
    assert "not at fault" in msg and "retry later" in msg, msg
    assert "new key" not in msg, "the key is fine: the server failed"
    assert msg.count("internal_failure") == 1, msg
    assert emulator.stats["token_requests"] == 3, "google-auth retries a 500 twice"
    assert emulator.stats["requests"] == 0 and emulator.instances(PROJECT) == []


def test_the_firewall_opens_ssh_from_iap_only(emulator, key_file, tmp_path):
    results = run_module_tasks(
        tmp_path,
        emulator_env(emulator, key_file),
        [
            {"forja.gpu.gcp_gpu_firewall": {}, "register": "created", "diff": True},
            {"forja.gpu.gcp_gpu_firewall": {}, "register": "again"},
            {
                "forja.gpu.gcp_gpu_firewall": {"source_ranges": ["35.235.240.0/20", "203.0.113.7"]},
                "register": "widened",
            },
            {"forja.gpu.gcp_gpu_firewall": {"source_ranges": ["0.0.0.0/0"]}, "register": "internet"},
            {"forja.gpu.gcp_gpu_firewall": {"state": "absent"}, "register": "removed"},
            {"forja.gpu.gcp_gpu_firewall": {"state": "absent"}, "register": "removed_again"},
        ],
    )
    assert results["created"]["changed"]
    assert results["created"]["firewall"] == {
        "name": "forja-allow-ssh",
        "network": "default",
        "source_ranges": ["35.235.240.0/20"],
        "target_tags": ["forja-ssh"],
        "ports": ["22"],
        "priority": 1000,
    }
    assert results["again"]["changed"] is False
    assert results["widened"]["changed"]
    assert results["widened"]["firewall"]["source_ranges"] == ["203.0.113.7/32", "35.235.240.0/20"]
    assert results["internet"]["failed"] and results["internet"]["msg"].startswith("source_ranges:")
    assert results["removed"]["changed"] and results["removed_again"]["changed"] is False
    inserted = [
        b
        for m, _p, _q, b in emulator.requests
        if m in ("compute.firewalls.insert", "compute.firewalls.patch")
    ]
    assert inserted and all(b["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}] for b in inserted)
