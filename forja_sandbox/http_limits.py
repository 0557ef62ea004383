"""What the emulators accept on the wire: bounded bodies, bounded JSON, bounded waits.

Why one module: the Compute and Vertex emulators and the storage shim are also a sandbox that users
reach, and a fuzz of 200 malformed requests found the same gaps in all three: a ``Content-Length`` of
``abc`` or 10^12 (a MemoryError) dropped the connection, a length longer than the body hung the
handler for ever, and deeply nested JSON raised RecursionError (a 500, or a dropped connection).
Each limit below, and why it is where it is:

- ``MAX_BODY`` 1 MiB: no Compute, Vertex or Cloud Storage metadata request forja or Google's clients
  send comes near it (an instance's metadata may hold 512 KB in all on Compute Engine; an object's
  custom metadata 8 KiB). Google's front end takes more (its own limit is in the megabytes); a larger
  body here is a 413 in Google's words.
- ``MAX_UPLOAD`` 5 TiB: the body of a Cloud Storage upload (media, multipart, a resumable chunk) is an
  object's bytes, gigabytes for a data set, so it gets GCS's own limit on an object's size instead.
  A body is read in pieces, never allocated at its claimed length, so a false length costs nothing.
- ``MAX_STRING`` 256 KiB per JSON string: Compute Engine's limit for one metadata value, the
  largest single field any of the three APIs takes.
- ``MAX_DEPTH`` 32 levels of JSON: the deepest request body any of their schemas allows is under 10.
- ``READ_TIMEOUT_S`` 3 s: once a request has begun (its first byte came), its line, headers and
  body must arrive within that (per read: a slow but steady upload is fine); a client that stops
  half-way gets its connection closed (408 for a body). Waiting for the next request on a keep-alive
  connection is not bounded, as before, unless a server sets ``idle_timeout_s`` (the storage
  emulator serves one connection at a time, so a silent one would hold every other client). An
  answer goes out in pieces of ``IO_PIECE``, each within that time too: Python's ``sendall`` takes a
  socket's timeout as the time for all of it, which would cut a multi-GB download off after 3 s.
"""

from __future__ import annotations

import io
import json
import socket
from http.server import BaseHTTPRequestHandler
from typing import Any

MAX_BODY = 1 << 20
MAX_UPLOAD = 5 << 40
MAX_STRING = 256 << 10
MAX_DEPTH = 32
READ_TIMEOUT_S = 3.0
#: One read of a body (what a claimed length can make the emulator allocate before any byte came) or
#: one write of an answer (what must go out within READ_TIMEOUT_S).
IO_PIECE = 1 << 20


class BodyRefused(Exception):
    """A request whose framing or JSON the emulator refuses: an HTTP status and Google's words."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"{status}: {message}")


class _PieceWriter(io.BufferedIOBase):
    """A socket's writer that sends in pieces of IO_PIECE, so its timeout bounds each piece, not all."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), IO_PIECE):
            self._sock.sendall(view[start : start + IO_PIECE])
        return len(view)

    def fileno(self) -> int:
        return self._sock.fileno()


class BoundedRequests(BaseHTTPRequestHandler):
    """A request handler whose requests, once begun, must arrive within READ_TIMEOUT_S."""

    #: How long a connection may stay silent before its request begins; None: as long as the client likes.
    idle_timeout_s: float | None = None

    def setup(self) -> None:
        super().setup()
        self.wfile = _PieceWriter(self.connection)

    def handle_one_request(self) -> None:
        self.connection.settimeout(self.idle_timeout_s)  # idle between keep-alive requests
        try:
            if not self.rfile.peek(1):
                self.close_connection = True
                return
        except (ConnectionError, OSError):
            self.close_connection = True
            return
        self.connection.settimeout(READ_TIMEOUT_S)  # a request has begun: the rest comes now
        super().handle_one_request()  # its own TimeoutError handling closes the connection

    def read_body(self, limit: int = MAX_BODY) -> bytes:
        """The body, checked against its Content-Length and ``limit``; :class:`BodyRefused` (and the
        connection marked to close, since what is left on it cannot be trusted) when the framing is
        wrong."""
        try:
            return self._read_body(limit)
        except BodyRefused:
            self.close_connection = True
            raise

    def _read_body(self, limit: int) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise BodyRefused(411, "Transfer-Encoding is not supported here: send a Content-Length.")
        values = set(self.headers.get_all("Content-Length") or [])
        if len(values) > 1:
            raise BodyRefused(400, "Conflicting Content-Length headers.")
        text = values.pop().strip() if values else "0"
        if not text.isdigit():
            raise BodyRefused(400, f"Invalid Content-Length: {text[:40]!r}.")
        length = int(text)
        if length > limit:
            raise BodyRefused(413, f"Request payload size exceeds the limit: {limit} bytes.")
        pieces: list[bytes] = []
        left = length
        try:
            while left and (piece := self.rfile.read(min(left, IO_PIECE))):
                pieces.append(piece)
                left -= len(piece)
        except TimeoutError:
            raise BodyRefused(408, f"The body did not arrive within {READ_TIMEOUT_S:g} s.") from None
        data = b"".join(pieces)
        if len(data) < length:
            raise BodyRefused(400, f"The body ended after {len(data)} of its {length} bytes.")
        return data


class BeyondLimits(ValueError):
    """JSON that decodes, but deeper or with longer strings than the limits above."""


def parse_json(raw: bytes) -> Any:
    """Decode a JSON body: ValueError when it is not JSON, :class:`BeyondLimits` past the limits."""
    try:
        value = json.loads(raw)
    except RecursionError:  # the C decoder's own guard, far past MAX_DEPTH
        raise BeyondLimits(f"nested more than {MAX_DEPTH} levels deep") from None
    check_shape(value)
    return value


def check_shape(value: Any) -> None:
    """Depth and string length of decoded JSON (:class:`BeyondLimits` past the limits), walked without
    recursion (a deep value must not blow the stack here)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BeyondLimits(f"nested more than {MAX_DEPTH} levels deep (at {path})")
        if isinstance(item, str) and len(item) > MAX_STRING:
            where = path or "the body"
            raise BeyondLimits(f"{where} is {len(item):,} characters long; the limit is {MAX_STRING:,}")
        if isinstance(item, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k), depth + 1) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))
