"""Guest attributes: a VM writes them to its metadata server; the Compute API reads them back,
also while the VM is stopped (how forja learns why autostop stopped it).

The guest is this test, calling from 127.0.0.1, the address a backend gives the instance; reads go
through Google's own discovery-based client (google-api-python-client) as well as plain HTTP.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import google.oauth2.credentials
import pytest
import requests
from emulator_helpers import PROJECT, ZONE, Client, small_body
from googleapiclient.discovery import build_from_document
from googleapiclient.errors import HttpError

from forja_sandbox.compute_emulator import ComputeEmulator
from forja_sandbox.compute_emulator.metadata_server import MetadataServer
from forja_sandbox.compute_emulator.operations import Loopback
from forja_sandbox.compute_emulator.schema import discovery

ENABLED = {"items": [{"key": "enable-guest-attributes", "value": "TRUE"}]}
GUEST = {"Metadata-Flavor": "Google"}



@pytest.fixture
def metadata(emu: ComputeEmulator) -> Iterator[MetadataServer]:
    emu.backend = Loopback()
    with MetadataServer(emu.api, "127.0.0.1", 0) as server:
        yield server


def attribute_url(server: MetadataServer, path: str = "forja/autostop") -> str:
    return f"{server.url}/instance/guest-attributes/{path}"


def google_client(emu: ComputeEmulator) -> Any:
    creds = google.oauth2.credentials.Credentials(emu.issue_token())
    return build_from_document(discovery(), credentials=creds,
                               client_options={"api_endpoint": f"{emu.url}/compute/v1/"})


def test_a_guest_writes_and_the_api_reads_it_back_while_the_vm_is_stopped(
    emu: ComputeEmulator, client: Client, metadata: MetadataServer,
) -> None:
    client.insert(small_body("vm-1", metadata=ENABLED))
    said = requests.put(attribute_url(metadata), data="idle for 1800 s", headers=GUEST, timeout=10)
    assert said.status_code == 200 and said.headers["Metadata-Flavor"] == "Google"
    assert requests.get(attribute_url(metadata), headers=GUEST, timeout=10).text == "idle for 1800 s"
    client.wait(client.ok(client.post(f"zones/{ZONE}/instances/vm-1/stop")))

    api = google_client(emu)
    one = api.instances().getGuestAttributes(project=PROJECT, zone=ZONE, instance="vm-1",
                                             variableKey="forja/autostop").execute()
    assert (one["kind"], one["variableKey"], one["variableValue"]) == (
        "compute#guestAttributes", "forja/autostop", "idle for 1800 s")
    listed = api.instances().getGuestAttributes(project=PROJECT, zone=ZONE, instance="vm-1",
                                                queryPath="forja/").execute()
    assert listed["queryValue"]["items"] == [
        {"namespace": "forja", "key": "autostop", "value": "idle for 1800 s"}]
    instance = client.ok(client.get(f"zones/{ZONE}/instances/vm-1"))
    assert "idle for" not in json.dumps(instance), "guest attributes are not part of the instance resource"


def test_an_unset_key_is_not_found(emu: ComputeEmulator, client: Client, metadata: MetadataServer) -> None:
    client.insert(small_body("vm-1", metadata=ENABLED))
    with pytest.raises(HttpError) as caught:
        google_client(emu).instances().getGuestAttributes(
            project=PROJECT, zone=ZONE, instance="vm-1", variableKey="forja/autostop").execute()
    assert caught.value.resp.status == 404
    answer = client.get(f"zones/{ZONE}/instances/vm-1/getGuestAttributes", variableKey="forja/x", bogus="1")
    assert answer.status_code == 400, "unknown query parameters are refused, as for every method"


def test_writes_need_the_header_and_guest_attributes_turned_on(
    client: Client, metadata: MetadataServer,
) -> None:
    client.insert(small_body("vm-1"))  # no enable-guest-attributes in its metadata
    bare = requests.put(attribute_url(metadata), data="x", timeout=10)
    assert bare.status_code == 403 and "Metadata-Flavor" in bare.text
    disabled = requests.put(attribute_url(metadata), data="x", headers=GUEST, timeout=10)
    assert disabled.status_code == 403 and "enable-guest-attributes" in disabled.text


def test_only_an_instance_reaches_its_metadata(client: Client, metadata: MetadataServer) -> None:
    client.insert(small_body("vm-1", metadata=ENABLED))
    stranger = http.client.HTTPConnection(metadata.host, metadata.port, timeout=10,
                                          source_address=("127.0.0.2", 0))
    stranger.request("PUT", "/computeMetadata/v1/instance/guest-attributes/forja/autostop", body="x",
                     headers=GUEST)
    reply = stranger.getresponse()
    assert reply.status == 403 and b"not a running instance" in reply.read()


def test_a_deleted_instance_takes_its_attributes_along(
    emu: ComputeEmulator, client: Client, metadata: MetadataServer,
) -> None:
    client.insert(small_body("vm-1", metadata=ENABLED))
    assert requests.put(attribute_url(metadata), data="old", headers=GUEST, timeout=10).status_code == 200
    client.wait(client.ok(client.delete(f"zones/{ZONE}/instances/vm-1")))
    client.insert(small_body("vm-1", metadata=ENABLED))
    answer = client.get(f"zones/{ZONE}/instances/vm-1/getGuestAttributes", variableKey="forja/autostop")
    assert answer.status_code == 404
