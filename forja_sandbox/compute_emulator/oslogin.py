"""The part of the OS Login API (oslogin.googleapis.com/v1) that puts an SSH key on a profile.

With `enable-oslogin=TRUE` a GCE VM ignores `ssh-keys` metadata: a caller adds its public key to
its own OS Login profile (`users.importSshPublicKey`), and the guest asks the metadata server for
the profile of whoever logs in (`oslogin/users?username=`), whose POSIX account name for a
service account is `sa_<uniqueId>`. The emulator serves those methods under `/oslogin/v1/` of its
own origin, and the metadata server answers the guest's lookups from the same store.

    POST   /oslogin/v1/users/{email}:importSshPublicKey?projectId=P  {"key": "...", "expirationTimeUsec": "1"}
    GET    /oslogin/v1/users/{email}/loginProfile?projectId=P
    GET    /oslogin/v1/users/{email}/sshPublicKeys/{fingerprint}
    DELETE /oslogin/v1/users/{email}/sshPublicKeys/{fingerprint}

A caller manages only its own profile (there is no IAM here to let it manage others).
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import time
from typing import Any
from urllib.parse import unquote

from . import catalog
from .errors import ApiError
from .state import Store

Json = dict[str, Any]

PREFIX = "/oslogin/v1/"
#: What a self-signed JWT for this API carries as `aud` (Google's service name).
AUDIENCE = "https://oslogin.googleapis.com/"
_CLOUD = "https://www.googleapis.com/auth/"
#: The scopes OS Login's discovery document lists: writes need the first two.
WRITE_SCOPES = frozenset({_CLOUD + "cloud-platform", _CLOUD + "compute"})
READ_SCOPES = WRITE_SCOPES | {_CLOUD + "cloud-platform.read-only", _CLOUD + "compute.readonly"}
#: POSIX uids of OS Login accounts here start at this (Google's own range is not documented).
UID_BASE = 1_000_000_000


def unique_id(email: str) -> str:
    """A stable 21-digit id for an account, the shape of a service account's `uniqueId`."""
    return str(100_000_000_000_000_000_000 + int(catalog.numeric_id("account", email)) % 10**20)


def posix_username(email: str) -> str:
    """`sa_<uniqueId>` for a service account, as OS Login names them; `user_example_com` otherwise."""
    if email.endswith(".gserviceaccount.com"):
        return f"sa_{unique_id(email)}"
    return "".join(c if c.isalnum() else "_" for c in email.lower())[:32]


def fingerprint(key: str) -> str:
    """The key's SHA-256 (hex) over its decoded key data, which names it in the profile."""
    parts = key.split()
    if len(parts) < 2:
        raise ApiError(400, "Invalid value for field 'key': expected 'TYPE BASE64 [COMMENT]'.", "invalid")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "Invalid value for field 'key': the key data is not base64.", "invalid") from None
    return hashlib.sha256(blob).hexdigest()


def _account(email: str, project: str) -> Json:
    username = posix_username(email)
    uid = str(UID_BASE + int(unique_id(email)) % 1_000_000_000)
    return {"primary": True, "username": username, "uid": uid, "gid": uid,
            "homeDirectory": f"/home/{username}", "operatingSystemType": "LINUX",
            "accountId": project, "name": f"users/{email}/projects/{project}"}


def login_profile(store: Store, email: str, project: str) -> Json:
    """The profile OS Login answers: its POSIX account for `project` and its unexpired keys."""
    now_usec = int(time.time() * 1_000_000)
    with store.lock:
        keys = copy.deepcopy(store.oslogin_keys.get(email, {}))
    live = {fp: entry for fp, entry in keys.items()
            if not entry.get("expirationTimeUsec") or int(entry["expirationTimeUsec"]) > now_usec}
    return {"name": unique_id(email), "posixAccounts": [_account(email, project)], "sshPublicKeys": live}


def profiles(store: Store, project: str) -> list[Json]:
    """Every profile that holds a key (what the guest's user lookups search)."""
    with store.lock:
        emails = sorted(store.oslogin_keys)
    return [login_profile(store, email, project) for email in emails]


def authorized(store: Store, email: str) -> bool:
    """Whether an account may log in. No IAM here: every account with a profile may, as admin."""
    with store.lock:
        return bool(store.oslogin_keys.get(email))


def handle(store: Store, method: str, path: str, query: dict[str, list[str]], body: Any,
           principal: str) -> Json:
    """One OS Login call; `path` is what follows /oslogin/v1/. Raises ApiError for Google's errors."""
    parts = [unquote(p) for p in path.split("/")]
    if len(parts) < 2 or parts[0] != "users" or not parts[1]:
        raise ApiError(404, f"The requested URL {PREFIX}{path} was not found on this server.", "notFound")
    email, verb = parts[1].partition(":")[0], parts[1].partition(":")[2]
    if email != principal:
        raise ApiError(403, f"{principal} may not manage the OS Login profile of {email}.", "forbidden",
                       status="PERMISSION_DENIED")
    project = (query.get("projectId") or [""])[-1]
    rest = parts[2:]
    if method == "POST" and verb == "importSshPublicKey" and not rest:
        if not isinstance(body, dict) or not isinstance(body.get("key"), str):
            raise ApiError(400, "Invalid value for field 'key': a public key is required.", "required")
        fp = fingerprint(body["key"])
        entry = {"key": body["key"].strip(), "fingerprint": fp, "name": f"users/{email}/sshPublicKeys/{fp}"}
        if body.get("expirationTimeUsec"):
            entry["expirationTimeUsec"] = str(int(body["expirationTimeUsec"]))
        with store.lock:
            store.oslogin_keys.setdefault(email, {})[fp] = entry
            store.mark_dirty()
        return {"loginProfile": login_profile(store, email, project or "-")}
    if method == "GET" and rest == ["loginProfile"] and not verb:
        return login_profile(store, email, project or "-")
    if len(rest) == 2 and rest[0] == "sshPublicKeys" and not verb and method in ("GET", "DELETE"):
        with store.lock:
            keys = store.oslogin_keys.get(email, {})
            if rest[1] not in keys:
                raise ApiError(404, f"users/{email}/sshPublicKeys/{rest[1]} was not found.", "notFound",
                               status="NOT_FOUND")
            if method == "GET":
                return copy.deepcopy(keys[rest[1]])
            del keys[rest[1]]
            if not keys:
                store.oslogin_keys.pop(email, None)
            store.mark_dirty()
        return {}
    raise ApiError(404, f"The requested URL {PREFIX}{path} was not found on this server.", "notFound")


def scopes_for(method: str) -> frozenset[str]:
    return READ_SCOPES if method == "GET" else WRITE_SCOPES
