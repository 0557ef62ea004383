"""Errors in the shape Vertex AI's REST front end answers: ``google.rpc.Status`` as JSON.

Vertex is a gRPC service transcoded to REST, so its errors are ``{"error": {"code", "message",
"status", "details"}}`` where ``code`` is the HTTP status and ``details`` carries typed messages
(``google.rpc.BadRequest`` with ``fieldViolations`` for a bad body). google-api-core turns that body
into ``InvalidArgument``/``NotFound``/... with the message, which is what clients see.
"""

from __future__ import annotations

from typing import Any

from ..emulator_http import HttpError

#: HTTP status -> the google.rpc.Code name Google sends with it.
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "ALREADY_EXISTS",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
}
BAD_REQUEST_TYPE = "type.googleapis.com/google.rpc.BadRequest"


class VertexError(HttpError):
    """One error answer: HTTP code, google.rpc status name, message and field violations."""

    def __init__(
        self,
        code: int,
        message: str,
        status: str | None = None,
        violations: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or STATUS_NAMES.get(code, "UNKNOWN")
        self.violations = violations or []

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message, "status": self.status}
        if self.violations:
            error["details"] = [
                {
                    "@type": BAD_REQUEST_TYPE,
                    "fieldViolations": [{"field": f, "description": d} for f, d in self.violations],
                }
            ]
        return {"error": error}


def found_errors(violations: list[tuple[str, str]]) -> VertexError:
    """Vertex's semantic-check wording: ``List of found errors:\\t1.Field: f; Message: m.\\t``."""
    items = "".join(f"{i}.Field: {f}; Message: {m}\t" for i, (f, m) in enumerate(violations, 1))
    return VertexError(400, f"List of found errors:\t{items}", violations=violations)


def bad_payload(message: str, field: str) -> VertexError:
    """A body the JSON/proto parser refuses, before any semantic check (``Invalid JSON payload``)."""
    return VertexError(400, f"Invalid JSON payload received. {message}", violations=[(field, message)])


def not_found(what: str) -> VertexError:
    return VertexError(404, f"{what} not found.")


def failed_precondition(message: str) -> VertexError:
    return VertexError(400, message, status="FAILED_PRECONDITION")
