# Copyright: forja contributors
# Apache-2.0
"""forja's checkpoint bucket on Cloud Storage, through Google's own client (google-cloud-storage).

What a bucket for a GPU VM's checkpoints must be, and how to tell what differs from that: the
module gcp_gpu_bucket reads these pieces, compares ``view(current)`` with ``view(wanted)`` and
changes only what differs. Auth is forja_gcp.py's (the same options as every gcp_gpu_* module);
the endpoint is Google's, or an emulator named like google-cloud-storage's own setting,
STORAGE_EMULATOR_HOST (then without credentials, as that client does).

Bad input is refused here, before any call that changes something: a name that breaks GCS's naming
rules, a location that is not one, a service account that is not an email.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import GcpClient, GcpConfig
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import SpecError

try:
    import google.auth.exceptions
    import requests
    from google.api_core import exceptions as api_exceptions
    from google.cloud import storage
    from google.cloud.storage.retry import DEFAULT_RETRY

    HAS_STORAGE = True
    STORAGE_IMPORT_ERROR = None
    #: What the client raises when the API refuses, or cannot be reached, or the credentials fail.
    CLIENT_ERRORS: tuple[type[Exception], ...] = (
        api_exceptions.GoogleAPIError, requests.RequestException, google.auth.exceptions.GoogleAuthError)
except ImportError as exc:  # pragma: no cover - exercised only without the controller venv
    HAS_STORAGE = False
    STORAGE_IMPORT_ERROR = exc
    CLIENT_ERRORS = ()

#: The environment variable google-cloud-storage itself reads for an emulator's endpoint.
ENV_EMULATOR = "STORAGE_EMULATOR_HOST"
#: Bucket IAM needs full control (storage.buckets.setIamPolicy); read_write does not include it.
STORAGE_SCOPES = ("https://www.googleapis.com/auth/devstorage.full_control",)
#: What the VM's service account gets on the bucket, and only there: read, write and delete objects.
OBJECT_ROLE = "roles/storage.objectAdmin"
#: Multi-regions and predefined dual-regions (cloud.google.com/storage/docs/locations); a region
#: (us-central1, europe-west4, ...) is checked by its form, and by the API on creation.
MULTI_AND_DUAL_REGIONS = frozenset({"US", "EU", "ASIA", "NAM4", "EUR4", "EUR5", "EUR7", "EUR8", "ASIA1"})
REGION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
SERVICE_ACCOUNT_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*@[a-z0-9][a-z0-9.-]*\.gserviceaccount\.com$")
_NAME_CHARS = re.compile(r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$")
_GOOGLE_LIKE = re.compile(r"g[o0]{2}gle|g[o0]{2}g1e|g[o0]{2}9le|g[o0]{2}91e")


def bucket_name_problem(name: str) -> str | None:
    """Why `name` breaks Cloud Storage's bucket naming rules, or None when it keeps them.

    cloud.google.com/storage/docs/buckets#naming: 3-63 characters (up to 222 with dots, each
    dot-separated part at most 63); lower-case letters, digits, '-', '_' and '.'; starting and
    ending with a letter or digit; not an IP address; not starting with "goog", nor containing
    "google" or a look-alike.
    """
    if not 3 <= len(name) <= (222 if "." in name else 63):
        return "it must be 3-63 characters long (up to 222 when it has dots)"
    if not _NAME_CHARS.match(name):
        return ("it may hold only lower-case letters, digits, '-', '_' and '.', and must start and end "
                "with a letter or digit")
    if any(len(part) > 63 or not part for part in name.split(".")):
        return "each dot-separated part must be 1-63 characters"
    try:
        ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        return "it must not be an IP address"
    if name.startswith("goog") or _GOOGLE_LIKE.search(name):
        return "it must not start with 'goog' nor contain 'google' or a look-alike"
    return None


def validate(params: dict[str, Any]) -> None:
    """Refuse bad input (SpecError naming the field and the fix) before anything is read or changed."""
    name = params["name"]
    problem = bucket_name_problem(name)
    if problem:
        raise SpecError(f"name: '{name}' is not a valid bucket name: {problem}; "
                        "e.g. 'forja-<project>-checkpoints' (bucket names are global)")
    if params["state"] == "absent":
        return
    location = params.get("location")
    if not location:
        raise SpecError("location: required with state=present; give the VM's region (e.g. us-central1), "
                        "so checkpoints do not cross regions")
    if location.upper() not in MULTI_AND_DUAL_REGIONS and not REGION_RE.match(location.lower()):
        raise SpecError(f"location: '{location}' is not a Cloud Storage location; give a region such "
                        f"as us-central1, or one of {', '.join(sorted(MULTI_AND_DUAL_REGIONS))}")
    account = params.get("service_account_email")
    if account and not SERVICE_ACCOUNT_RE.match(account):
        raise SpecError(f"service_account_email: '{account}' is not a service account's email; give "
                        "NAME@PROJECT.iam.gserviceaccount.com (the VM's service account)")
    if params["checkpoint_retention_days"] < 0:
        raise SpecError("checkpoint_retention_days: must be 0 (keep checkpoints) or a number of days")
    prefix = params["checkpoint_prefix"]
    if params["checkpoint_retention_days"] and (not prefix or prefix.startswith("/")):
        raise SpecError("checkpoint_prefix: give the folder the checkpoints live in (e.g. 'checkpoints/'), "
                        "not empty nor starting with '/': the rule would delete every old object")


@dataclass(frozen=True)
class Wanted:
    """The bucket as forja wants it."""

    name: str
    location: str
    lifecycle_rule: dict[str, Any] | None
    service_account_email: str | None

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Wanted:
        days = params["checkpoint_retention_days"]
        rule = None
        if days:
            rule = {"action": {"type": "Delete"},
                    "condition": {"age": days, "matchesPrefix": [params["checkpoint_prefix"]]}}
        return cls(params["name"], params["location"].upper(), rule, params.get("service_account_email"))


def is_our_rule(rule: dict[str, Any], prefix: str) -> bool:
    """A Delete rule on exactly our prefix is forja's, whatever its age: one to keep in line."""
    condition = rule.get("condition") or {}
    return (rule.get("action") or {}).get("type") == "Delete" and condition.get("matchesPrefix") == [prefix]


