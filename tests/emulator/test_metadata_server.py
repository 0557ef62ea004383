"""The metadata server serves what Google's guest agent reads, and its long polls wake on setMetadata.

The guest is this test, calling from 127.0.0.1 (the address a loopback backend gives the
instance), over real HTTP, with the query parameters the guest agent sends
(`recursive=true&alt=json&wait_for_change=true&last_etag=...&timeout_sec=...`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import requests
from emulator_helpers import PROJECT, ZONE, Client, small_body

from forja_sandbox.compute_emulator import ComputeEmulator
from forja_sandbox.compute_emulator.metadata_server import MetadataServer
from forja_sandbox.compute_emulator.operations import Loopback

GUEST = {"Metadata-Flavor": "Google"}
KEYS = "ansible:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOnlyATestKeyForTheMetadataServer ansible@ctl"



@pytest.fixture
def server(emu: ComputeEmulator, client: Client) -> Iterator[MetadataServer]:
    emu.backend = Loopback()
    client.insert(small_body("vm-1", metadata={"items": [{"key": "ssh-keys", "value": KEYS},
                                                        {"key": "enable-oslogin", "value": "FALSE"}]}))
    with MetadataServer(emu.api, "127.0.0.1", 0) as metadata:
        yield metadata


def get(server: MetadataServer, path: str, **params: str) -> requests.Response:
    return requests.get(f"{server.url}/{path}", params=params, headers=GUEST, timeout=30)


def set_metadata(client: Client, items: dict[str, str]) -> None:
    current = client.ok(client.get(f"zones/{ZONE}/instances/vm-1"))
    body = {"fingerprint": current["metadata"]["fingerprint"],
            "items": [{"key": k, "value": v} for k, v in items.items()]}
    client.wait(client.ok(client.post(f"zones/{ZONE}/instances/vm-1/setMetadata", body)))


def test_attributes_read_as_text_and_as_the_agents_json(server: MetadataServer) -> None:
    listing = get(server, "instance/attributes/")
    assert listing.status_code == 200 and listing.headers["Metadata-Flavor"] == "Google"
    assert listing.text == "enable-oslogin\nssh-keys\n"
    assert get(server, "instance/attributes/ssh-keys").text == KEYS
    assert get(server, "project/attributes/").text == "", "the project's commonInstanceMetadata is empty"
    tree = get(server, "", recursive="true", alt="json").json()
    assert tree["instance"]["attributes"] == {"enable-oslogin": "FALSE", "ssh-keys": KEYS}
    assert (tree["instance"]["name"], tree["project"]["projectId"]) == ("vm-1", PROJECT)
    assert tree["project"]["attributes"] == {}
    assert get(server, "instance/attributes/startup-script").status_code == 404


def test_a_guest_without_the_flavor_header_is_refused(server: MetadataServer) -> None:
    refused = requests.get(f"{server.url}/instance/attributes/ssh-keys", timeout=10)
    assert refused.status_code == 403 and KEYS not in refused.text
    proxied = requests.get(f"{server.url}/instance/attributes/ssh-keys", timeout=10,
                           headers={**GUEST, "X-Forwarded-For": "198.51.100.7"})
    assert proxied.status_code == 403


def test_every_answer_has_an_etag_that_follows_the_value(server: MetadataServer, client: Client) -> None:
    first = get(server, "instance/attributes/ssh-keys")
    assert first.headers["ETag"] == get(server, "instance/attributes/ssh-keys").headers["ETag"]
    set_metadata(client, {"ssh-keys": ""})
    assert get(server, "instance/attributes/ssh-keys").headers["ETag"] != first.headers["ETag"]


def test_a_long_poll_returns_when_set_metadata_revokes_a_key(server: MetadataServer, client: Client) -> None:
    now = get(server, "", recursive="true", alt="json")
    answers: list[requests.Response] = []
    waiter = threading.Thread(target=lambda: answers.append(get(
        server, "", recursive="true", alt="json", wait_for_change="true",
        last_etag=now.headers["ETag"], timeout_sec="30")))
    waiter.start()
    time.sleep(0.5)
    assert not answers, "the poll must wait while nothing changes"
    started = time.monotonic()
    set_metadata(client, {"enable-oslogin": "FALSE"})
    waiter.join(timeout=10)
    assert answers and time.monotonic() - started < 2.0
    assert answers[0].json()["instance"]["attributes"] == {"enable-oslogin": "FALSE"}
    assert answers[0].headers["ETag"] != now.headers["ETag"]


def test_a_stale_etag_answers_at_once_and_a_timeout_answers_unchanged(server: MetadataServer) -> None:
    started = time.monotonic()
    stale = get(server, "instance/attributes/ssh-keys", wait_for_change="true", last_etag="NONE")
    assert stale.text == KEYS and time.monotonic() - started < 1.0
    started = time.monotonic()
    unchanged = get(server, "instance/attributes/ssh-keys", wait_for_change="true",
                    last_etag=stale.headers["ETag"], timeout_sec="1")
    assert 0.9 < time.monotonic() - started < 3.0
    assert (unchanged.status_code, unchanged.text) == (200, KEYS)
    assert unchanged.headers["ETag"] == stale.headers["ETag"]
