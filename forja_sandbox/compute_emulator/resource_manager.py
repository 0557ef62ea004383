"""The part of Resource Manager v3 (cloudresourcemanager.googleapis.com) a preflight check asks.

Does the project exist and may I see it, and which of the permissions I need do I hold:

    GET  /cloudresourcemanager/v3/projects/{id or number}
    POST /cloudresourcemanager/v3/projects/{id}:testIamPermissions   {"permissions": [...]}
    GET  /cloudresourcemanager/v3/projects:search?query=id:X

A project that does not exist and one the caller may not see get the same 403 (Google does not
tell them apart: "... denied on resource ... (or it may not exist)."). There is no IAM behind it:
a caller holds every permission on the projects it can see (`viewers`) except the project's
`denied_permissions`.
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import unquote

from .api_gate import READ_SCOPES, not_found_url, require_caller_enabled, resolve
from .catalog import project_number
from .errors import ApiError
from .state import Store

Json = dict[str, Any]

PREFIX = "/cloudresourcemanager/v3/"
AUDIENCE = "https://cloudresourcemanager.googleapis.com/"
SERVICE = "cloudresourcemanager.googleapis.com"
GET_PERMISSION = "resourcemanager.projects.get"
#: Every emulated project sits in one organization (its number is the emulator's own).
ORGANIZATION = "organizations/573920461835"
CREATE_TIME = "2016-01-01T08:00:00.000Z"


def scopes_for(http_method: str) -> frozenset[str]:
    """testIamPermissions is a POST that only reads: its discovery scopes include read-only."""
    return READ_SCOPES


def denied(reference: str, permission: str = GET_PERMISSION) -> ApiError:
    """Google's 403 for a project that does not exist or that the caller may not see."""
    resource = f"//{SERVICE}/projects/{reference}"
    message = f"Permission '{permission}' denied on resource '{resource}' (or it may not exist)."
    info = {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "IAM_PERMISSION_DENIED",
        "domain": SERVICE,
        "metadata": {"resource": f"projects/{reference}", "permission": permission},
    }
    return ApiError(403, message, status="PERMISSION_DENIED", classic=False, details=[info])


def project_resource(project: str) -> Json:
    number = project_number(project)
    return {
        "name": f"projects/{number}",
        "parent": ORGANIZATION,
        "projectId": project,
        "state": "ACTIVE",
        "displayName": project,
        "createTime": CREATE_TIME,
        "etag": 'W/"' + hashlib.sha256(f"etag/{project}".encode()).hexdigest()[:16] + '"',
    }


def _visible(store: Store, reference: str, principal: str) -> str:
    project = resolve(store, reference)
    with store.lock:
        if project is None or not store.settings_for(project).holds(principal, GET_PERMISSION):
            raise denied(reference)
    return project


def _matches(project: str, query: str) -> bool:
    """The part of the search grammar the emulator reads: `id:X` / `projectId:X` terms (ANDed).
    Other terms (`parent:`, `labels.`, `state:`, ...) are ignored: they match every project."""
    for term in query.split():
        key, _, value = term.partition(":")
        if key.lower() in ("id", "projectid") and value.strip("'\"") != project:
            return False
    return True


def handle(store: Store, http_method: str, path: str, query: dict[str, list[str]], body: Any,
           principal: str) -> Json:  # fmt: skip
    """One Resource Manager call; `path` follows /cloudresourcemanager/v3/."""
    parts = [unquote(p) for p in path.split("/")]
    if parts == ["projects:search"] and http_method == "GET":
        require_caller_enabled(store, principal, SERVICE)
        wanted = (query.get("query") or [""])[-1]
        with store.lock:
            found = [p for p in sorted(store.projects)
                     if store.settings_for(p).holds(principal, GET_PERMISSION) and _matches(p, wanted)]
        return {"projects": [project_resource(p) for p in found]} if found else {}
    if len(parts) != 2 or parts[0] != "projects" or not parts[1]:
        raise not_found_url(PREFIX, path)
    reference, _, verb = parts[1].partition(":")
    if http_method == "GET" and not verb:
        require_caller_enabled(store, principal, SERVICE)
        return project_resource(_visible(store, reference, principal))
    if http_method == "POST" and verb == "testIamPermissions":
        require_caller_enabled(store, principal, SERVICE)
        asked = (body or {}).get("permissions") if isinstance(body, dict) else None
        if not isinstance(asked, list) or not all(isinstance(p, str) and p for p in asked):
            raise ApiError(400, "Invalid JSON payload: 'permissions' must be a list of permission names.",
                           "badRequest")
        if any("*" in p for p in asked):
            raise ApiError(400, "Permissions with wildcards (*) are not allowed in testIamPermissions.",
                           "badRequest")
        project = resolve(store, reference)
        if project is None:
            raise denied(reference)
        with store.lock:
            settings = store.settings_for(project)
            granted = [p for p in dict.fromkeys(asked) if settings.holds(principal, p)]
        return {"permissions": granted} if granted else {}
    raise not_found_url(PREFIX, path)