def lifecycle_after(
    rules: list[dict[str, Any]], wanted: dict[str, Any] | None, prefix: str
) -> list[dict[str, Any]]:
    """The bucket's lifecycle rules with forja's put right: others (the user's) are kept as they are."""
    kept = [r for r in rules if not is_our_rule(r, prefix)]
    return kept + ([wanted] if wanted else [])


def policy_members(policy: Any, role: str) -> set[str]:
    """Members of the unconditional binding of `role` in a bucket IAM policy."""
    return {m for b in policy.bindings if b.get("role") == role and not b.get("condition")
            for m in b.get("members") or ()}


def view(bucket: Any, members: set[str] | None, prefix: str) -> dict[str, Any]:
    """What forja manages on a bucket, as plain data (diff's before/after, the module's return)."""
    if bucket is None:
        return {}
    ours = [r for r in (bucket.lifecycle_rules or []) if is_our_rule(r, prefix)]
    return {
        "name": bucket.name,
        "location": (bucket.location or "").upper(),
        "uniform_bucket_level_access": bool(bucket.iam_configuration.uniform_bucket_level_access_enabled),
        "public_access_prevention": bucket.iam_configuration.public_access_prevention,
        "checkpoint_lifecycle_rule": dict(ours[0]) if ours else None,
        "object_admins": sorted(members or ()),
    }


