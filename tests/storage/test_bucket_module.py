"""forja.gpu.gcp_gpu_bucket run for real (ansible-playbook on localhost, the repository's ansible.cfg)
against the sandbox's storage emulator; what it did is read back with Google's own client."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator

import pytest
from gcp_helpers import offline_env, run_module_tasks
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from forja_sandbox.service import PROJECT
from forja_sandbox.storage_emulator import StorageEmulator

MODULE = "forja.gpu.gcp_gpu_bucket"
VM = "forja-vm@forja-sandbox.iam.gserviceaccount.com"
RULE = {"action": {"type": "Delete"}, "condition": {"age": 30, "matchesPrefix": ["checkpoints/"]}}


def env_for(url: str) -> dict[str, str]:
    return offline_env({"STORAGE_EMULATOR_HOST": url, "FORJA_GCP_PROJECT": PROJECT})


def object_admins(bucket: storage.Bucket) -> set[str]:
    policy = bucket.get_iam_policy(requested_policy_version=3)
    return {m for b in policy.bindings if b["role"] == "roles/storage.objectAdmin" for m in b["members"]}


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_create_then_nothing_to_do_then_drift_repaired(
    emulator: StorageEmulator, client: storage.Client, bucket_name: str, tmp_path
) -> None:
    want = {"name": bucket_name, "location": "us-central1", "service_account_email": VM}
    results = run_module_tasks(tmp_path, env_for(emulator.url), [
        {MODULE: want, "check_mode": True, "register": "check"},
        {"ansible.builtin.uri": {"url": f"{emulator.url}/storage/v1/b/{bucket_name}", "status_code": [404]},
         "register": "absent_after_check"},
        {MODULE: want, "diff": True, "register": "created"},
        {MODULE: want, "register": "again"},
    ])
    assert results["check"]["changed"] is True and not results["check"].get("failed"), results["check"]
    assert results["absent_after_check"]["status"] == 404, "check mode created the bucket"
    assert results["created"]["changed"] is True, results["created"]
    assert results["created"]["diff"]["before"] == {}
    assert results["again"]["changed"] is False, results["again"]
    assert results["again"]["url"] == f"gs://{bucket_name}"
    assert results["again"]["bucket"] == {
        "name": bucket_name, "location": "US-CENTRAL1", "uniform_bucket_level_access": True,
        "public_access_prevention": "enforced", "checkpoint_lifecycle_rule": RULE,
        "object_admins": [f"serviceAccount:{VM}"]}

    bucket = client.get_bucket(bucket_name)
    assert bucket.location == "US-CENTRAL1"
    assert bucket.iam_configuration.uniform_bucket_level_access_enabled is True
    assert bucket.iam_configuration.public_access_prevention == "enforced"
    assert [dict(r) for r in bucket.lifecycle_rules] == [RULE]
    assert object_admins(bucket) == {f"serviceAccount:{VM}"}

    # Drift by hand: forja's rule gone (a user's own rule added), access opened up, the grant removed.
    users_rule = {"action": {"type": "Delete"}, "condition": {"age": 365, "matchesPrefix": ["logs/"]}}
    bucket.lifecycle_rules = [users_rule]
    bucket.iam_configuration.uniform_bucket_level_access_enabled = False
    bucket.iam_configuration.public_access_prevention = "inherited"
    bucket.patch()
    policy = bucket.get_iam_policy(requested_policy_version=3)
    policy.bindings = [{"role": "roles/storage.objectViewer", "members": {"user:someone@example.com"}}]
    bucket.set_iam_policy(policy)

    results = run_module_tasks(tmp_path, env_for(emulator.url), [
        {MODULE: want, "diff": True, "register": "repaired"},
        {MODULE: want, "register": "settled"},
        {MODULE: {**want, "checkpoint_retention_days": 7}, "register": "shorter"},
    ])
    assert results["repaired"]["changed"] is True, results["repaired"]
    before = results["repaired"]["diff"]["before"]
    assert before["checkpoint_lifecycle_rule"] is None and before["uniform_bucket_level_access"] is False
    assert results["settled"]["changed"] is False, results["settled"]
    assert results["shorter"]["changed"] is True
    bucket = client.get_bucket(bucket_name)
    assert [dict(r) for r in bucket.lifecycle_rules] == [
        users_rule, {**RULE, "condition": {"age": 7, "matchesPrefix": ["checkpoints/"]}},
    ], "the user's own rule is kept, forja's is put back"
    assert bucket.iam_configuration.uniform_bucket_level_access_enabled is True
    assert bucket.iam_configuration.public_access_prevention == "enforced"
    policy = bucket.get_iam_policy(requested_policy_version=3)
    assert {b["role"]: set(b["members"]) for b in policy.bindings} == {
        "roles/storage.objectViewer": {"user:someone@example.com"},
        "roles/storage.objectAdmin": {f"serviceAccount:{VM}"},
    }, "the grant is put back; nobody else's is taken away"


def test_absent_refuses_a_bucket_with_objects_unless_forced(
    emulator: StorageEmulator, client: storage.Client, bucket_name: str, tmp_path
) -> None:
    client.create_bucket(bucket_name).blob("checkpoints/r1/ckpt-1.pt").upload_from_string(b"x")
    gone = {"name": bucket_name, "state": "absent"}
    results = run_module_tasks(tmp_path, env_for(emulator.url), [
        {MODULE: gone, "register": "refused"},
        {MODULE: {**gone, "force": True}, "check_mode": True, "register": "check"},
        {MODULE: {**gone, "force": True}, "register": "removed"},
        {MODULE: gone, "register": "again"},
    ])
    assert results["refused"]["failed"] and results["refused"]["msg"].startswith("force:"), results["refused"]
    assert results["check"]["changed"] is True
    assert results["removed"]["changed"] is True, results["removed"]
    assert results["again"]["changed"] is False
    assert client.lookup_bucket(bucket_name) is None


BAD = {
    # register: (options, the message starts with, and contains)
    "uppercase": ({"name": "Forja_Checkpoints"}, "name:", "lower-case letters"),
    "too_short": ({"name": "ab"}, "name:", "3-63 characters"),
    "goog": ({"name": "goog-checkpoints"}, "name:", "'goog'"),
    "ip": ({"name": "192.168.5.4"}, "name:", "IP address"),
    "dash_end": ({"name": "forja-"}, "name:", "start and end"),
    "location": ({"location": "mars"}, "location:", "us-central1"),
    "no_location": ({"location": None}, "location:", "required"),
    "account": ({"service_account_email": "me@example.com"}, "service_account_email:", "gserviceaccount.com"),
    "retention": ({"checkpoint_retention_days": -1}, "checkpoint_retention_days:", "0"),
    "prefix": ({"checkpoint_prefix": ""}, "checkpoint_prefix:", "every old object"),
}


def test_bad_input_is_refused_naming_the_field_and_nothing_is_created(
    emulator: StorageEmulator, client: storage.Client, bucket_name: str, tmp_path
) -> None:
    other = storage.Client(project="someone-else", credentials=AnonymousCredentials())
    other.create_bucket(f"{bucket_name}-theirs")
    before = {b.name for b in other.list_buckets(project="someone-else")}
    base = {"name": bucket_name, "location": "us-central1"}
    tasks = [{MODULE: {**base, **options}, "register": name} for name, (options, _, _) in BAD.items()]
    tasks.append({MODULE: {**base, "name": f"{bucket_name}-theirs"}, "register": "theirs"})
    tasks.append({MODULE: {**base, "name": f"{bucket_name}-theirs", "state": "absent"},
                  "register": "theirs_absent"})
    results = run_module_tasks(tmp_path, env_for(emulator.url), tasks)
    for name, (_options, field, fix) in BAD.items():
        result = results[name]
        assert result.get("failed") and not result.get("changed"), (name, result)
        assert result["msg"].startswith(field) and fix in result["msg"], (name, result["msg"])
    for name in ("theirs", "theirs_absent"):
        assert results[name]["failed"], results[name]
        assert results[name]["msg"].startswith("name:") and "another project" in results[name]["msg"]
    assert [b.name for b in client.list_buckets(prefix=bucket_name)] == [], "something was created"
    assert {b.name for b in other.list_buckets(project="someone-else")} == before, "theirs was touched"


class _Forbidden(http.server.BaseHTTPRequestHandler):
    """Cloud Storage's answer to a bucket these credentials may not read (another project's)."""

    def do_GET(self) -> None:
        body = json.dumps({"error": {"code": 403, "message": "forja-ci@forja-sandbox.iam.gserviceaccount.com "
                                     "does not have storage.buckets.get access to the Google Cloud Storage "
                                     "bucket. Permission 'storage.buckets.get' denied on resource (or it may "
                                     "not exist).", "errors": [{"reason": "forbidden"}]}}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.asked.append(self.path)  # type: ignore[attr-defined]

    do_POST = do_PATCH = do_PUT = do_DELETE = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def forbidding() -> Iterator[http.server.HTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
    server.asked = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_a_bucket_these_credentials_may_not_read_is_refused_saying_why(forbidding, tmp_path) -> None:
    url = f"http://127.0.0.1:{forbidding.server_address[1]}"
    with socket.socket() as probe:  # a port nobody listens on: a stopped emulator
        probe.bind(("127.0.0.1", 0))
        stopped = f"http://127.0.0.1:{probe.getsockname()[1]}"
    want = {"name": "forja-taken", "location": "us-central1"}
    results = run_module_tasks(tmp_path, env_for(url), [
        {MODULE: want, "register": "taken"},
        {MODULE: {**want, "storage_emulator_host": stopped, "request_timeout": 2}, "register": "stopped"},
        # Google's endpoint: the credentials come from the same options as every gcp_gpu_* module.
        {MODULE: {**want, "credentials_file": str(tmp_path / "missing.json")},
         "environment": {"STORAGE_EMULATOR_HOST": ""}, "register": "no_key"},
    ])
    msg = results["taken"]["msg"]
    assert results["taken"]["failed"] and msg.startswith("name:"), msg
    assert "403" in msg and "storage.buckets.get" in msg and "another project" in msg, msg
    assert forbidding.asked, "the module never asked"
    assert all(path.startswith("/storage/v1/b/forja-taken?") for path in forbidding.asked), forbidding.asked
    msg = results["stopped"]["msg"]
    assert results["stopped"]["failed"] and msg.startswith(f"the emulator at {stopped}: ConnectionError"), msg
    assert msg.endswith("check storage_emulator_host"), msg
    msg = results["no_key"]["msg"]
    assert results["no_key"]["failed"] and msg.startswith("credentials_file:") and "missing.json" in msg, msg


def test_in_process_and_shipped_the_module_answers_alike(
    emulator: StorageEmulator, client: storage.Client, bucket_name: str, tmp_path
) -> None:
    # The action plugin runs the module's run() in Ansible's process; a task with an environment ships
    # the module instead (plugin_utils/forja_in_process.py). Both must keep the bucket the same way.
    want = {"name": bucket_name, "location": "us-central1", "service_account_email": VM}
    shipped = {"environment": {"STORAGE_EMULATOR_HOST": emulator.url}}
    results = run_module_tasks(tmp_path, env_for(emulator.url), [
        {MODULE: want, **shipped, "check_mode": True, "diff": True, "register": "plan_shipped"},
        {MODULE: want, "check_mode": True, "diff": True, "register": "plan_in_process"},
        {MODULE: want, **shipped, "register": "created_shipped"},
        {MODULE: want, "register": "again_in_process"},
        {MODULE: {**want, "checkpoint_retention_days": 7}, "check_mode": True,
         "register": "shorter_in_process"},
    ])
    for key in ("plan_shipped", "plan_in_process"):
        assert results[key]["changed"] is True and results[key]["diff"]["before"] == {}, results[key]
    assert results["plan_shipped"]["diff"] == results["plan_in_process"]["diff"]
    assert results["created_shipped"]["changed"] is True, results["created_shipped"]
    assert results["again_in_process"]["changed"] is False, results["again_in_process"]
    assert results["again_in_process"]["bucket"] == results["created_shipped"]["bucket"]
    assert results["shorter_in_process"]["changed"] is True
    assert [dict(r) for r in client.get_bucket(bucket_name).lifecycle_rules] == [RULE]  # check mode kept it
