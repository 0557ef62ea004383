"""HTTP front end: the aiplatform v1 REST paths of CustomJob, answered in Google's JSON.

The paths and verbs are those of google.cloud.aiplatform.v1.JobService's HTTP bindings (the same
URI templates google-cloud-aiplatform's REST transport fills in): create and list on
``v1/projects/*/locations/*/customJobs``, get on ``.../customJobs/*``, cancel as POST
``.../customJobs/*:cancel``. Other JobService paths answer 501, unknown paths 404. Beside them,
Cloud Logging v2's ``POST v2/entries:list`` (the replicas' output, cloud_logging.py).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, parse_qs, unquote

from google.cloud.aiplatform_v1.types import CustomJob
from google.cloud.logging_v2.types import ListLogEntriesRequest
from google.protobuf import json_format

from ..emulator_http import EmulatorServer, JsonHandler
from ..http_limits import BodyRefused, parse_json
from . import catalog, validation
from .errors import VertexError

if TYPE_CHECKING:
    from .emulator import VertexEmulator

_PARENT = r"/v1/(?P<parent>projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+))"
_COLLECTION = re.compile(_PARENT + r"/customJobs$")
_ONE = re.compile(_PARENT + r"/customJobs/(?P<id>[^/:]+)(?P<verb>:cancel)?$")
_JOB_SERVICE = re.compile(_PARENT + r"/[a-zA-Z]+Jobs(/|$)")
#: Google's system parameters, accepted on every call (https://cloud.google.com/apis/docs/system-parameters).
SYSTEM_PARAMETERS = frozenset({
    "$alt", "alt", "$fields", "fields", "key", "prettyPrint", "$prettyPrint", "quotaUser", "$quotaUser",
    "$callback", "callback", "uploadType", "upload_protocol", "access_token",
})  # fmt: skip
#: The request fields ListCustomJobsRequest binds from the query; the other methods bind none.
LIST_PARAMETERS = frozenset({"filter", "pageSize", "pageToken", "readMask"})
#: Cloud Logging v2's ListLogEntries (https://logging.googleapis.com/v2/entries:list).
LOG_ENTRIES_LIST = "/v2/entries:list"


class VertexHTTPServer(EmulatorServer):
    """The Vertex emulator's server: its handler and the emulator it serves."""

    thread_name = "vertex-emulator"
    poll_interval = 0.1

    def __init__(self, address: tuple[str, int], emulator: VertexEmulator) -> None:
        self.emulator = emulator
        super().__init__(address, _Handler)


class _Handler(JsonHandler):
    server: VertexHTTPServer
    verbs = frozenset({"GET", "POST", "PATCH", "DELETE"})
    json_indent = 1

    def refused(self, refused: BodyRefused) -> VertexError:
        return VertexError(refused.status, refused.message)

    def internal(self, exc: Exception) -> VertexError:
        return VertexError(500, "Internal error encountered.")

    def route(self, verb: str, url: SplitResult, body: bytes) -> tuple[int, Any]:
        path = unquote(url.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        ints = "enum-encoding=int" in query.get("$alt", "")
        store = self.server.emulator.store
        if path == LOG_ENTRIES_LIST:
            if verb != "POST":
                raise VertexError(405, f"{verb} {path}: entries:list is a POST.", status="INVALID_ARGUMENT")
            return 200, self.server.emulator.logs.list(log_request(body))
        collection = _COLLECTION.match(path)
        one = _ONE.match(path)
        match = collection or one
        if match is None:
            if _JOB_SERVICE.match(path):
                raise VertexError(501, f"{verb} {path} is not implemented by the sandbox's Vertex emulator.")
            raise VertexError(404, f"The requested URL {path} was not found on this server.")
        allowed = SYSTEM_PARAMETERS | (LIST_PARAMETERS if collection and verb == "GET" else frozenset())
        for name in sorted(set(query) - allowed):
            raise validation.bad_payload(
                f'Unknown name "{name}": Cannot bind query parameter. '
                f"Field '{name}' could not be found in request message.",
                name,
            )
        region = match["location"]
        if region not in catalog.regions():
            raise VertexError(
                400,
                f'Location "{region}" is not supported by the sandbox\'s Vertex emulator; '
                f"use one of {', '.join(sorted(catalog.regions()))}.",
            )
        if collection and verb == "POST":
            job = validation.parse_custom_job(body)
            validation.check_custom_job(job, region)
            validation.check_packages(job)
            return 200, _json(store.create(match["project"], region, job), ints)
        if collection and verb == "GET":
            return 200, self._list(match["parent"], query, ints)
        name = f"{match['parent']}/customJobs/{match['id']}"
        if one and one["verb"] and verb == "POST":
            store.cancel(name)
            return 200, {}
        if one and not one["verb"] and verb == "GET":
            return 200, _json(store.job(name).snapshot(), ints)
        raise VertexError(501, f"{verb} {path} is not implemented by the sandbox's Vertex emulator.")

    def _list(self, parent: str, query: dict[str, str], ints: bool) -> dict[str, Any]:
        if query.get("filter"):
            raise VertexError(400, "The sandbox's Vertex emulator supports no list filter; leave it empty.")
        jobs = self.server.emulator.store.list(parent)
        try:
            start = int(query.get("pageToken") or 0)
            size = int(query.get("pageSize") or 0) or len(jobs) or 1
        except ValueError as exc:
            raise VertexError(400, f"Invalid pageSize or pageToken: {exc}") from exc
        page = jobs[start : start + size]
        answer: dict[str, Any] = {"customJobs": [_json(j.snapshot(), ints) for j in page]} if page else {}
        if start + size < len(jobs):
            answer["nextPageToken"] = str(start + size)
        return answer


def log_request(body: bytes) -> dict[str, Any]:
    """An entries:list body, read as Google's front end reads it: into the API's own message
    (google.cloud.logging_v2's ListLogEntriesRequest), so a wrong type is the 400 Logging gives."""
    try:
        parse_json(body or b"{}")  # within the emulators' limits first (forja_sandbox/http_limits.py)
        message = ListLogEntriesRequest.from_json(body or b"{}", ignore_unknown_fields=False)
    except (ValueError, json_format.ParseError) as exc:
        raise VertexError(400, f"Invalid JSON payload received. {str(exc).splitlines()[0]}") from None
    return json.loads(ListLogEntriesRequest.to_json(message))


def _json(job: CustomJob, ints: bool) -> dict[str, Any]:
    return json.loads(CustomJob.to_json(job, use_integers_for_enums=ints, indent=0))