def wanted_view(wanted: Wanted, current_members: set[str]) -> dict[str, Any]:
    members = set(current_members) | ({f"serviceAccount:{wanted.service_account_email}"}
                                      if wanted.service_account_email else set())
    return {
        "name": wanted.name,
        "location": wanted.location,
        "uniform_bucket_level_access": True,
        "public_access_prevention": "enforced",
        "checkpoint_lifecycle_rule": wanted.lifecycle_rule,
        "object_admins": sorted(members),
    }


def call_options(request_timeout: float) -> dict[str, Any]:
    """Each call waits `request_timeout` for an answer, and retries (429, 5xx, connection errors) no
    longer than that in all: Google's default, 120 s, leaves a run hanging on a stopped emulator."""
    return {"timeout": request_timeout, "retry": DEFAULT_RETRY.with_timeout(request_timeout)}


def emulator_host(params: dict[str, Any], env: dict[str, str]) -> str | None:
    return params.get("storage_emulator_host") or env.get(ENV_EMULATOR) or None


def make_client(config: GcpConfig, emulator: str | None) -> Any:
    """A google-cloud-storage client with forja's auth options, or without credentials on an emulator."""
    if not HAS_STORAGE:
        raise SpecError(f"the 'google-cloud-storage' library is needed on the controller "
                        f"(pip install forja, or google-cloud-storage): {STORAGE_IMPORT_ERROR}")
    project = config.resolved_project()
    if emulator:
        return storage.Client(project=project, client_options={"api_endpoint": emulator},
                              use_auth_w_custom_endpoint=False)
    gcp = GcpClient(dataclasses.replace(config, scopes=STORAGE_SCOPES))
    return storage.Client(project=project, credentials=gcp.google_credentials())


def api_message(exc: Exception) -> str:
    """The API's own words for an error (google.api_core puts them in .message)."""
    return str(getattr(exc, "message", None) or exc).splitlines()[0]


def lookup(client: Any, name: str, project: str, call: dict[str, Any]) -> Any:
    """The bucket, None when it does not exist; SpecError when it exists but is not this project's."""
    try:
        bucket = client.lookup_bucket(name, **call)
    except api_exceptions.Forbidden as exc:
        raise SpecError(
            f"name: bucket '{name}' exists, but these credentials may not read it (403, storage.buckets.get: "
            f"{api_message(exc)}). Bucket names are global, so it most likely belongs to another project: "
            f"choose another name, or ask its owner for roles/storage.admin on it") from None
    if bucket is None:
        return None
    ours = {b.name for b in client.list_buckets(project=project, prefix=name, **call)}
    if name not in ours:
        raise SpecError(
            f"name: bucket '{name}' belongs to another project (project number {bucket.project_number}), "
            f"not '{project}'; choose another name (bucket names are global)")
    return bucket


def create_error(exc: Exception, name: str, project: str, location: str) -> SpecError:
    """What a refused bucket creation means, naming the field to change."""
    if isinstance(exc, api_exceptions.Conflict):
        return SpecError(f"name: bucket '{name}' is already taken (409: {api_message(exc)}); bucket names "
                         "are global: choose another name")
    if isinstance(exc, api_exceptions.Forbidden):
        return SpecError(f"project: these credentials may not create buckets in '{project}' (403, "
                         f"storage.buckets.create: {api_message(exc)}); grant roles/storage.admin on the "
                         "project to the account Ansible runs as")
    if isinstance(exc, api_exceptions.BadRequest) and "location" in api_message(exc).lower():
        return SpecError(f"location: '{location}' was refused by Cloud Storage ({api_message(exc)}); give a "
                         "region such as us-central1")
    return SpecError(f"name: creating bucket '{name}' failed ({type(exc).__name__}: {api_message(exc)})")


def create(client: Any, bucket: Any, location: str, call: dict[str, Any]) -> Any:
    """Create `bucket` (its settings already set) in `location`; a refusal becomes a SpecError."""
    try:
        return client.create_bucket(bucket, location=location.lower(), **call)
    except api_exceptions.GoogleAPICallError as exc:
        raise create_error(exc, bucket.name, client.project, location) from None
