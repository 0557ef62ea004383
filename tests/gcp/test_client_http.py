"""The shared Compute client against the emulator over real HTTP: auth, retries, paging, operations."""

from __future__ import annotations

import datetime
import itertools
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest
from ansible.errors import AnsibleParserError
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    GcpApiError,
    GcpAuthError,
    GcpClient,
    GcpConfig,
    GcpNetworkError,
    GcpOperationError,
    read_key_file,
)
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

PROJECT = "forja-sandbox"


def make_client(emulator, key_file, **overrides) -> GcpClient:
    config = GcpConfig(
        project=PROJECT,
        api_url=emulator.base_url,
        credentials_file=str(key_file),
        retry_base_s=0.01,
        env={},
        **overrides,
    )
    return GcpClient(config)


def test_one_token_serves_every_request_of_a_run(emulator, key_file):
    emulator.seed_instances(PROJECT, "us-east1-d", 3)
    client = make_client(emulator, key_file)
    for _ in range(5):
        client.get_instance(PROJECT, "us-east1-d", "seed-0")
    client.zone_instances(PROJECT, "us-east1-d")
    assert emulator.stats["token_requests"] == 1
    assert emulator.stats["requests"] == 6


def test_the_token_is_refreshed_only_once_it_expired(emulator, key_file):
    client = make_client(emulator, key_file)
    client.get_instance(PROJECT, "us-east1-d", "nope")
    client._credentials.expiry = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - (
        datetime.timedelta(seconds=1)
    )
    client.get_instance(PROJECT, "us-east1-d", "nope")
    client.get_instance(PROJECT, "us-east1-d", "nope")
    assert emulator.stats["token_requests"] == 2


def test_settings_come_from_the_environment_when_options_are_empty(emulator, key_file):
    config = GcpConfig(
        env={
            "FORJA_GCP_API_URL": emulator.base_url,
            "FORJA_GCP_CREDENTIALS_FILE": str(key_file),
            "FORJA_GCP_PROJECT": PROJECT,
        }
    )
    client = GcpClient(config)
    assert config.resolved_project() == PROJECT
    assert client.get_instance(PROJECT, "us-east1-d", "nope") is None
    assert emulator.stats["token_requests"] == 1


def test_google_auths_background_lookup_is_real_and_caught_by_the_guard(
    emulator, key_file, no_outbound_network
):
    """Evidence for the design: AuthorizedSession (google-auth >= 2.55) calls iamcredentials."""
    import google.auth.transport.requests
    import google.oauth2.service_account

    creds = google.oauth2.service_account.Credentials.from_service_account_file(
        str(key_file), scopes=["https://www.googleapis.com/auth/compute"]
    )
    session = google.auth.transport.requests.AuthorizedSession(creds)
    session.get(emulator.base_url + f"projects/{PROJECT}/zones/us-east1-d/instances")
    deadline = time.monotonic() + 5
    while not no_outbound_network and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("googleapis.com" in attempt for attempt in no_outbound_network)
    no_outbound_network.clear()


def test_our_client_never_starts_that_lookup(emulator, key_file, no_outbound_network):
    threads_before = set(threading.enumerate())
    client = make_client(emulator, key_file)
    client.zone_instances(PROJECT, "us-east1-d")
    client._credentials.token = None
    client.zone_instances(PROJECT, "us-east1-d")
    time.sleep(0.3)
    assert no_outbound_network == []
    new_threads = {t.name for t in set(threading.enumerate()) - threads_before}
    assert {n for n in new_threads if "process_request" not in n} == set()  # only the emulator's handlers
    assert "x-allowed-locations" not in {k.lower() for k in client.session.headers}


@pytest.mark.parametrize("status", [429, 503, 500])
def test_transient_errors_are_retried_with_backoff(emulator, key_file, status):
    emulator.seed_instances(PROJECT, "us-east1-d", 1)
    emulator.faults.add("instances.get", status=status, times=2)
    client = make_client(emulator, key_file)
    assert client.get_instance(PROJECT, "us-east1-d", "seed-0")["name"] == "seed-0"
    assert client.stats["retries"] == 2
    assert emulator.stats["by_method"]["compute.instances.get"] == 3


