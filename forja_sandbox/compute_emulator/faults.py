"""Fault injection: the failures forja must survive, on demand.

A rule matches a method (`instances.insert`, `compute.instances.insert`, `token` or `*`),
optionally a zone and project, and fires `times` times (None: until cleared). What it does:
- `status=429|403|500|503|...`: the HTTP call fails synchronously with Google's error body
  (429 rateLimitExceeded, 403 quotaExceeded, 503 backendError, ...), `reason`/`message` override;
- `error="ZONE_RESOURCE_POOL_EXHAUSTED"|"QUOTA_EXCEEDED"|...`: the call succeeds but its
  operation ends DONE with that error, the way Google reports stock-outs;
- `delay_s=...`: the operation (or, for a read, the response) is slowed down by that much.
"""

from __future__ import annotations

import dataclasses
import threading

from .errors import ApiError

_OPERATION_ERRORS = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": (
        503,
        "The zone '{scope}' does not have enough resources available to fulfill the request. "
        "Try a different zone, or try again later.",
    ),
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": (
        503,
        "The zone '{scope}' does not have enough resources available to fulfill the request. "
        "'(resource type:compute)'.",
    ),
    "QUOTA_EXCEEDED": (403, "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region {region}."),
}
_STATUS_REASONS = {403: ("quotaExceeded", "Quota exceeded for quota metric 'Queries'."), 429: (
    "rateLimitExceeded", "Rate Limit Exceeded")}  # fmt: skip


@dataclasses.dataclass
class Fault:
    method: str = "*"
    status: int | None = None
    error: str | None = None
    delay_s: float = 0.0
    zone: str | None = None
    project: str | None = None
    times: int | None = 1
    reason: str | None = None
    message: str | None = None
    fired: int = 0

    def matches(self, method_id: str, project: str | None, zone: str | None) -> bool:
        wanted = self.method.removeprefix("compute.")
        if wanted not in ("*", method_id.removeprefix("compute.")):
            return False
        if self.zone is not None and self.zone != zone:
            return False
        return self.project is None or self.project == project

    def api_error(self) -> ApiError:
        assert self.status is not None
        reason, message = _STATUS_REASONS.get(self.status, (None, None))
        return ApiError(self.status, self.message or message, self.reason or reason)

    def operation_error(self, scope: str, region: str) -> tuple[int, dict[str, object]]:
        """(httpErrorStatusCode, Operation.error) for an operation that this fault fails."""
        assert self.error is not None
        status, template = _OPERATION_ERRORS.get(self.error, (400, "{code}"))
        text = self.message or template.format(scope=scope, region=region, code=self.error)
        return status, {"errors": [{"code": self.error, "message": text}]}


#: A delay longer than this is a mistake, not a drill (an operation waits for it in full).
MAX_DELAY_S = 600.0


def _check_rule(method: object, status: object, error: object, delay_s: object, times: object,
                texts: tuple[object, ...]) -> None:  # fmt: skip
    """Refuse a rule that would break every later request (a status Google never sends, a method
    that is not a name), naming the keyword: checked when the rule is added, never when it fires."""
    if not isinstance(method, str) or not method:
        raise ValueError(f"method: a method id such as 'instances.insert', or '*' (got {method!r})")
    if status is not None and not (_whole(status) and 400 <= status <= 599):  # type: ignore[operator]
        raise ValueError(f"status: an HTTP error status from 400 to 599 (got {status!r})")
    if error is not None and not isinstance(error, str):
        raise ValueError(f"error: an operation error code, e.g. 'QUOTA_EXCEEDED' (got {error!r})")
    if isinstance(delay_s, bool) or not isinstance(delay_s, int | float) or not 0 <= delay_s <= MAX_DELAY_S:
        raise ValueError(f"delay_s: seconds from 0 to {MAX_DELAY_S:g} (got {delay_s!r})")
    if times is not None and not (_whole(times) and times >= 1):  # type: ignore[operator]
        raise ValueError(f"times: a count of at least 1, or null for until cleared (got {times!r})")
    for text in texts:
        if text is not None and not isinstance(text, str):
            raise ValueError(f"zone, project, reason and message are text (got {text!r})")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Faults:
    """The active fault rules; thread-safe, consulted by every request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[Fault] = []

    def add(
        self,
        method: str = "*",
        *,
        status: int | None = None,
        error: str | None = None,
        delay_s: float = 0.0,
        zone: str | None = None,
        project: str | None = None,
        times: int | None = 1,
        reason: str | None = None,
        message: str | None = None,
    ) -> Fault:
        _check_rule(method, status, error, delay_s, times, (zone, project, reason, message))
        if status is None and error is None and not delay_s:
            raise ValueError("a fault needs status=, error= or delay_s=")
        fault = Fault(method, status, error, delay_s, zone, project, times, reason, message)
        with self._lock:
            self._rules.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    @property
    def rules(self) -> list[Fault]:
        with self._lock:
            return list(self._rules)

    def take(self, method_id: str, project: str | None = None, zone: str | None = None) -> list[Fault]:
        """The rules that fire for this call (at most one of each kind), counting them down."""
        fired: list[Fault] = []
        kinds: set[str] = set()
        with self._lock:
            for fault in self._rules:
                kind = "status" if fault.status else "error" if fault.error else "delay"
                if kind in kinds or not fault.matches(method_id, project, zone):
                    continue
                kinds.add(kind)
                fault.fired += 1
                if fault.times is not None:
                    fault.times -= 1
                fired.append(fault)
            self._rules = [f for f in self._rules if f.times is None or f.times > 0]
        return fired
