"""The OAuth 2.0 side: service-account keys, the JWT-bearer token endpoint, bearer checks.

Google's service-account flow signs an RS256 JWT with the key file's private key and POSTs it
to the key file's `token_uri`. The emulator generates real RSA keys, keeps only their public
halves, verifies each assertion's signature with google-auth's own verifier, and hands out
opaque access tokens that the Compute endpoints then require, so a client that skips auth or
signs with the wrong key fails here as it would against Google.

Google's client libraries skip that exchange by default: they send a *self-signed JWT* as the
bearer token (AIP-4111), with either `aud` = the service (`https://compute.googleapis.com/`) or
a `scope` claim. The API checks it against the key's public certificate, so the emulator does
the same (signature, `iss` = `sub` = the key's client_email, audience or scope, lifetime).
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# google-auth hard-codes this audience whatever the key's token_uri says, so it is accepted too.
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"
TOKEN_LIFETIME_S = 3600
MAX_ASSERTION_LIFETIME_S = 3600
CLOCK_SKEW_S = 300
# Self-signed JWTs (AIP-4111): the audience Google's clients put in them is the service's own
# name, whatever endpoint they were pointed at; the emulator also accepts its own origin. A JWT
# with a `scope` claim instead may call the methods whose discovery `scopes` include one of them.
COMPUTE_AUDIENCE = "https://compute.googleapis.com/"
INSUFFICIENT_SCOPES = "Request had insufficient authentication scopes."
_VERIFIED_CACHE_MAX = 4096


class TokenError(Exception):
    """A refused token request; renders as Google's OAuth error body (400 invalid_grant)."""

    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(f"{error}: {description}")
        self.error = error
        self.description = description
        self.status = status

    def body(self) -> dict[str, str]:
        return {"error": self.error, "error_description": self.description}


class BearerRefused(Exception):
    """A bearer token the API does not accept: 401 (not valid) or 403 (valid, too few scopes)."""

    def __init__(self, why: str, status: int = 401) -> None:
        super().__init__(why)
        self.why = why
        self.status = status


