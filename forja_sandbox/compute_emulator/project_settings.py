"""What a project is beyond its resources: APIs enabled, billing, quota limits, who may do what.

A preflight check (`forja check`) asks Google the questions that decide whether a launch can
work: does the project exist and may I see it, is billing on, are the APIs enabled, is there GPU
quota, do I hold the permissions. Each answer comes from one `ProjectSettings`, which a test
changes with `ComputeEmulator.configure_project(...)` (or `PUT /emulator/v1/projects/{p}`) to make
one check fail. A project the emulator serves starts with everything allowed and generous
quotas, so existing tests and the sandbox never meet a limit they did not ask for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from . import quotas as quota_table

#: What a linked project's billing account is called (Google's form: three groups of 6 hex digits).
DEFAULT_BILLING_ACCOUNT = "billingAccounts/0F0F0F-1E1E1E-2D2D2D"
#: `viewers` value meaning "every key the emulator knows".
EVERYONE = "*"
#: What a brand-new Google Cloud project lacks (see `brand_new`).
NEW_PROJECT_DISABLED_SERVICES = ("compute.googleapis.com", "iap.googleapis.com", "aiplatform.googleapis.com")
NEW_PROJECT_DENIED_PERMISSIONS = ("iap.tunnelInstances.accessViaIAP",)
NEW_PROJECT_ZERO_QUOTAS = (
    ("global", "GPUS_ALL_REGIONS"),
    ("*", "NVIDIA_L4_GPUS"),
    ("*", "PREEMPTIBLE_NVIDIA_L4_GPUS"),
)


QuotaKey = tuple[str, str]  # (scope, metric): scope is a region, "*" (every region) or "global"


@dataclasses.dataclass
class ProjectSettings:
    """One project's answers to the preflight questions (see the README's Interface table)."""

    exists: bool = True
    billing_enabled: bool = True
    billing_account: str = DEFAULT_BILLING_ACCOUNT
    disabled_services: frozenset[str] = frozenset()
    #: Overrides of the default limits; see `quotas.limit()`.
    quotas: dict[QuotaKey, float] = dataclasses.field(default_factory=dict)
    denied_permissions: frozenset[str] = frozenset()
    #: Client emails that may see the project (`EVERYONE`: every key).
    viewers: frozenset[str] | str = EVERYONE
    #: How long a Flex-start request waits PENDING before Google "finds" its capacity; past the
    #: request's requestValidForDuration, the request fails (ZONE_RESOURCE_POOL_EXHAUSTED).
    flex_start_wait_s: float = 0.0

    def can_see(self, email: str) -> bool:
        return self.exists and (self.viewers == EVERYONE or email in self.viewers)

    def holds(self, email: str, permission: str) -> bool:
        """Whether a caller holds a permission on the project (no IAM roles: all, less the denied)."""
        return self.can_see(email) and permission not in self.denied_permissions

    def enabled(self, service: str) -> bool:
        return service not in self.disabled_services

    # -- persistence -----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "exists": self.exists,
            "billing_enabled": self.billing_enabled,
            "billing_account": self.billing_account,
            "disabled_services": sorted(self.disabled_services),
            "quotas": {f"{scope}/{metric}": limit for (scope, metric), limit in sorted(self.quotas.items())},
            "denied_permissions": sorted(self.denied_permissions),
            "viewers": self.viewers if isinstance(self.viewers, str) else sorted(self.viewers),
            "flex_start_wait_s": self.flex_start_wait_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProjectSettings:
        settings = cls()
        settings.update(**data)
        return settings

    # -- changes ---------------------------------------------------------------------------
    def update(
        self,
        *,
        exists: bool | None = None,
        billing_enabled: bool | None = None,
        billing_account: str | None = None,
        disabled_services: Iterable[str] | None = None,
        quotas: Mapping[Any, float | None] | None = None,
        denied_permissions: Iterable[str] | None = None,
        viewers: Iterable[str] | str | None = None,
        flex_start_wait_s: float | None = None,
    ) -> None:
        """Change what is given (None: keep). `quotas` merges (a limit of None drops an override);
        the sets replace. Raises ValueError/TypeError for a value Google could not hold."""
        if exists is not None:
            self.exists = _flag("exists", exists)
        if billing_enabled is not None:
            self.billing_enabled = _flag("billing_enabled", billing_enabled)
            if not billing_enabled and billing_account is None:
                self.billing_account = ""  # unlinked, as a project without an account answers
            elif billing_enabled and not self.billing_account and billing_account is None:
                self.billing_account = DEFAULT_BILLING_ACCOUNT
        if billing_account is not None:
            if billing_account and not billing_account.startswith("billingAccounts/"):
                wanted = "'billingAccounts/XXXXXX-XXXXXX-XXXXXX'"
                raise ValueError(f"billing_account: {wanted}, not {billing_account!r}")
            self.billing_account = billing_account
        if disabled_services is not None:
            self.disabled_services = _names("disabled_services", disabled_services)
        if quotas is not None:
            if not isinstance(quotas, Mapping):
                raise TypeError("quotas: a mapping of (scope, metric) or 'scope/METRIC' to a limit")
            for key, limit in quotas.items():
                parsed = quota_table.parse_key(key)
                if limit is None:
                    self.quotas.pop(parsed, None)
                elif isinstance(limit, bool) or not isinstance(limit, int | float) or limit < 0:
                    raise ValueError(f"quotas[{key!r}]: a limit >= 0, not {limit!r}")
                else:
                    self.quotas[parsed] = float(limit)
        if denied_permissions is not None:
            self.denied_permissions = _names("denied_permissions", denied_permissions)
        if viewers is not None:
            self.viewers = EVERYONE if viewers == EVERYONE else _names("viewers", viewers)
        if flex_start_wait_s is not None:
            if isinstance(flex_start_wait_s, bool) or not isinstance(flex_start_wait_s, int | float) or not (
                0 <= flex_start_wait_s <= 7200 + 600
            ):
                raise ValueError(f"flex_start_wait_s: seconds from 0 to 7800, not {flex_start_wait_s!r}")
            self.flex_start_wait_s = float(flex_start_wait_s)

    def make_brand_new(self) -> None:
        """As a project just created in the console looks: no GPU quota (GPUS_ALL_REGIONS and the L4
        ones), Compute, IAP and Vertex AI not enabled, and no right to tunnel through IAP."""
        self.exists = True
        self.billing_enabled = True
        self.billing_account = DEFAULT_BILLING_ACCOUNT
        self.disabled_services = frozenset(NEW_PROJECT_DISABLED_SERVICES)
        self.quotas = {key: 0.0 for key in NEW_PROJECT_ZERO_QUOTAS}
        self.denied_permissions = frozenset(NEW_PROJECT_DENIED_PERMISSIONS)
        self.viewers = EVERYONE


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: true or false, not {value!r}")
    return value


def _names(name: str, values: Iterable[str] | str) -> frozenset[str]:
    items = [values] if isinstance(values, str) else list(values)
    if isinstance(values, str) or not all(isinstance(v, str) and v for v in items):
        raise TypeError(f"{name}: a list of names, not {values!r}")
    return frozenset(items)
