"""OS Login: a service account puts its key on its own profile; the guest looks the profile up.

The API calls go over real HTTP, one of them signed the way Google's client libraries sign
(google-auth's self-signed JWT for `https://oslogin.googleapis.com/`); the guest's lookups go to
the metadata server from 127.0.0.1, the address a loopback backend gives the instance.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import google.auth.jwt
import pytest
import requests
from emulator_helpers import PROJECT, Client, small_body
from google.auth.transport.requests import AuthorizedSession

from forja_sandbox.compute_emulator import ComputeEmulator
from forja_sandbox.compute_emulator.metadata_server import MetadataServer
from forja_sandbox.compute_emulator.operations import Loopback

GUEST = {"Metadata-Flavor": "Google"}



@pytest.fixture
def public_key(tmp_path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    return (tmp_path / "k.pub").read_text().strip()


@pytest.fixture
def account(emu: ComputeEmulator, tmp_path: Path) -> tuple[str, AuthorizedSession]:
    """A service account and a session that signs its own JWTs for OS Login, as Google's clients do."""
    key = json.loads(emu.write_service_account_key(tmp_path / "sa.json").read_text())
    creds = google.auth.jwt.Credentials.from_service_account_info(key, audience="https://oslogin.googleapis.com/")
    return key["client_email"], AuthorizedSession(creds)


@pytest.fixture
def metadata(emu: ComputeEmulator, client: Client) -> Iterator[MetadataServer]:
    emu.backend = Loopback()
    client.insert(small_body("vm-1", metadata={"items": [{"key": "enable-oslogin", "value": "TRUE"}]}))
    with MetadataServer(emu.api, "127.0.0.1", 0) as server:
        yield server


def guest(metadata: MetadataServer, path: str, **params: str) -> requests.Response:
    return requests.get(f"{metadata.url}/{path}", params=params, headers=GUEST, timeout=10)


def oslogin_url(emu: ComputeEmulator, email: str, rest: str) -> str:
    return f"{emu.url}/oslogin/v1/users/{quote(email)}{rest}"


def test_an_imported_key_is_on_the_profile_and_the_guest_finds_it(
    emu: ComputeEmulator, account: tuple[str, AuthorizedSession], public_key: str, metadata: MetadataServer,
) -> None:
    email, session = account
    imported = session.post(oslogin_url(emu, email, ":importSshPublicKey"), params={"projectId": PROJECT},
                            json={"key": public_key}, timeout=30)
    assert imported.status_code == 200, imported.text
    profile = imported.json()["loginProfile"]
    posix = profile["posixAccounts"][0]
    assert re.fullmatch(r"sa_\d{21}", posix["username"])
    assert posix["homeDirectory"] == f"/home/{posix['username']}"
    assert posix["accountId"] == PROJECT and posix["operatingSystemType"] == "LINUX"
    [(fingerprint, entry)] = profile["sshPublicKeys"].items()
    assert entry == {"key": public_key, "fingerprint": fingerprint,
                     "name": f"users/{email}/sshPublicKeys/{fingerprint}"}
    again = session.get(oslogin_url(emu, email, "/loginProfile"), params={"projectId": PROJECT}, timeout=30)
    assert again.json() == profile

    lookup = guest(metadata, "oslogin/users", username=posix["username"])
    assert lookup.status_code == 200
    assert lookup.json()["loginProfiles"][0]["sshPublicKeys"] == {fingerprint: entry}
    by_uid = guest(metadata, "oslogin/users", uid=posix["uid"]).json()
    assert by_uid["loginProfiles"][0]["name"] == profile["name"]
    allowed = guest(metadata, "oslogin/authorize", email=profile["name"], policy="login")
    assert allowed.json() == {"success": True}

    gone = session.delete(oslogin_url(emu, email, f"/sshPublicKeys/{fingerprint}"), timeout=30)
    assert gone.status_code == 200 and gone.json() == {}
    assert guest(metadata, "oslogin/users", username=posix["username"]).status_code == 404
    key_url = oslogin_url(emu, email, f"/sshPublicKeys/{fingerprint}")
    assert session.get(key_url, timeout=30).status_code == 404


def test_an_account_manages_only_its_own_profile(
    emu: ComputeEmulator, account: tuple[str, AuthorizedSession], public_key: str,
) -> None:
    _, session = account
    other = "someone-else@forja-sandbox.iam.gserviceaccount.com"
    refused = session.post(oslogin_url(emu, other, ":importSshPublicKey"), json={"key": public_key},
                           timeout=30)
    assert refused.status_code == 403 and refused.json()["error"]["status"] == "PERMISSION_DENIED"
    anonymous = requests.get(oslogin_url(emu, other, "/loginProfile"), timeout=30)
    assert anonymous.status_code == 401


def test_a_key_that_is_not_a_public_key_is_refused(
    emu: ComputeEmulator, account: tuple[str, AuthorizedSession],
) -> None:
    email, session = account
    bad = session.post(oslogin_url(emu, email, ":importSshPublicKey"), json={"key": "ssh-ed25519 not*base64"},
                       timeout=30)
    assert bad.status_code == 400 and "base64" in bad.json()["error"]["message"]
