"""The OAuth token endpoint verifies real RS256 service-account JWTs; the API requires its tokens."""

from __future__ import annotations

import base64
import json
import stat
import time
from pathlib import Path

import google.auth.exceptions
import google.auth.jwt
import pytest
import requests
from emulator_helpers import PROJECT, Client
from google.auth.crypt import RSASigner
from google.auth.transport.requests import Request
from google.oauth2 import service_account

from forja_sandbox.compute_emulator import ComputeEmulator
from forja_sandbox.compute_emulator.auth import COMPUTE_AUDIENCE

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


# -- self-signed JWTs (AIP-4111): what Google's client libraries send by default -------------------


def self_signed(key: dict, **claims: object) -> str:
    """A JWT signed with the key file's private key; claims default to a valid one-hour token."""
    now = int(time.time())
    payload: dict[str, object] = {
        "iss": key["client_email"],
        "sub": key["client_email"],
        "aud": COMPUTE_AUDIENCE,
        "iat": now,
        "exp": now + 3600,
    }
    payload.update(claims)
    payload = {name: value for name, value in payload.items() if value is not None}
    return google.auth.jwt.encode(RSASigner.from_service_account_info(key), payload).decode()


@pytest.fixture
def sa_key(emu: ComputeEmulator, tmp_path: Path) -> dict:
    return json.loads(emu.write_service_account_key(tmp_path / "sa.json").read_text())


@pytest.mark.parametrize(
    "claims",
    [
        {},
        {"aud": COMPUTE_AUDIENCE.rstrip("/")},
        {"aud": None, "scope": "https://www.googleapis.com/auth/compute"},
        {"aud": None, "scope": "https://www.googleapis.com/auth/cloud-platform openid"},
    ],
    ids=["aud", "aud-without-slash", "scope-compute", "scope-cloud-platform"],
)
def test_a_self_signed_jwt_is_accepted_without_a_token_exchange(
    emu: ComputeEmulator, sa_key: dict, claims: dict
) -> None:
    response = Client(emu, self_signed(sa_key, **claims)).get("zones/us-east1-d/instances")
    assert response.status_code == 200, response.text
    assert emu.stats["token_requests"] == 0


def test_the_emulators_own_origin_is_an_accepted_audience(emu: ComputeEmulator, sa_key: dict) -> None:
    response = Client(emu, self_signed(sa_key, aud=emu.url + "/")).get("zones")
    assert response.status_code == 200, response.text


OTHER = "someone-else@forja-sandbox.iam.gserviceaccount.com"


@pytest.mark.parametrize(
    ("claims", "why"),
    [
        ({"iat": int(time.time()) - 7200, "exp": int(time.time()) - 3600}, "Token expired"),
        ({"iat": int(time.time()) + 3600, "exp": int(time.time()) + 4000}, "Token used too early"),
        ({"exp": int(time.time()) + 7200}, "longer than 1 hour"),
        ({"aud": "https://storage.googleapis.com/"}, "audience"),
        ({"sub": OTHER}, "iss and sub"),
        ({"iss": OTHER}, "iss and sub"),
        ({"aud": None}, "neither an audience nor a scope"),
    ],
    ids=["expired", "issued-in-the-future", "lives-2h", "wrong-audience", "sub", "iss", "no-aud-no-scope"],
)
def test_a_bad_self_signed_jwt_gets_googles_401(
    emu: ComputeEmulator, sa_key: dict, claims: dict, why: str
) -> None:
    response = Client(emu, self_signed(sa_key, **claims)).get("zones/us-east1-d/instances")
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["status"] == "UNAUTHENTICATED"
    assert error["message"].startswith("Request had invalid authentication credentials.")
    assert error["errors"][0] == {
        "message": "Invalid Credentials",
        "domain": "global",
        "reason": "authError",
        "location": "Authorization",
        "locationType": "header",
    }
    assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]
    assert why in response.headers["WWW-Authenticate"]  # refused for that reason, not another


def test_a_jwt_of_a_key_the_emulator_never_registered_gets_401(emu: ComputeEmulator, tmp_path: Path) -> None:
    with ComputeEmulator() as other:
        stranger = json.loads(other.write_service_account_key(tmp_path / "other.json").read_text())
    response = Client(emu, self_signed(stranger)).get("zones")
    assert response.status_code == 401
    assert "key id" in response.headers["WWW-Authenticate"]


def test_a_jwt_without_a_key_id_is_checked_against_its_issuers_keys(
    emu: ComputeEmulator, sa_key: dict
) -> None:
    now = int(time.time())
    claims = {"iss": sa_key["client_email"], "sub": sa_key["client_email"], "aud": COMPUTE_AUDIENCE}
    claims.update(iat=now, exp=now + 600)
    no_kid = google.auth.jwt.encode(RSASigner.from_string(sa_key["private_key"]), claims).decode()
    assert "kid" not in google.auth.jwt.decode_header(no_kid)
    assert Client(emu, no_kid).get("zones").status_code == 200


def test_an_unsigned_jwt_gets_401(emu: ComputeEmulator, sa_key: dict) -> None:
    signed = self_signed(sa_key)
    header = base64.urlsafe_b64encode(json.dumps({"alg": "none", "kid": sa_key["private_key_id"]}).encode())
    unsigned = header.decode().rstrip("=") + "." + signed.split(".")[1] + "."
    assert Client(emu, unsigned).get("zones").status_code == 401


def test_a_read_only_scope_may_read_but_not_change(emu: ComputeEmulator, sa_key: dict) -> None:
    """The discovery document's per-method `scopes` decide, as on Google's side."""
    reader = Client(
        emu, self_signed(sa_key, aud=None, scope="https://www.googleapis.com/auth/compute.readonly")
    )
    assert reader.get("zones/us-east1-d/instances").status_code == 200
    emu.seed_instances(PROJECT, "us-east1-d", 1)
    writer = Client(emu, emu.issue_token())
    stop = writer.ok(writer.post("zones/us-east1-d/instances/seed-0/stop"))
    assert reader.post(stop["selfLink"] + "/wait").status_code == 200  # wait lists compute.readonly
    response = reader.post("zones/us-east1-d/instances", {"name": "x"})
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["errors"][0]["reason"] == "insufficientPermissions"
    assert error["message"] == "Request had insufficient authentication scopes."


def test_a_jwt_scoped_for_another_api_gets_403(emu: ComputeEmulator, sa_key: dict) -> None:
    token = self_signed(sa_key, aud=None, scope="https://www.googleapis.com/auth/devstorage.read_only")
    response = Client(emu, token).get("zones")
    assert response.status_code == 403
    assert response.json()["error"]["errors"][0]["reason"] == "insufficientPermissions"


def test_a_missing_token_says_login_required(anonymous: Client) -> None:
    item = anonymous.get("zones").json()["error"]["errors"][0]
    assert item == {
        "message": "Login Required.",
        "domain": "global",
        "reason": "required",
        "location": "Authorization",
        "locationType": "header",
    }