def test_retries_give_up_with_a_message_that_says_what_happened(emulator, key_file):
    emulator.faults.add("instances.get", status=503, times=None)
    client = make_client(emulator, key_file, max_retries=2)
    with pytest.raises(GcpApiError) as caught:
        client.get_instance(PROJECT, "us-east1-d", "seed-0")
    assert caught.value.status == 503
    assert "HTTP 503" in caught.value.message
    assert emulator.stats["by_method"]["compute.instances.get"] == 3


def test_a_retried_mutation_keeps_its_request_id(emulator, key_file):
    emulator.faults.add("instances.stop", status=503, times=1)
    emulator.seed_instances(PROJECT, "us-east1-d", 1)
    client = make_client(emulator, key_file)
    client.request("POST", f"projects/{PROJECT}/zones/us-east1-d/instances/seed-0/stop")
    ids = [q.get("requestId") for m, _p, q, _b in emulator.requests if m == "compute.instances.stop"]
    assert len(ids) == 2 and ids[0] == ids[1] and ids[0] is not None


def test_an_unreachable_api_is_a_network_error_naming_the_setting(key_file):
    config = GcpConfig(
        project=PROJECT,
        api_url="http://127.0.0.1:9/compute/v1/",
        credentials_file=str(key_file),
        max_retries=1,
        retry_base_s=0.01,
        env={},
    )
    client = GcpClient(config)
    client._static_token = "t"  # no token endpoint either: test the API path alone
    with pytest.raises(GcpNetworkError, match="api_url"):
        client.get_instance(PROJECT, "us-east1-d", "x")


def test_paging_follows_next_page_token(emulator, key_file):
    emulator.seed_instances(PROJECT, "us-east1-d", 700)
    emulator.seed_instances(PROJECT, "us-east1-b", 500)
    client = make_client(emulator, key_file)
    assert len(client.aggregated_instances(PROJECT)) == 1200
    assert emulator.stats["by_method"]["compute.instances.aggregatedList"] == 3
    assert len(client.zone_instances(PROJECT, "us-east1-d", max_results=300)) == 700
    assert emulator.stats["by_method"]["compute.instances.list"] == 3


def test_a_done_operation_with_an_error_fails_with_its_code_zone_and_fix(emulator, key_file):
    emulator.faults.add("instances.insert", error="ZONE_RESOURCE_POOL_EXHAUSTED", zone="us-east1-d")
    client = make_client(emulator, key_file)
    body = {
        "name": "vm",
        "machineType": "zones/us-east1-d/machineTypes/g2-standard-8",
        "scheduling": {"onHostMaintenance": "TERMINATE"},
        "disks": [
            {
                "boot": True,
                "initializeParams": {
                    "sourceImage": "projects/deeplearning-platform-release/global/images/family/"
                    "pytorch-2-7-cu128-ubuntu-2204-nvidia-570"
                },
            }
        ],
        "networkInterfaces": [{}],
    }
    op = client.request("POST", f"projects/{PROJECT}/zones/us-east1-d/instances", body=body)
    with pytest.raises(GcpOperationError) as caught:
        client.wait_operation(op, project=PROJECT, timeout_s=30)
    assert caught.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert caught.value.zone == "us-east1-d"
    assert "us-east1-d" in caught.value.message and "fallback_zones" in caught.value.message


def test_an_operation_past_its_deadline_fails_naming_the_timeout(emulator, key_file):
    emulator.seed_instances(PROJECT, "us-east1-d", 1)
    emulator.operation_delay_s = 3.0
    client = make_client(emulator, key_file)
    op = client.request("POST", f"projects/{PROJECT}/zones/us-east1-d/instances/seed-0/stop")
    with pytest.raises(GcpOperationError, match="operation_timeout") as caught:
        client.wait_operation(op, project=PROJECT, timeout_s=0.5)
    assert caught.value.code == "TIMEOUT"


