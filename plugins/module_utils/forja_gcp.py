# Copyright: forja contributors
# Apache-2.0
"""The one place forja talks to the Compute Engine API.

The inventory plugin and the modules share this client so that auth, retries, timeouts and
operation waiting are written once. Design choices, each from a failure seen in the wild:

* ONE credentials object and ONE ``requests.Session`` per client (per Ansible run): the
  ``google.cloud`` collection re-created both per call, which meant a token POST per request.
* The token is refreshed only when it is missing or expired, with ``credentials.refresh`` and a
  hand-set ``Authorization`` header. We deliberately do not use ``AuthorizedSession`` /
  ``credentials.before_request``: from google-auth 2.55 that path starts a background thread that
  calls ``iamcredentials.googleapis.com`` (the Regional Access Boundary lookup) after every
  refresh, which leaks a request out of a sandbox and is not needed for Compute calls.
* Explicit timeouts; retries with exponential backoff on 429/5xx and connection errors (mutations
  carry a ``requestId`` so a retried insert cannot create a second VM).
* Operations are waited for with ``zoneOperations.wait`` in a loop under a deadline, and an
  operation that ends ``DONE`` with ``error`` is a failure that names the code, the zone and the fix.
* The API base URL comes from an option or ``FORJA_GCP_API_URL`` so tests use a loopback server.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import random
import re
import stat
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

try:  # requests first, so that without it the ImportError names it (GcpClient says which library is missing)
    import requests  # noqa: I001
    import google.auth
    import google.auth.exceptions
    import google.auth.transport.requests
    import google.oauth2.service_account

    HAS_GCP_LIBRARIES = True
    GCP_IMPORT_ERROR = None
    #: What a request raises when the API could not be reached or did not answer in time. Empty without
    #: requests: then no request is ever made, because GcpClient fails first naming the library.
    NETWORK_ERRORS: tuple[type[Exception], ...] = (requests.ConnectionError, requests.Timeout)
except ImportError as exc:  # pragma: no cover - exercised only without the controller venv
    HAS_GCP_LIBRARIES = False
    GCP_IMPORT_ERROR = exc
    NETWORK_ERRORS = ()

DEFAULT_API_URL = "https://compute.googleapis.com/compute/v1/"
DEFAULT_SCOPES = ("https://www.googleapis.com/auth/compute",)
ENV_API_URL = "FORJA_GCP_API_URL"
ENV_CREDENTIALS_FILE = "FORJA_GCP_CREDENTIALS_FILE"
ENV_PROJECT = "FORJA_GCP_PROJECT"
ENV_ACCESS_TOKEN = "FORJA_GCP_ACCESS_TOKEN"
AUTH_KINDS = ("auto", "serviceaccount", "application", "accesstoken", "machineaccount")
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
SERVICE_ACCOUNT_KEYS = ("client_email", "private_key", "token_uri")

# What to do about the operation error codes users actually meet with GPU VMs.
OPERATION_ERROR_HINTS = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": "the zone has no capacity for this machine type right now (a stock-out): "
    "list other zones in fallback_zones, retry later, or try another region",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": "the zone has no capacity for this machine type right now "
    "(a stock-out): list other zones in fallback_zones, retry later, or try another region",
    "QUOTA_EXCEEDED": "the project's quota is too small for this VM: request an increase "
    "(console > IAM & Admin > Quotas, e.g. NVIDIA_L4_GPUS or GPUS_ALL_REGIONS in the region) or ask for less",
    "RESOURCE_ALREADY_EXISTS": "a resource with that name exists: choose another name or manage the "
    "existing one",
    "UNSUPPORTED_OPERATION": "the instance is not in a state that allows this: check its status and retry",
}


class GcpError(Exception):
    """A failure talking to GCP, with a message a user can act on."""

    def __init__(self, message: str, *, status: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason


class GcpAuthError(GcpError):
    """Credentials are missing, malformed, or refused by the token endpoint."""


class GcpApiError(GcpError):
    """The API answered with an HTTP error; `error` is Google's error object (`{"code", "message",
    "errors", "status", "details"}`), kept so a caller can read the ErrorInfo (a disabled API's
    activation link) without parsing the message."""

    def __init__(
        self, message: str, *, status: int | None = None, reason: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, status=status, reason=reason)
        self.error = error or {}

    def error_info(self) -> dict[str, Any]:
        """The error's google.rpc.ErrorInfo detail (`reason`, `metadata`), {} when there is none."""
        for detail in self.error.get("details") or []:
            if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.ErrorInfo"):
                return detail
        return {}


class GcpNetworkError(GcpError):
    """The API could not be reached (after retries)."""


class GcpOperationError(GcpError):
    """An operation ended DONE with an error (e.g. a stock-out), or did not end before its deadline."""

    def __init__(
        self, message: str, *, code: str, zone: str | None = None, operation: str | None = None
    ) -> None:
        super().__init__(message, reason=code)
        self.code = code
        self.zone = zone
        self.operation = operation


@dataclass
class GcpConfig:
    """Everything a client needs; options win over the FORJA_GCP_* environment."""

    project: str | None = None
    api_url: str | None = None
    auth_kind: str = "auto"
    credentials_file: str | None = None
    credentials_json: str | None = None
    access_token: str | None = None
    scopes: tuple[str, ...] = DEFAULT_SCOPES
    request_timeout_s: float = 30.0
    max_retries: int = 5
    retry_base_s: float = 0.5
    user_agent: str = "forja-gcp/0.1"
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def resolved_api_url(self) -> str:
        url = self.api_url or self.env.get(ENV_API_URL) or DEFAULT_API_URL
        return url if url.endswith("/") else url + "/"

    def resolved_project(self) -> str | None:
        return self.project or self.env.get(ENV_PROJECT) or None

    def resolved_credentials_file(self) -> str | None:
        return self.credentials_file or self.env.get(ENV_CREDENTIALS_FILE) or None

    def resolved_access_token(self) -> str | None:
        return self.access_token or self.env.get(ENV_ACCESS_TOKEN) or None


def short_name(url_or_name: str | None) -> str:
    """The last path segment of a full or partial URL (``.../zones/us-east1-d`` -> ``us-east1-d``)."""
    if not url_or_name:
        return ""
    return str(url_or_name).rstrip("/").rsplit("/", 1)[-1]


def region_of(zone: str) -> str:
    """``us-east1-d`` -> ``us-east1``."""
    return zone.rsplit("-", 1)[0]


def operation_error_message(op: dict[str, Any], zone: str | None = None) -> tuple[str, str]:
    """Turn a DONE-with-error operation into (code, message naming the code, zone and the fix)."""
    errors = (op.get("error") or {}).get("errors") or [{}]
    first = errors[0]
    code = str(first.get("code") or op.get("httpErrorMessage") or "UNKNOWN")
    detail = str(first.get("message") or op.get("httpErrorMessage") or "no message")
    where = zone or short_name(op.get("zone")) or "global"
    hint = OPERATION_ERROR_HINTS.get(code, "see the operation in the Cloud console for details")
    kind = op.get("operationType", "operation")
    target = short_name(op.get("targetLink")) or "?"
    return code, f"{kind} of '{target}' in {where} failed with {code}: {detail}. What to do: {hint}."


def disabled_service(body: Any) -> tuple[str, str]:
    """The service a SERVICE_DISABLED answer names and its activation link (Google's ErrorInfo
    metadata); Compute Engine and no link when the body does not say."""
    error = body.get("error") if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details or []:
        if isinstance(detail, dict) and detail.get("reason") == "SERVICE_DISABLED":
            meta = detail.get("metadata") or {}
            return str(meta.get("service") or "compute.googleapis.com"), str(meta.get("activationUrl") or "")
    return "compute.googleapis.com", ""


def api_error_message(status: int, body: Any, method: str, url: str) -> tuple[str, str]:
    """Turn an HTTP error answer into (reason, message) without the Authorization header or body secrets."""
    reason = ""
    detail = ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        detail = str(err.get("message") or "")
        errs = err.get("errors") or []
        if errs and isinstance(errs[0], dict):
            reason = str(errs[0].get("reason") or "")
    elif isinstance(body, str):
        detail = body[:300]
    hint = {
        400: "the request was rejected as invalid; check the field named above",
        401: "the credentials were not accepted; check FORJA_GCP_CREDENTIALS_FILE or the access token",
        403: "the credentials lack permission or a quota is exhausted; grant roles/compute.instanceAdmin.v1 "
        "(or raise the quota named above)",
        404: "the project, zone or resource does not exist (or the credentials cannot see it); "
        "check the name",
        409: "a resource with this name already exists",
        412: "the resource changed underneath us (stale fingerprint); re-run",
    }.get(status, "retry later")
    missing_project = re.match(r"The resource 'projects/([^/']+)' was not found", detail)
    if status == 404 and missing_project:  # Google's answer to any call under a wrong project
        hint = (
            f"project '{missing_project.group(1)}' does not exist, or the credentials cannot see it; "
            f"check project (or {ENV_PROJECT}) against 'gcloud projects list'"
        )
    if reason in ("accessNotConfigured", "SERVICE_DISABLED"):
        service, link = disabled_service(body)
        hint = f"enable the API: 'gcloud services enable {service}'" + (f", or open {link}" if link else "")
    path = url.split("?", 1)[0]
    return (
        reason,
        f"{method} {path} -> HTTP {status} {reason or ''}: {detail.rstrip('.') or 'no detail'}. "
        f"What to do: {hint}.",
    )


class GcpClient:
    """A small Compute Engine v1 client: one credentials object and one HTTP session per instance."""

    def __init__(self, config: GcpConfig) -> None:
        if not HAS_GCP_LIBRARIES:
            library = "requests" if getattr(GCP_IMPORT_ERROR, "name", None) == "requests" else "google-auth"
            raise GcpError(f"the '{library}' library is needed on the controller: {GCP_IMPORT_ERROR}")
        if config.auth_kind not in AUTH_KINDS:
            raise GcpAuthError(f"auth_kind: '{config.auth_kind}' is not one of {', '.join(AUTH_KINDS)}")
        self.config = config
        self.api_url = config.resolved_api_url()
        self.session = requests.Session()
        self.session.headers["User-Agent"] = config.user_agent
        self._credentials: Any = None
        self._static_token: str | None = None
        self.stats = {"requests": 0, "token_refreshes": 0, "retries": 0}

    # --- credentials ---------------------------------------------------------------------------

    def _load_credentials(self) -> None:
        """Build the credentials object once; which kind follows auth_kind, or what is configured."""
        cfg = self.config
        kind = cfg.auth_kind
        token = cfg.resolved_access_token()
        key_file = cfg.resolved_credentials_file()
        if kind == "auto":
            if cfg.credentials_json or key_file:
                kind = "serviceaccount"
            elif token:
                kind = "accesstoken"
            else:
                kind = "application"
        if kind == "accesstoken":
            if not token:
                raise GcpAuthError(
                    f"access_token: auth_kind is accesstoken but no token was given; set the option "
                    f"or {ENV_ACCESS_TOKEN}"
                )
            self._static_token = token
            return
        if kind == "serviceaccount":
            info = load_service_account_info(cfg.credentials_json, key_file)
            try:
                creds = google.oauth2.service_account.Credentials.from_service_account_info(
                    info, scopes=list(cfg.scopes)
                )
            except (ValueError, KeyError) as exc:
                source = "credentials_json" if cfg.credentials_json else "credentials_file"
                raise GcpAuthError(
                    f"{source}: the private_key of the service-account key for "
                    f"'{info.get('client_email')}' cannot be loaded ({type(exc).__name__}: "
                    f"{_first_line(exc)}); download a new JSON key"
                ) from None
            self._credentials = creds
            return
        if kind == "machineaccount":
            from google.auth import compute_engine  # only here: it is the one kind that needs it

            self._credentials = compute_engine.Credentials(scopes=list(cfg.scopes))
            return
        try:
            creds, _project = google.auth.default(scopes=list(cfg.scopes))
        except google.auth.exceptions.DefaultCredentialsError as exc:
            said = _first_line(exc)  # Google's own words only when they add to "none found" (a bad path)
            said = "" if said.startswith("Your default credentials were not found") else f" ({said})"
            raise GcpAuthError(
                "credentials: none found: no credentials_file, no access_token, and no application "
                f"default credentials{said}. Set FORJA_GCP_CREDENTIALS_FILE (or credentials_file) to a "
                "service-account JSON key, set access_token, or run 'gcloud auth application-default login'"
            ) from None
        self._credentials = creds

    def token(self) -> str:
        """A valid access token; refreshed (one token request) only when missing or expired."""
        if self._static_token is None and self._credentials is None:
            self._load_credentials()
        if self._static_token is not None:
            return self._static_token
        creds = self._credentials
        if not creds.valid:
            request = _RecordingRequest(session=self.session)
            try:
                creds.refresh(request)
            except google.auth.exceptions.RefreshError as exc:
                raise GcpAuthError(refresh_error_message(creds, exc, request.statuses)) from None
            except google.auth.exceptions.TransportError as exc:
                where = getattr(creds, "_token_uri", None) or "the token endpoint"
                raise GcpAuthError(
                    f"credentials: the token endpoint {where} could not be reached "
                    f"({_first_line(exc)}); check the network, or the key's token_uri"
                ) from None
            self.stats["token_refreshes"] += 1
        return creds.token

    def google_credentials(self) -> Any:
        """The google-auth credentials these options resolve to, for Google's own client libraries
        (Cloud Storage, forja_gcp_storage.py): the same auth_kind rules, resolved here only."""
        if self._static_token is None and self._credentials is None:
            self._load_credentials()
        if self._static_token is not None:
            import google.oauth2.credentials  # only here: the one kind that needs it

            return google.oauth2.credentials.Credentials(self._static_token)
        return self._credentials

    def _invalidate_token(self) -> None:
        if self._credentials is not None:
            self._credentials.token = None

    # --- HTTP -----------------------------------------------------------------------------------

    def url(self, path: str) -> str:
        """Absolute URL for a path relative to the API base (or an absolute URL, kept)."""
        if path.startswith(("http://", "https://")):
            return path
        return self.api_url + path.lstrip("/")

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        allow_404: bool = False,
        timeout_is_an_answer: bool = False,
        request_id: bool = True,
    ) -> dict[str, Any] | None:
        """One API call with retries on 429/5xx/connection errors; 404 -> None when allowed.

        `request_id=False` for a POST that changes nothing and takes no requestId (advice.capacity)."""
        url = self.url(path)
        cfg = self.config
        timeout = timeout_s or cfg.request_timeout_s
        if request_id and method in ("POST", "DELETE", "PATCH", "PUT") and not path.endswith("/wait"):
            # One requestId for all retries of this call: the API then runs the mutation at most once.
            params = dict(params or {})
            params.setdefault("requestId", str(uuid.uuid4()))
        refreshed_after_401 = False
        attempt = 0
        while True:
            headers = {"Authorization": f"Bearer {self.token()}"}
            self.stats["requests"] += 1
            try:
                resp = self.session.request(
                    method,
                    url,
                    params=params,
                    json=body,
                    headers=headers,
                    timeout=(min(10.0, timeout), timeout),
                )
            except NETWORK_ERRORS as exc:
                if timeout_is_an_answer and isinstance(exc, requests.ReadTimeout):
                    return None  # a long-poll (operations.wait) that ran out of time: not done yet
                if attempt < cfg.max_retries:
                    attempt += 1
                    self._sleep_backoff(attempt, None)
                    continue
                raise GcpNetworkError(
                    f"{method} {url.split('?')[0]}: the API could not be reached after "
                    f"{attempt + 1} attempts ({type(exc).__name__}); check api_url / "
                    f"{ENV_API_URL} and the network"
                ) from None
            if resp.status_code == 401 and not refreshed_after_401 and self._credentials is not None:
                refreshed_after_401 = True
                self._invalidate_token()
                continue
            if resp.status_code in RETRYABLE_STATUS and attempt < cfg.max_retries:
                attempt += 1
                self._sleep_backoff(attempt, resp.headers.get("Retry-After"))
                continue
            if resp.status_code == 404 and allow_404:
                return None
            if resp.status_code >= 400:
                try:
                    payload: Any = resp.json()
                except ValueError:
                    payload = resp.text
                reason, message = api_error_message(resp.status_code, payload, method, url)
                error = payload.get("error") if isinstance(payload, dict) else None
                raise GcpApiError(message, status=resp.status_code, reason=reason,
                                  error=error if isinstance(error, dict) else None)
            if not resp.content:
                return {}
            try:
                return resp.json()
            except ValueError:
                raise GcpApiError(
                    f"{method} {url.split('?')[0]}: the answer is not JSON "
                    f"({resp.text[:120]!r}); is api_url a Compute API endpoint?",
                    status=resp.status_code,
                ) from None

    def _sleep_backoff(self, attempt: int, retry_after: str | None) -> None:
        """Exponential backoff with full jitter; Retry-After (seconds) is honoured, capped at 30 s."""
        self.stats["retries"] += 1
        delay = random.uniform(0, self.config.retry_base_s * (2 ** (attempt - 1)))
        if retry_after:
            with contextlib.suppress(ValueError):
                delay = max(delay, min(float(retry_after), 30.0))
        time.sleep(delay)

    def get(
        self, path: str, *, params: dict[str, Any] | None = None, allow_404: bool = False
    ) -> dict[str, Any] | None:
        return self.request("GET", path, params=params, allow_404=allow_404)

    def pages(
        self, path: str, params: dict[str, Any] | None = None, max_results: int = 500
    ) -> Iterator[dict[str, Any]]:
        """Every page of a list call, following nextPageToken (⌈n/max_results⌉ requests)."""
        query = dict(params or {})
        query["maxResults"] = max_results
        while True:
            page = self.request("GET", path, params=query) or {}
            yield page
            token = page.get("nextPageToken")
            if not token:
                return
            query["pageToken"] = token

    # --- Compute resources ------------------------------------------------------------------------

    def aggregated_instances(
        self, project: str, filter_expr: str | None = None, max_results: int = 500
    ) -> list[dict[str, Any]]:
        """All instances of a project, with instances.aggregatedList (one request per 500)."""
        return self.aggregated_instances_and_zones(project, filter_expr, max_results)[0]

    def aggregated_instances_and_zones(
        self, project: str, filter_expr: str | None = None, max_results: int = 500
    ) -> tuple[list[dict[str, Any]], set[str]]:
        """The instances, and the zones the listing named (with instances or a NO_RESULTS warning).

        The zones let a caller notice a misspelt zone instead of silently listing nothing there.
        """
        params = {"filter": filter_expr} if filter_expr else {}
        found: list[dict[str, Any]] = []
        zones: set[str] = set()
        for page in self.pages(f"projects/{project}/aggregated/instances", params, max_results):
            for scope, scoped in (page.get("items") or {}).items():
                if scope.startswith("zones/"):
                    zones.add(short_name(scope))
                found.extend((scoped or {}).get("instances") or [])
        return found, zones

    def zone_instances(
        self, project: str, zone: str, filter_expr: str | None = None, max_results: int = 500
    ) -> list[dict[str, Any]]:
        """The instances of one zone, with instances.list."""
        params = {"filter": filter_expr} if filter_expr else {}
        found: list[dict[str, Any]] = []
        for page in self.pages(f"projects/{project}/zones/{zone}/instances", params, max_results):
            found.extend(page.get("items") or [])
        return found

    def principal(self) -> str:
        """Who the calls are made as, for messages (the service account, or "these credentials")."""
        email = getattr(self._credentials, "service_account_email", None)
        return f"the service account {email}" if email else "these credentials"

    def require_project(self, project: str) -> None:
        """Fail naming the project when it does not exist or cannot be seen with these credentials.

        Under a wrong project every Compute call answers 404 for what it asked about (a zone, an
        instance), which reads as if that were missing; projects.get tells the two apart. Called
        only once something was not found, so a run that finds its VM pays no extra request.
        """
        if self.get(f"projects/{project}", allow_404=True) is None:
            raise GcpApiError(
                f"project: '{project}' does not exist, or {self.principal()} cannot see it; check "
                f"project (or {ENV_PROJECT}) against 'gcloud projects list'",
                status=404,
                reason="notFound",
            )

    def get_instance(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        return self.get(f"projects/{project}/zones/{zone}/instances/{name}", allow_404=True)

    def wait_operation(
        self, op: dict[str, Any], *, project: str, timeout_s: float = 600.0, poll_s: float = 0.5
    ) -> dict[str, Any]:
        """Wait for a zonal or global operation with its ``wait`` method, in a loop, under a deadline.

        ``wait`` returns after at most ~2 minutes even if the operation is not done, so we loop.
        A DONE operation carrying ``error`` raises GcpOperationError (the anchor ignored it).
        """
        deadline = time.monotonic() + timeout_s
        zone = short_name(op.get("zone")) or None
        region = short_name(op.get("region")) or None  # regional resources (resource policies)
        name = op.get("name")
        base = (
            f"projects/{project}/zones/{zone}/operations/{name}"
            if zone
            else f"projects/{project}/regions/{region}/operations/{name}"
            if region
            else f"projects/{project}/global/operations/{name}"
        )
        current = op
        while current.get("status") != "DONE":
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise GcpOperationError(
                    f"{op.get('operationType', 'operation')} of '{short_name(op.get('targetLink'))}' in "
                    f"{zone or 'global'} did not finish within {timeout_s:.0f} s (operation {name}, "
                    f"last status "
                    f"{current.get('status')}); it may still complete: check the console, or raise "
                    f"operation_timeout",
                    code="TIMEOUT",
                    zone=zone,
                    operation=name,
                )
            waited = self.request(
                "POST", f"{base}/wait", timeout_s=max(0.2, min(remaining, 130.0)), timeout_is_an_answer=True
            )
            current = waited or current
            if current.get("status") != "DONE":
                time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        if current.get("error"):
            code, message = operation_error_message(current, zone)
            raise GcpOperationError(message, code=code, zone=zone, operation=name)
        return current


class _RecordingRequest(google.auth.transport.requests.Request if HAS_GCP_LIBRARIES else object):  # type: ignore[misc]
    """google-auth's request adapter, keeping the HTTP status of each token endpoint answer.

    google-auth's RefreshError does not carry the status; without it a token endpoint that
    answers 500 (its fault, retry later) cannot be told from one that refuses the key (400).
    """

    def __init__(self, session: Any = None) -> None:
        super().__init__(session=session)
        self.statuses: list[int] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        response = super().__call__(*args, **kwargs)
        self.statuses.append(int(response.status))
        return response


def _first_line(exc: BaseException) -> str:
    """An exception's own words, one line (google-auth's carry a tuple with the raw answer)."""
    text = str(exc.args[0]) if exc.args else str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # pragma: no cover - a uid without a passwd entry (some containers)
        return str(os.geteuid())


# What a credentials file of another type is, and what to do with it instead.
OTHER_KEY_TYPES = {
    "authorized_user": "these are user credentials (what 'gcloud auth application-default login' "
    "writes): use auth_kind: application, which finds them, or create a service-account key",
    "external_account": "this is a workload identity federation config: use auth_kind: application with "
    "GOOGLE_APPLICATION_CREDENTIALS set to this file",
    "impersonated_service_account": "this is an impersonation config: use auth_kind: application with "
    "GOOGLE_APPLICATION_CREDENTIALS set to this file",
}


def read_key_file(key_file: str) -> str:
    """The text of a key file; each way a path fails to be a readable key is named with its fix."""
    path = os.path.expanduser(key_file)
    where = f"credentials_file: '{key_file}'"
    fix = f"point credentials_file (or {ENV_CREDENTIALS_FILE}) at the service-account JSON key file"
    denied = f"{where} cannot be read by the user running Ansible ({_user_name()}): permission denied"
    try:
        mode = os.stat(path).st_mode
    except PermissionError:
        raise GcpAuthError(
            f"{denied} on a directory above it; let that user through (chmod o+x on the directory) "
            "or move the key to a directory of that user's"
        ) from None
    except (FileNotFoundError, NotADirectoryError):
        raise GcpAuthError(f"{where} does not exist; {fix}") from None
    if stat.S_ISDIR(mode):
        raise GcpAuthError(f"{where} is a directory, not a key file; {fix} inside it")
    if not stat.S_ISREG(mode):
        raise GcpAuthError(f"{where} is not a regular file; {fix}")
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except PermissionError:
        user = _user_name()
        raise GcpAuthError(
            f"{denied}; give that user read access, e.g. 'chown {user} {key_file} && chmod 0600 {key_file}'"
        ) from None
    except OSError as exc:
        raise GcpAuthError(f"{where} cannot be read ({exc.strerror}); {fix}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise GcpAuthError(
            f"{where} is not a text file (a P12 key?); forja needs the JSON key: create one under "
            "IAM > Service accounts > Keys > Add key > JSON"
        ) from None


def load_service_account_info(credentials_json: str | None, key_file: str | None) -> dict[str, Any]:
    """Read and check a service-account key; errors name the field and never echo the key."""
    if credentials_json:
        source = "credentials_json"
        text = credentials_json
    elif key_file:
        source = "credentials_file"
        text = read_key_file(key_file)
    else:
        raise GcpAuthError(
            f"credentials_file: not set; set it (or {ENV_CREDENTIALS_FILE}) to a service-account JSON key"
        )
    where = f"'{key_file}'" if source == "credentials_file" else "the given text"
    try:
        info = json.loads(text)
    except ValueError as exc:
        raise GcpAuthError(
            f"{source}: {where} is not JSON (line {getattr(exc, 'lineno', '?')}, column "
            f"{getattr(exc, 'colno', '?')}); download the key again from IAM > Service accounts > Keys"
        ) from None
    if not isinstance(info, dict):
        raise GcpAuthError(
            f"{source}: {where} is JSON but a {type(info).__name__}, not a key object; download the "
            "key again from IAM > Service accounts > Keys"
        )
    client = next((k for k in ("installed", "web") if isinstance(info.get(k), dict)), None)
    if client is not None and "type" not in info:
        raise GcpAuthError(
            f"{source}: {where} is an OAuth client secret (top-level \"{client}\"), not a service-account "
            "key: it names an app, not an account that may use the project. Create a key under IAM > "
            "Service accounts > Keys > Add key > JSON and point credentials_file (or "
            f"{ENV_CREDENTIALS_FILE}) at it, or unset it and run 'gcloud auth application-default login'"
        )
    kind = info.get("type")
    if kind not in (None, "service_account"):
        fix = OTHER_KEY_TYPES.get(
            str(kind), "create a service-account key (IAM > Service accounts > Keys > Add key > JSON)"
        )
        raise GcpAuthError(
            f"{source}: {where} holds credentials of type '{kind}', not a service-account key "
            f"(type 'service_account'); {fix}"
        )
    missing = [k for k in SERVICE_ACCOUNT_KEYS if not info.get(k)]
    if missing:
        raise GcpAuthError(
            f"{source}: the service-account key lacks {', '.join(missing)}; download a complete JSON key"
        )
    return info


def refresh_error_message(creds: Any, exc: Exception, statuses: list[int] | None = None) -> str:
    """Why no token came back, by its true cause, without the assertion or the key.

    A 5xx (or an error Google marks retryable) is the token endpoint's own failure: the key is
    fine and a new one would not help. A 4xx is a refusal of this key.
    """
    who = getattr(creds, "service_account_email", None) or "the credentials"
    where = getattr(creds, "_token_uri", None) or "the token endpoint"
    detail = _first_line(exc)
    status = statuses[-1] if statuses else None
    if (status is not None and status >= 500) or getattr(exc, "retryable", False):
        tries = len(statuses or []) or 1
        answered = f"HTTP {status}" if status else "a server error"
        return (
            f"credentials: the token endpoint {where} failed: it answered {answered} ({detail}) "
            f"{tries} time{'s' if tries != 1 else ''}. The key for {who} is not at fault: retry later "
            "(see https://status.cloud.google.com)"
        )
    answered = f" with HTTP {status}" if status else ""
    if status is not None and status not in (400, 401, 403):
        return (
            f"credentials: the token endpoint {where} answered{answered} ({detail}); check the "
            "key's token_uri (Google's is https://oauth2.googleapis.com/token)"
        )
    if "short-lived" in detail or "timeframe" in detail:  # Google's words for a skewed iat/exp
        fix = "the controller's clock is probably wrong: sync it (e.g. 'timedatectl set-ntp true')"
    else:
        fix = (
            "the key may be deleted or disabled, or its account deleted: create a new key for the "
            "service account (IAM > Service accounts > Keys)"
        )
    return f"credentials: {where} refused a token for {who}{answered}: {detail}. What to do: {fix}"


# The connection options every forja GCP module takes (documented in each module's DOCUMENTATION).
AUTH_ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "project": {"type": "str"},
    "api_url": {"type": "str"},
    "auth_kind": {"type": "str", "default": "auto", "choices": list(AUTH_KINDS)},
    "credentials_file": {"type": "path"},
    "credentials_json": {"type": "str", "no_log": True},
    "access_token": {"type": "str", "no_log": True},
    "request_timeout": {"type": "float", "default": 30.0},
    "operation_timeout": {"type": "float", "default": 900.0},
}


def config_from_params(params: dict[str, Any], user_agent: str) -> GcpConfig:
    """Build a GcpConfig from module parameters (env fills what the options leave empty)."""
    return GcpConfig(
        project=params.get("project"),
        api_url=params.get("api_url"),
        auth_kind=params.get("auth_kind") or "auto",
        credentials_file=params.get("credentials_file"),
        credentials_json=params.get("credentials_json"),
        access_token=params.get("access_token"),
        request_timeout_s=float(params.get("request_timeout") or 30.0),
        user_agent=user_agent,
    )
