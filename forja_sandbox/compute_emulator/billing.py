"""The part of Cloud Billing v1 (cloudbilling.googleapis.com) that says whether billing is on.

A GPU VM in a project without an open billing account fails only at `instances.insert`; a
preflight check asks first:

    GET /cloudbilling/v1/projects/{id}/billingInfo
      -> {"name": "projects/ID/billingInfo", "projectId": ID,
          "billingAccountName": "billingAccounts/XXXXXX-XXXXXX-XXXXXX" or "", "billingEnabled": bool}

Google requires `resourcemanager.projects.get` on the project (its discovery document says so).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from .api_gate import SCOPE_PREFIX, not_found_url, require_caller_enabled, resolve
from .errors import ApiError
from .resource_manager import GET_PERMISSION
from .state import Store

Json = dict[str, Any]

PREFIX = "/cloudbilling/v1/"
AUDIENCE = "https://cloudbilling.googleapis.com/"
SERVICE = "cloudbilling.googleapis.com"
#: The scopes cloudbilling.v1's discovery document lists for getBillingInfo.
READ_SCOPES = frozenset(
    SCOPE_PREFIX + scope for scope in ("cloud-billing", "cloud-billing.readonly", "cloud-platform")
)


def scopes_for(http_method: str) -> frozenset[str]:
    return READ_SCOPES


def handle(store: Store, http_method: str, path: str, query: dict[str, list[str]], body: Any,
           principal: str) -> Json:  # fmt: skip
    """One Cloud Billing call; `path` follows /cloudbilling/v1/."""
    parts = [unquote(p) for p in path.split("/")]
    if http_method != "GET" or len(parts) != 3 or parts[0] != "projects" or parts[2] != "billingInfo":
        raise not_found_url(PREFIX, path)
    require_caller_enabled(store, principal, SERVICE)
    reference = parts[1]
    project = resolve(store, reference)
    with store.lock:
        settings = store.settings_for(project) if project else None
        if project is None or settings is None or not settings.holds(principal, GET_PERMISSION):
            # Google's wording for a project the caller may not read (or that does not exist).
            message = "The caller does not have permission"
            raise ApiError(403, message, status="PERMISSION_DENIED", classic=False)
        account = settings.billing_account
        enabled = settings.billing_enabled
    return {
        "name": f"projects/{project}/billingInfo",
        "projectId": project,
        "billingAccountName": account,
        "billingEnabled": enabled,
    }