def test_not_found_and_permission_errors_say_what_to_do(emulator, key_file):
    client = make_client(emulator, key_file)
    with pytest.raises(GcpApiError) as caught:
        client.aggregated_instances("no-such-project")
    assert caught.value.status in (403, 404)
    assert "What to do" in caught.value.message


def test_a_missing_key_file_is_named(tmp_path):
    client = GcpClient(
        GcpConfig(api_url="http://127.0.0.1:9/", credentials_file=str(tmp_path / "nope.json"), env={})
    )
    with pytest.raises(GcpAuthError, match=r"^credentials_file: .*nope.json' does not exist"):
        client.token()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not JSON (line 1, column 2)"),
        ("[1, 2]", "is JSON but a list, not a key object"),
        (b"0\x82\x09\xa2\x02\x01\x03", "is not a text file (a P12 key?)"),
        (json.dumps({"type": "authorized_user", "client_id": "x"}), "type 'authorized_user'"),
        (json.dumps({"type": "external_account"}), "workload identity federation"),
        (json.dumps({"web": {"client_id": "x.apps.googleusercontent.com"}}),
         'is an OAuth client secret (top-level "web"), not a service-account key'),
        (json.dumps({"type": "gdch_service_account"}), "type 'gdch_service_account', not a service-account"),
        (json.dumps({"type": "service_account", "client_email": "a@b"}), "lacks private_key, token_uri"),
        (
            json.dumps(
                {
                    "type": "service_account",
                    "client_email": "a@b",
                    "private_key": "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
                    "token_uri": "http://127.0.0.1:9/",
                }
            ),
            "the private_key of the service-account key for 'a@b' cannot be loaded",
        ),
    ],
)
def test_a_malformed_key_is_named_without_echoing_it(tmp_path, content, message):
    path = tmp_path / "key.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    client = GcpClient(GcpConfig(api_url="http://127.0.0.1:9/", credentials_file=str(path), env={}))
    with pytest.raises(GcpAuthError) as caught:
        client.token()
    assert caught.value.message.startswith("credentials_file:")
    assert message in caught.value.message
    assert "AAAA" not in caught.value.message
    error = caught.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__), (
        "no chained cause: the message already says it"
    )


def test_a_key_path_that_is_a_directory_says_so(tmp_path):
    with pytest.raises(GcpAuthError) as caught:
        read_key_file(str(tmp_path))
    assert caught.value.message == (
        f"credentials_file: '{tmp_path}' is a directory, not a key file; point credentials_file (or "
        "FORJA_GCP_CREDENTIALS_FILE) at the service-account JSON key file inside it"
    )


