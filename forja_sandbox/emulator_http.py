"""The emulators' HTTP front ends, on one server and one request handler.

The Compute and Vertex emulators answer Google's JSON, the guests' metadata server plain text; all
three serve HTTP/1.1 keep-alive connections, a thread per connection. What they share is here:

- `EmulatorServer`: a deep accept queue, no reverse DNS lookup on bind, served on a thread of its
  own (forja_sandbox/serving.py); `EmulatorService`, the object in front of one, that callers start,
  stop and take the URL of.
- `VerbHandler`: the verbs a front end serves go to its `answer`; any other verb gets http.server's
  own 501, as a handler without that verb's method does. No request line is logged (request lines
  may carry metadata values; each emulator keeps its own request log).
- `JsonHandler`, for the JSON APIs: the body read within forja_sandbox/http_limits.py's limits, the
  route's answer or its `HttpError` in the API's shape, a 500 in that shape for an emulator bug (the
  traceback on stderr), and no answer to a client that has already gone.
"""

from __future__ import annotations

import json
import socketserver
import sys
import traceback
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar
from urllib.parse import SplitResult, urlsplit

from .http_limits import BodyRefused, BoundedRequests
from .serving import ServedOnThread, Service

# The listen backlog: connections the kernel queues before the accept loop takes them. Python's
# default (5) made clients that open a connection per call (google.cloud's gcp_compute does) wait
# for a SYN retry (1 s, then 3 s) as soon as 8 came at once; bench/emulator_bench.py measures it.
LISTEN_BACKLOG = 1024
JSON_TYPE = "application/json; charset=UTF-8"
E = TypeVar("E", bound="EmulatorService")


class EmulatorServer(ServedOnThread, ThreadingHTTPServer):
    """One thread per connection (HTTP/1.1 keep-alive), a deep accept queue, no DNS on bind."""

    request_queue_size = LISTEN_BACKLOG

    def server_bind(self) -> None:
        """Bind without HTTPServer's reverse DNS lookup of the address (no resolver needed)."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


class EmulatorService(Service):
    """What callers hold of an emulator served by an `EmulatorServer`: its address; start() serves it,
    stop() stops serving and frees the port."""

    _server: EmulatorServer
    host: str
    port: int

    @property
    def url(self) -> str:
        """Scheme, host and port, no path: what a client takes as the API's endpoint."""
        return f"http://{self.host}:{self.port}"

    def start(self: E) -> E:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()


class VerbHandler(BaseHTTPRequestHandler):
    """Hands each request of a verb in `verbs` to `answer`; http.server's 501 for any other verb."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the body waited for the client's
    # delayed ACK, so every call on a keep-alive connection took 40+ ms (bench/emulator_bench.py).
    disable_nagle_algorithm = True
    #: The verbs this front end serves.
    verbs: ClassVar[frozenset[str]] = frozenset()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: request lines and bodies may carry secrets; each emulator keeps its own log."""

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, verb: str) -> None:
        if verb in self.verbs:
            self.answer(verb)
        else:  # word for word what http.server answers a verb its handler has no method for
            self.send_error(HTTPStatus.NOT_IMPLEMENTED, f"Unsupported method ({verb!r})")

    def answer(self, verb: str) -> None:
        """Answer the request (its verb is one of `verbs`)."""
        raise NotImplementedError

    def send_body(
        self, status: int, data: bytes, content_type: str, headers: Mapping[str, str] = MappingProxyType({})
    ) -> None:
        """One whole answer: status, its content type and length, `headers`, then `data`."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class HttpError(Exception):
    """An API's error answer: its HTTP status, the API's JSON body for it, headers that go with it."""

    code: int
    headers: Mapping[str, str] = MappingProxyType({})

    def body(self) -> dict[str, Any]:
        raise NotImplementedError


class JsonHandler(BoundedRequests, VerbHandler):
    """A JSON API's front end: a subclass routes (`route`) and words its errors (`refused`, `internal`)."""

    verbs = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
    #: json.dumps's indent for answers (None: compact).
    json_indent: int | None = None

    def answer(self, verb: str) -> None:
        url = urlsplit(self.path)
        headers: Mapping[str, str] = {}
        try:
            try:
                body = self.read_body()
            except BodyRefused as refused:
                raise self.refused(refused) from None
            status, payload = self.route(verb, url, body)
        except HttpError as exc:
            status, payload, headers = exc.code, exc.body(), exc.headers
        except Exception as exc:  # an emulator bug must still answer, in the API's shape, and keep serving
            traceback.print_exc(file=sys.stderr)
            status, payload = 500, self.internal(exc).body()
        if not isinstance(payload, bytes):
            payload = json.dumps(payload, indent=self.json_indent).encode()
        try:
            self.send_body(status, payload, JSON_TYPE, headers)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up first (e.g. its timeout on operations.wait): nobody to answer.
            self.close_connection = True

    def route(self, verb: str, url: SplitResult, body: bytes) -> tuple[int, Any]:
        """(status, payload: JSON, or bytes already encoded) of a request; raises `HttpError`."""
        raise NotImplementedError

    def refused(self, refused: BodyRefused) -> HttpError:
        """The API's error for a body outside the limits (its status and words are `refused`'s)."""
        raise NotImplementedError

    def internal(self, exc: Exception) -> HttpError:
        """The API's 500 for an emulator bug."""
        raise NotImplementedError
