"""The OAuth token endpoint verifies real RS256 service-account JWTs; the API requires its tokens."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import google.auth.exceptions
import pytest
import requests
from emulator_helpers import PROJECT, Client
from google.auth.transport.requests import Request
from google.oauth2 import service_account

from forja_sandbox.compute_emulator import ComputeEmulator

SCOPES = ["https://www.googleapis.com/auth/compute"]


def credentials(key_file: Path) -> service_account.Credentials:
    return service_account.Credentials.from_service_account_file(str(key_file), scopes=SCOPES)


def test_written_key_is_a_private_service_account_file_pointing_at_the_emulator(
    emu: ComputeEmulator, tmp_path: Path
) -> None:
    key_file = emu.write_service_account_key(tmp_path / "sa.json")
    key = json.loads(key_file.read_text())
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key["type"] == "service_account"
    assert key["token_uri"] == emu.token_uri == f"{emu.url}/token"
    assert key["private_key"].startswith("-----BEGIN PRIVATE KEY-----")
    assert key["client_email"].endswith(f"@{PROJECT}.iam.gserviceaccount.com")


def test_google_auth_refreshes_a_token_that_the_api_accepts(emu: ComputeEmulator, tmp_path: Path) -> None:
    creds = credentials(emu.write_service_account_key(tmp_path / "sa.json"))
    creds.refresh(Request())
    assert creds.valid and creds.token
    response = Client(emu, creds.token).get("zones/us-east1-d/instances")
    assert response.status_code == 200, response.text
    assert emu.stats["token_requests"] == 1


def test_a_forged_signature_is_refused_as_invalid_grant(emu: ComputeEmulator, tmp_path: Path) -> None:
    genuine = json.loads(emu.write_service_account_key(tmp_path / "sa.json").read_text())
    other = ComputeEmulator()  # a different emulator: a different, unregistered private key
    forged_file = other.write_service_account_key(tmp_path / "other.json")
    other.stop()
    forged = json.loads(forged_file.read_text())
    # Same identity and key id as the genuine key, signed with someone else's private key.
    forged.update(client_email=genuine["client_email"], private_key_id=genuine["private_key_id"])
    forged["token_uri"] = emu.token_uri
    creds = service_account.Credentials.from_service_account_info(forged, scopes=SCOPES)
    with pytest.raises(google.auth.exceptions.RefreshError, match="invalid_grant"):
        creds.refresh(Request())


def test_an_unknown_key_and_a_garbage_assertion_are_refused(emu: ComputeEmulator) -> None:
    grant = "urn:ietf:params:oauth:grant-type:jwt-bearer"
    response = requests.post(emu.token_uri, data={"grant_type": grant, "assertion": "not.a.jwt"}, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_grant"
    response = requests.post(emu.token_uri, data={"grant_type": "password"}, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"] == "unsupported_grant_type"


def test_api_calls_without_a_bearer_token_get_googles_401(anonymous: Client) -> None:
    response = anonymous.get("zones/us-east1-d/instances")
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["code"] == 401 and error["status"] == "UNAUTHENTICATED"
    assert error["errors"][0]["reason"] == "required"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_a_token_the_emulator_never_issued_gets_401(emu: ComputeEmulator) -> None:
    response = Client(emu, "ya29.made-up").get("zones/us-east1-d/instances")
    assert response.status_code == 401
    assert response.json()["error"]["errors"][0]["reason"] == "authError"


def test_a_key_file_from_an_earlier_emulator_can_be_trusted_again(tmp_path: Path) -> None:
    with ComputeEmulator() as first:
        key_file = first.write_service_account_key(tmp_path / "sa.json")
    with ComputeEmulator() as second:
        key = json.loads(key_file.read_text())
        creds = service_account.Credentials.from_service_account_info(
            dict(key, token_uri=second.token_uri), scopes=SCOPES
        )
        with pytest.raises(google.auth.exceptions.RefreshError):
            creds.refresh(Request())
        second.load_service_account_key(key_file)
        creds.refresh(Request())
        assert Client(second, creds.token).get("zones").status_code == 200