class KeyRing:
    """Registered service-account public keys and the access tokens issued for them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.keys: dict[str, dict[str, str]] = {}  # private_key_id -> {client_email, public_pem}
        self.tokens: dict[str, dict[str, Any]] = {}  # token -> {client_email, expires}
        # Self-signed JWTs already verified: token -> (client_email, exp, scopes). A client reuses
        # one JWT for up to an hour, so each is checked (RSA) once, its expiry on every call.
        self._verified: dict[str, tuple[str, float, frozenset[str]]] = {}

    # -- keys ----------------------------------------------------------------------------------
    def new_key(self, token_uri: str, project: str, client_email: str | None = None) -> dict[str, str]:
        """A complete service-account key file body whose token_uri points at the emulator."""
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        private_pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        public_pem = (
            private.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )
        key_id = secrets.token_hex(20)
        email = client_email or f"forja-emulator@{project}.iam.gserviceaccount.com"
        with self._lock:
            self.keys[key_id] = {"client_email": email, "public_pem": public_pem}
        return {
            "type": "service_account",
            "project_id": project,
            "private_key_id": key_id,
            "private_key": private_pem,
            "client_email": email,
            "client_id": str(int(key_id[:15], 16)),
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": token_uri,
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "client_x509_cert_url": f"https://www.googleapis.com/robot/v1/metadata/x509/{email}",
            "universe_domain": "googleapis.com",
        }

    def register(self, key_file: dict[str, Any]) -> None:
        """Accept an existing key file (its public half is derived from the private key)."""
        private = serialization.load_pem_private_key(key_file["private_key"].encode(), password=None)
        public_pem = (
            private.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )
        with self._lock:
            self.keys[key_file.get("private_key_id") or key_file["client_email"]] = {
                "client_email": key_file["client_email"],
                "public_pem": public_pem,
            }

    # -- token endpoint ------------------------------------------------------------------------
    def _signing_key(self, token: str, *, issuer_if_kid_unknown: bool) -> tuple[dict, dict[str, str] | None]:
        """A JWT's header and the registered key that should have signed it (not yet verified): the
        key its `kid` names, else the key of its `iss` (when it has no `kid`, or with
        `issuer_if_kid_unknown` also when the `kid` is unknown). ValueError: not a JWT at all."""
        from google.auth import jwt

        try:
            header = jwt.decode_header(token)
            unverified = jwt.decode(token, verify=False)
        except Exception:
            raise ValueError("not a well-formed JWT") from None
        with self._lock:
            key = self.keys.get(str(header.get("kid", "")))
            if key is None and (issuer_if_kid_unknown or not header.get("kid")):
                key = next(
                    (k for k in self.keys.values() if k["client_email"] == unverified.get("iss")), None
                )
        return header, key

    def exchange(self, form: dict[str, str], token_uri: str) -> dict[str, Any]:
        """Verify a JWT-bearer grant and issue an access token, or raise TokenError."""
        from google.auth import jwt

        if form.get("grant_type") != GRANT_TYPE:
            raise TokenError("unsupported_grant_type", f"Invalid grant_type: {form.get('grant_type', '')}")
        assertion = form.get("assertion", "")
        try:
            _, key = self._signing_key(assertion, issuer_if_kid_unknown=True)
        except ValueError:
            raise TokenError("invalid_grant", "Invalid JWT: Token must be a short-lived token.") from None
        if key is None:
            raise TokenError("invalid_grant", "Invalid JWT Signature.")
        try:
            claims = jwt.decode(
                assertion, certs=key["public_pem"], audience=[token_uri, GOOGLE_TOKEN_URI],
                clock_skew_in_seconds=CLOCK_SKEW_S,
            )  # fmt: skip
        except Exception:
            raise TokenError("invalid_grant", "Invalid JWT Signature.") from None
        if claims.get("iss") != key["client_email"]:
            raise TokenError("invalid_grant", "Invalid JWT: iss does not match the key's client_email.")
        if int(claims["exp"]) - int(claims["iat"]) > MAX_ASSERTION_LIFETIME_S:
            raise TokenError("invalid_grant", "Invalid JWT: Token must be a short-lived token (60 minutes).")
        return self.issue(key["client_email"])

    def issue(self, client_email: str, lifetime_s: int = TOKEN_LIFETIME_S) -> dict[str, Any]:
        token = "ya29.emu-" + secrets.token_urlsafe(32)
        with self._lock:
            self.tokens[token] = {"client_email": client_email, "expires": time.time() + lifetime_s}
        return {"access_token": token, "expires_in": lifetime_s - 1, "token_type": "Bearer"}

    def principal(self, authorization: str | None) -> str | None:
        """The client_email behind a valid access token in a `Bearer` header, or None."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        with self._lock:
            entry = self.tokens.get(authorization[len("Bearer ") :].strip())
        if entry is None or entry["expires"] < time.time():
            return None
        return str(entry["client_email"])

    def authenticate(
        self, authorization: str, audiences: tuple[str, ...], method_scopes: frozenset[str]
    ) -> str:
        """The client_email behind a `Bearer` access token or self-signed JWT; else BearerRefused.

        `audiences`: the `aud` values a self-signed JWT may carry; `method_scopes`: the scopes
        that allow the method called (its discovery `scopes`), checked against a JWT's `scope`.
        """
        email = self.principal(authorization)
        if email is not None:
            return email
        token = authorization[len("Bearer ") :].strip() if authorization.startswith("Bearer ") else ""
        if token.count(".") != 2:
            raise BearerRefused("not an access token the emulator issued, nor a JWT")
        with self._lock:
            cached = self._verified.get(token)
        if cached is None:
            cached = self._verify_self_signed(token, audiences)
            with self._lock:
                if len(self._verified) >= _VERIFIED_CACHE_MAX:
                    self._verified.clear()
                self._verified[token] = cached
        email, expires, scopes = cached
        if expires + CLOCK_SKEW_S < time.time():
            raise BearerRefused("the JWT has expired")
        if scopes and not scopes & method_scopes:
            raise BearerRefused(INSUFFICIENT_SCOPES, 403)
        return email

    def _verify_self_signed(
        self, token: str, audiences: tuple[str, ...]
    ) -> tuple[str, float, frozenset[str]]:
        """Check a self-signed JWT as Google does; (client_email, exp, its `scope` claim's scopes)."""
        from google.auth import jwt

        try:
            header, key = self._signing_key(token, issuer_if_kid_unknown=False)
        except ValueError:
            raise BearerRefused("the bearer token is not a well-formed JWT") from None
        if header.get("alg") != "RS256":
            raise BearerRefused(f"JWT algorithm {header.get('alg')!r} is not RS256")
        if key is None:
            raise BearerRefused("the JWT's key id is not a key of any known service account")
        try:
            claims = jwt.decode(token, certs=key["public_pem"], clock_skew_in_seconds=CLOCK_SKEW_S)
        except Exception as exc:
            raise BearerRefused(f"the JWT was refused: {exc}") from None
        email = key["client_email"]
        if claims.get("iss") != email or claims.get("sub") != email:
            raise BearerRefused("the JWT's iss and sub must both be the key's client_email")
        if int(claims["exp"]) - int(claims["iat"]) > MAX_ASSERTION_LIFETIME_S:
            raise BearerRefused("the JWT lives longer than 1 hour")
        scopes = frozenset(str(claims.get("scope", "")).split())
        if "aud" in claims and claims["aud"] not in audiences:
            raise BearerRefused(f"the JWT's audience {claims['aud']!r} is not {COMPUTE_AUDIENCE!r}")
        if "aud" not in claims and not scopes:
            raise BearerRefused("the JWT has neither an audience nor a scope")
        return email, float(claims["exp"]), scopes

    # -- persistence ---------------------------------------------------------------------------
    def dump(self) -> dict[str, Any]:
        now = time.time()
        with self._lock:
            tokens = {t: e for t, e in self.tokens.items() if e["expires"] > now}
            return {"keys": dict(self.keys), "tokens": tokens}

    def load(self, data: dict[str, Any]) -> None:
        with self._lock:
            self.keys.update(data.get("keys", {}))
            self.tokens.update(data.get("tokens", {}))


def write_private_file(path: Path, data: dict[str, Any]) -> Path:
    """Write JSON readable by the owner only, created 0600 (never briefly world-readable)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), 0o600)
        json.dump(data, handle, indent=2)
    return path
