"""The part of Service Usage v1 (serviceusage.googleapis.com) that tells whether an API is enabled.

A preflight check asks before it calls: is compute.googleapis.com (IAP, Vertex AI, ...) enabled
in the project? The emulator serves `services.get` and `services.batchGet` under
`/serviceusage/v1/` of its own origin, answering from the project's `disabled_services`:

    GET /serviceusage/v1/projects/{p}/services/{service}
    GET /serviceusage/v1/projects/{p}/services:batchGet?names=projects/{p}/services/{service}&names=...

`{p}` is the project's id or number; answers name the project by number, as Google does.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from .api_gate import READ_SCOPES, SERVICES, WRITE_SCOPES, not_found_url, require_caller_enabled, resolve
from .catalog import project_number
from .errors import ApiError
from .state import Store

Json = dict[str, Any]

PREFIX = "/serviceusage/v1/"
AUDIENCE = "https://serviceusage.googleapis.com/"
SERVICE = "serviceusage.googleapis.com"
PERMISSION = "serviceusage.services.get"
#: Google's limit on one batchGet ("A single request can get a maximum of 30 services at a time").
MAX_BATCH = 30


def scopes_for(http_method: str) -> frozenset[str]:
    return READ_SCOPES if http_method == "GET" else WRITE_SCOPES


def _denied(service: str) -> ApiError:
    """What Service Usage answers for a project the caller may not read, or a service it does not
    know (Google does not tell them apart). Google appends a `Help Token` line; the emulator not."""
    return ApiError(
        403, f"Permission denied to get service [{service}]", status="PERMISSION_DENIED", classic=False,
        details=[{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "AUTH_PERMISSION_DENIED",
                  "domain": SERVICE}],
    )  # fmt: skip


def service(store: Store, project: str, name: str) -> Json:
    """The Service resource of `name` in the project: its state and its config's name and title."""
    number = project_number(project)
    with store.lock:
        enabled = store.settings_for(project).enabled(name)
    return {
        "name": f"projects/{number}/services/{name}",
        "config": {"name": name, "title": SERVICES[name]},
        "state": "ENABLED" if enabled else "DISABLED",
        "parent": f"projects/{number}",
    }


def _readable(store: Store, reference: str, name: str, principal: str) -> str:
    """The project id, if the caller may read services of it and the service is known; else 403."""
    project = resolve(store, reference)
    with store.lock:
        allowed = project is not None and store.settings_for(project).holds(principal, PERMISSION)
    if not allowed or name not in SERVICES:
        raise _denied(name)
    assert project is not None
    return project


def handle(store: Store, http_method: str, path: str, query: dict[str, list[str]], body: Any,
           principal: str) -> Json:  # fmt: skip
    """One Service Usage call; `path` follows /serviceusage/v1/. Raises ApiError for Google's errors."""
    parts = [unquote(p) for p in path.split("/")]
    if http_method != "GET" or len(parts) < 3 or parts[0] != "projects" or not parts[1]:
        raise not_found_url(PREFIX, path)
    require_caller_enabled(store, principal, SERVICE)
    reference = parts[1]
    if len(parts) == 4 and parts[2] == "services" and parts[3]:
        return service(store, _readable(store, reference, parts[3], principal), parts[3])
    if len(parts) == 3 and parts[2] == "services:batchGet":
        names = query.get("names") or []
        if not names:
            raise ApiError(400, "names: at least one service name is required.", "badRequest")
        if len(names) > MAX_BATCH:
            raise ApiError(400, f"names: at most {MAX_BATCH} services in one request.", "badRequest")
        services = []
        for full in names:
            parent, _, name = full.partition("/services/")
            # The parent of every name must be the request's (by id or by number, as Google's own
            # examples mix them: `parent=projects/ID`, `names=projects/NUMBER/services/...`).
            same = parent == f"projects/{reference}" or (
                parent.startswith("projects/") and resolve(store, parent[len("projects/") :]) is not None
                and resolve(store, parent[len("projects/") :]) == resolve(store, reference)
            )  # fmt: skip
            if not same or not name or "/" in name:
                raise ApiError(400, f"Invalid service name {full!r}: not a service of projects/{reference}.",
                               "badRequest")
            services.append(service(store, _readable(store, reference, name, principal), name))
        return {"services": services}
    raise not_found_url(PREFIX, path)
