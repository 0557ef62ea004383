"""Google-shaped API errors.

Clients (ours and Google's) branch on `error.code`, `error.status` and `errors[].reason`, so the
emulator raises one exception type that already knows how to render itself the way the real API
does, instead of each handler assembling error bodies by hand.
"""

from __future__ import annotations

from typing import Any

from ..emulator_http import HttpError

STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "ALREADY_EXISTS",
    412: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
}

DEFAULT_REASONS = {
    400: "invalid",
    401: "authError",
    403: "forbidden",
    404: "notFound",
    405: "httpMethodNotAllowed",
    409: "alreadyExists",
    412: "conditionNotMet",
    429: "rateLimitExceeded",
    500: "backendError",
    501: "notImplemented",
    503: "backendError",
}

DEFAULT_MESSAGES = {
    429: "Rate Limit Exceeded",
    500: "Internal error. Please try again or contact Google Support.",
    503: "The service is currently unavailable.",
}


class ApiError(HttpError):
    """An error answer of the Compute API: HTTP status plus Google's JSON error body."""

    def __init__(
        self,
        code: int,
        message: str | None = None,
        reason: str | None = None,
        *,
        domain: str = "global",
        status: str | None = None,
        headers: dict[str, str] | None = None,
        item_message: str | None = None,
        location: str | None = None,
        extended_help: str | None = None,
        details: list[dict[str, Any]] | None = None,
        classic: bool = True,
    ) -> None:
        self.code = code
        # Auth errors: Google's `errors[]` item has its own short message and names the header.
        self.item_message = item_message
        self.location = location
        # Newer error bodies: `google.rpc` detail messages (ErrorInfo, Help, ...), and no classic
        # `errors[]` list for the APIs that answer without one (`classic=False`).
        self.extended_help = extended_help
        self.details = details
        self.classic = classic
        self.message = message or DEFAULT_MESSAGES.get(code, STATUS_NAMES.get(code, "error"))
        self.reason = reason or DEFAULT_REASONS.get(code, "error")
        self.domain = domain
        self.status = status or STATUS_NAMES.get(code, "UNKNOWN")
        self.headers = headers or {}
        super().__init__(f"{code} {self.reason}: {self.message}")

    def body(self) -> dict[str, Any]:
        item: dict[str, Any] = {
            "message": self.item_message or self.message,
            "domain": self.domain,
            "reason": self.reason,
        }
        if self.location:
            item.update(location=self.location, locationType="header")
        if self.extended_help:
            item["extendedHelp"] = self.extended_help
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.classic:
            error["errors"] = [item]
        error["status"] = self.status
        if self.details:
            error["details"] = self.details
        return {"error": error}


def not_found(resource: str) -> ApiError:
    """The exact wording Google uses for a missing resource path (`projects/p/zones/z/...`)."""
    return ApiError(404, f"The resource '{resource}' was not found", "notFound")


def already_exists(resource: str) -> ApiError:
    return ApiError(409, f"The resource '{resource}' already exists", "alreadyExists")


def invalid_field(field: str, value: Any, why: str = "") -> ApiError:
    """400 naming the field path the way Google does: `Invalid value for field 'resource.x': 'v'.`"""
    shown = value if isinstance(value, str) else _compact(value)
    message = f"Invalid value for field '{field}': '{shown}'."
    if why:
        message += f" {why}"
    return ApiError(400, message, "invalid")


def required_field(field: str) -> ApiError:
    return ApiError(400, f"Required field '{field}' not specified", "required")


def unknown_field(name: str, at: str) -> ApiError:
    """Google's proto-JSON parser refuses unknown names before any handler runs."""
    where = f" at '{at}'" if at else ""
    return ApiError(400, f'Invalid JSON payload received. Unknown name "{name}"{where}: Cannot find field.')


def bad_request(message: str, reason: str = "badRequest") -> ApiError:
    return ApiError(400, message, reason)


def _compact(value: Any) -> str:
    import json

    return json.dumps(value, separators=(",", ":"), sort_keys=True)
