"""The replicas' output as Cloud Logging entries, served by Logging v2's ``entries:list``.

On Vertex, each line a replica writes to stdout or stderr becomes a LogEntry of monitored resource
``ml_job`` (labels ``job_id``, ``project_id``, ``task_name`` such as ``workerpool0-0``), stdout at
severity INFO, stderr at ERROR, and a client reads them back with ``POST v2/entries:list``. This
module keeps those entries in memory and answers that call as Google documents it
(https://cloud.google.com/logging/docs/reference/v2/rest/v2/entries/list): ``resourceNames``
required, ``orderBy`` "timestamp asc" (default) or "timestamp desc", entries with equal timestamps
in insertId order, ``pageSize`` 50 by default and at most 1000, ``pageToken`` from the previous page.

The filter is a subset of the Logging query language, enough for what clients send to follow a
job: comparisons (``=``, ``!=``, ``>``, ``>=``, ``<``, ``<=``, ``:``) of a field path with a
value, joined by ``AND`` (or a space). Anything else (OR, NOT, parentheses, functions) is refused
with 400 naming what is supported, never silently matched.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from datetime import datetime, timezone
from typing import Any

from .errors import VertexError

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
ORDERS = {"": False, "timestamp asc": False, "timestamp desc": True}
SEVERITIES = ("DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY")
_TERM = re.compile(
    r'\s*(?P<field>[A-Za-z_][\w.\-/]*)\s*(?P<op>>=|<=|!=|=|>|<|:)\s*(?P<value>"(?:[^"\\]|\\.)*"|[^\s()"]+)\s*'
)
_AND = re.compile(r"AND\s+|(?=\S)")
_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:?\d\d)$")


def rfc3339(ns: int) -> str:
    """Nanoseconds since the epoch as Logging writes timestamps: UTC, nine fraction digits, ``Z``."""
    seconds, frac = divmod(ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def parse_time(value: str) -> int:
    """An RFC 3339 timestamp (any fraction, ``Z`` or an offset) as nanoseconds since the epoch."""
    found = _RFC3339.match(value)
    if found is None:
        raise VertexError(
            400, f'Invalid timestamp "{value}" in the filter; use RFC 3339, e.g. 2026-01-02T03:04:05Z.'
        )
    whole, frac, zone = found.groups()
    zone = "+00:00" if zone == "Z" else zone
    stamp = datetime.fromisoformat(whole + zone)
    return int(stamp.timestamp()) * 1_000_000_000 + int((frac or "0").ljust(9, "0"))


class LogStore:
    """Every entry the emulator's replicas wrote, in the order written (timestamps never go back)."""

    def __init__(self) -> None:
        self._entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._last_ns = 0

    def append(self, project: str, job_id: str, task_name: str, text: str, stderr: bool) -> dict[str, Any]:
        """One line of one replica as Vertex logs it."""
        with self._lock:
            # Whole, distinct microseconds: what a client's datetime holds is the entry's exact time.
            ns = max(time.time_ns() // 1000, self._last_ns // 1000 + 1) * 1000
            self._last_ns = ns
            entry = {
                "logName": f"projects/{project}/logs/{task_name}",
                "resource": {
                    "type": "ml_job",
                    "labels": {"job_id": job_id, "project_id": project, "task_name": task_name},
                },
                "textPayload": text,
                "timestamp": rfc3339(ns),
                "receiveTimestamp": rfc3339(ns),
                "severity": "ERROR" if stderr else "INFO",
                "insertId": f"{next(self._ids):016x}",
            }
            self._entries.append(entry)
            return entry

    def list(self, body: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``entries:list`` for a request body (ListLogEntriesRequest's JSON)."""
        names = [*body.get("resourceNames", []), *(f"projects/{p}" for p in body.get("projectIds", []))]
        if not names:
            raise VertexError(
                400, "resourceNames: at least one parent resource is required, e.g. projects/P."
            )
        projects = set()
        for name in names:
            if not re.fullmatch(r"projects/[^/]+", name):
                raise VertexError(
                    400, f'resourceNames: "{name}" is not supported by the sandbox; use projects/P.'
                )
            projects.add(name.split("/", 1)[1])
        order = str(body.get("orderBy", "")).strip().lower()
        if order not in ORDERS:
            raise VertexError(400, f'orderBy: "{order}" is not "timestamp asc" or "timestamp desc".')
        size = int(body.get("pageSize") or DEFAULT_PAGE_SIZE)
        if size < 0 or size > MAX_PAGE_SIZE:
            raise VertexError(400, f"pageSize: {size} is negative or more than {MAX_PAGE_SIZE}.")
        try:
            start = int(body.get("pageToken") or 0)
        except ValueError:
            raise VertexError(
                400, f'pageToken: "{body.get("pageToken")}" is not a token this service gave.'
            ) from None
        terms = parse_filter(str(body.get("filter") or ""))
        with self._lock:
            entries = [
                e for e in self._entries
                if e["resource"]["labels"]["project_id"] in projects and all(_matches(e, t) for t in terms)
            ]  # fmt: skip
        entries.sort(key=lambda e: (parse_time(e["timestamp"]), e["insertId"]), reverse=ORDERS[order])
        page = entries[start : start + size]
        answer: dict[str, Any] = {"entries": page} if page else {}
        if start + size < len(entries):
            answer["nextPageToken"] = str(start + size)
        return answer


Term = tuple[str, str, str]


def parse_filter(text: str) -> list[Term]:
    """``a.b="x" AND c>=y ...`` as (field, operator, value) terms; 400 for what the subset lacks."""
    terms: list[Term] = []
    at = 0
    text = text.strip()
    while at < len(text):
        term = _TERM.match(text, at)
        if term is None:
            raise VertexError(
                400,
                f"The sandbox's Cloud Logging cannot read the filter at {text[at : at + 40]!r}: it supports "
                'comparisons such as resource.labels.job_id="123" or timestamp>="2026-01-02T03:04:05Z" '
                "joined by AND (no OR, NOT, parentheses or functions).",
            )
        value = term["value"]
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        if term["field"] in ("AND", "OR", "NOT") or value in ("AND", "OR", "NOT"):
            raise VertexError(400, f"The sandbox's Cloud Logging cannot read the filter {text!r}.")
        terms.append((term["field"], term["op"], value))
        at = term.end()
        joined = _AND.match(text, at)
        at = joined.end() if joined else at
    return terms


def _field(entry: dict[str, Any], path: str) -> Any:
    value: Any = entry
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _matches(entry: dict[str, Any], term: Term) -> bool:
    path, op, wanted = term
    have = _field(entry, path)
    if have is None:
        return op == "!="
    if op == ":":
        return wanted.lower() in str(have).lower()
    left: Any
    right: Any
    if path in ("timestamp", "receiveTimestamp"):
        left, right = parse_time(str(have)), parse_time(wanted)
    elif path == "severity" and wanted.upper() in SEVERITIES:
        left, right = SEVERITIES.index(str(have)), SEVERITIES.index(wanted.upper())
    else:
        left, right = str(have), wanted
    return {
        "=": left == right, "!=": left != right, ">": left > right,
        ">=": left >= right, "<": left < right, "<=": left <= right,
    }[op]  # fmt: skip