def _read_as_nobody(path) -> str:
    """read_key_file's error for a user who may not read the file (root reads every file)."""
    if os.geteuid() != 0:
        with pytest.raises(GcpAuthError) as caught:
            read_key_file(str(path))
        return caught.value.message
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child drops to nobody, tries, reports through the pipe, and exits at once
        try:
            os.close(reader)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                read_key_file(str(path))
                answer = "read it"
            except GcpAuthError as exc:
                answer = exc.message
            os.write(writer, answer.encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(pid, 0)
    return answer


def test_a_key_file_the_user_cannot_read_names_the_user_and_the_fix(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    key = shared / "sa.json"
    key.write_text("{}")
    key.chmod(0o000 if os.geteuid() != 0 else 0o600)  # root's 0600 file: nobody cannot read it
    # every folder from the temporary root down (under xdist one more: popen-gwN) lets others pass
    temp_root = Path(tempfile.gettempdir())
    for directory in (shared, tmp_path, *itertools.takewhile(lambda d: d != temp_root, tmp_path.parents)):
        directory.chmod(directory.stat().st_mode | 0o711)
    message = _read_as_nobody(key)
    assert message.startswith(f"credentials_file: '{key}' cannot be read by the user running Ansible (")
    assert "permission denied; give that user read access" in message
    shared.chmod(0o700)  # now the directory above it stops that user
    if os.geteuid() == 0:
        message = _read_as_nobody(key)
        assert "permission denied on a directory above it" in message and "does not exist" not in message


def test_a_key_the_token_endpoint_refuses_names_the_account_and_the_fix(emulator, key_file):
    info = json.loads(key_file.read_text())
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    info["private_key"] = other.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    key_file.write_text(json.dumps(info))
    client = make_client(emulator, key_file)
    with pytest.raises(GcpAuthError) as caught:
        client.get_instance(PROJECT, "us-east1-d", "x")
    assert info["client_email"] in caught.value.message
    assert "with HTTP 400: invalid_grant" in caught.value.message
    assert "create a new key" in caught.value.message
    assert "PRIVATE KEY" not in caught.value.message
    assert emulator.stats["token_requests"] == 1, "a refusal is not retried"


@pytest.mark.parametrize("status", [500, 503])
def test_a_token_endpoint_failing_is_its_own_fault_not_the_keys(emulator, key_file, status):
    emulator.faults.add("token", status=status, times=None)
    client = make_client(emulator, key_file)
    with pytest.raises(GcpAuthError) as caught:
        client.get_instance(PROJECT, "us-east1-d", "x")
    message = caught.value.message
    assert f"the token endpoint {emulator.token_uri} failed: it answered HTTP {status}" in message
    assert "3 times" in message and "not at fault: retry later" in message
    assert "new key" not in message
    assert emulator.stats["requests"] == 0


def test_a_token_endpoint_recovering_within_the_retries_is_no_error(emulator, key_file):
    emulator.faults.add("token", status=500, times=1)
    client = make_client(emulator, key_file)
    assert client.get_instance(PROJECT, "us-east1-d", "x") is None
    assert emulator.stats["token_requests"] == 2


def test_a_wrong_project_is_named_not_the_zone_or_resource(emulator, key_file):
    client = make_client(emulator, key_file)
    with pytest.raises(GcpApiError) as caught:
        client.require_project("forja-sandbx")
    assert caught.value.message.startswith("project: 'forja-sandbx' does not exist, or the service account ")
    client.require_project(PROJECT)  # the right one passes
    with pytest.raises(GcpApiError) as listed:
        client.zone_instances("forja-sandbx", "us-east1-d")
    assert "What to do: project 'forja-sandbx' does not exist" in listed.value.message


@pytest.mark.parametrize("fault", ["token500", "directory", "refused"])
def test_an_error_wrapped_by_ansible_states_its_cause_once(emulator, key_file, tmp_path, fault):
    """Ansible appends each exception's cause to its message; ours carry no cause to repeat."""
    if fault == "token500":
        emulator.faults.add("token", status=500, times=None)
    elif fault == "directory":
        key_file = tmp_path
    else:  # a key the token endpoint does not know: 400 invalid_grant
        info = json.loads(key_file.read_text())
        info["private_key"] = (
            rsa.generate_private_key(public_exponent=65537, key_size=2048)
            .private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            .decode()
        )
        key_file.write_text(json.dumps(info))
    client = make_client(emulator, key_file)
    with pytest.raises(GcpAuthError) as caught:
        client.get_instance(PROJECT, "us-east1-d", "x")
    cause = caught.value.message
    try:  # what the inventory plugin does with it
        raise AnsibleParserError(
            f"gcp_gpu: listing VMs failed: {cause}", orig_exc=caught.value
        ) from caught.value
    except AnsibleParserError as wrapped:
        shown = str(wrapped)  # Ansible's own formatting, causes appended
    assert shown == f"gcp_gpu: listing VMs failed: {cause}"


def test_an_access_token_needs_no_token_request(emulator):
    client = GcpClient(GcpConfig(api_url=emulator.base_url, access_token=emulator.issue_token(), env={}))
    assert client.get_instance(PROJECT, "us-east1-d", "x") is None
    assert emulator.stats["token_requests"] == 0


def test_a_token_the_server_no_longer_accepts_is_refreshed_once(emulator, key_file):
    client = make_client(emulator, key_file)
    client.get_instance(PROJECT, "us-east1-d", "x")
    client._credentials.token = "ya29.revoked"  # still "valid" locally: only the server can tell
    assert client.get_instance(PROJECT, "us-east1-d", "x") is None
    assert emulator.stats["token_requests"] == 2
