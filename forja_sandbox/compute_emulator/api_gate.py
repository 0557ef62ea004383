"""What Google's front end checks before any API method runs: is the API enabled for the consumer.

Every Google API answers a call whose consumer project has not enabled it with one body
(403 PERMISSION_DENIED, `accessNotConfigured`, a `google.rpc.ErrorInfo` SERVICE_DISABLED with the
activation URL), whatever the method. Which project is the consumer differs: Compute checks the
project the call names (`projects/{p}/...`); Service Usage, Resource Manager and Cloud Billing
check the *caller's* project, the one its service account belongs to
(`x@PROJECT.iam.gserviceaccount.com`), since their calls name other projects. This module holds
that body, the known services, and the helpers the non-Compute APIs share (which project a
reference names, whose project a caller is).
"""

from __future__ import annotations

import re

from .catalog import project_number
from .errors import ApiError
from .state import Store

#: The services the emulator knows (Service Usage answers for these), with Google's titles.
SERVICES: dict[str, str] = {
    "compute.googleapis.com": "Compute Engine API",
    "iap.googleapis.com": "Cloud Identity-Aware Proxy API",
    "storage.googleapis.com": "Cloud Storage API",
    "aiplatform.googleapis.com": "Vertex AI API",
    "cloudresourcemanager.googleapis.com": "Cloud Resource Manager API",
    "cloudbilling.googleapis.com": "Cloud Billing API",
    "serviceusage.googleapis.com": "Service Usage API",
    "oslogin.googleapis.com": "Cloud OS Login API",
    "logging.googleapis.com": "Cloud Logging API",
    "iam.googleapis.com": "Identity and Access Management (IAM) API",
}
SCOPE_PREFIX = "https://www.googleapis.com/auth/"
#: The scopes the discovery documents of Service Usage and Resource Manager list for reads.
READ_SCOPES = frozenset({SCOPE_PREFIX + "cloud-platform", SCOPE_PREFIX + "cloud-platform.read-only"})
WRITE_SCOPES = frozenset({SCOPE_PREFIX + "cloud-platform"})
_SERVICE_ACCOUNT = re.compile(r"^[^@]+@([a-z][a-z0-9-]{4,28}[a-z0-9])\.iam\.gserviceaccount\.com$")


def activation_url(service: str, number: str) -> str:
    return f"https://console.developers.google.com/apis/api/{service}/overview?project={number}"


def service_disabled(service: str, number: str) -> ApiError:
    """Google's answer when the consumer project (its number) has not enabled `service`."""
    title = SERVICES.get(service, service)
    url = activation_url(service, number)
    message = (
        f"{title} has not been used in project {number} before or it is disabled. Enable it by visiting "
        f"{url} then retry. If you enabled this API recently, wait a few minutes for the action to "
        "propagate to our systems and retry."
    )
    details = [
        {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "SERVICE_DISABLED",
            "domain": "googleapis.com",
            "metadata": {
                "service": service,
                "consumer": f"projects/{number}",
                "activationUrl": url,
                "serviceTitle": title,
                "containerInfo": number,
            },
        },
        {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US", "message": message},
        {
            "@type": "type.googleapis.com/google.rpc.Help",
            "links": [{"description": "Google developers console API activation", "url": url}],
        },
    ]
    return ApiError(
        403, message, "accessNotConfigured", domain="usageLimits", status="PERMISSION_DENIED",
        extended_help="https://console.developers.google.com", details=details,
    )  # fmt: skip


def require_enabled(store: Store, project: str, service: str) -> None:
    """SERVICE_DISABLED unless `project` (served by the emulator) has `service` enabled."""
    with store.lock:
        if project not in store.projects:
            return
        enabled = store.settings_for(project).enabled(service)
    if not enabled:
        raise service_disabled(service, project_number(project))


def caller_project(email: str) -> str | None:
    """The project a service account belongs to (`x@PROJECT.iam.gserviceaccount.com`), else None."""
    match = _SERVICE_ACCOUNT.match(email)
    return match.group(1) if match else None


def require_caller_enabled(store: Store, principal: str, service: str) -> None:
    """The check APIs about other projects make: the caller's own project must enable `service`.
    A caller whose project the emulator does not serve (a user, another cloud's key) passes."""
    project = caller_project(principal)
    if project is not None:
        require_enabled(store, project, service)


def resolve(store: Store, reference: str) -> str | None:
    """The id of the served project that `reference` (an id or a project number) names, or None."""
    with store.lock:
        if reference in store.projects:
            return reference
        if reference.isdigit():
            return next((p for p in sorted(store.projects) if project_number(p) == reference), None)
    return None


def not_found_url(prefix: str, path: str) -> ApiError:
    return ApiError(404, f"The requested URL {prefix}{path} was not found on this server.", "notFound")
