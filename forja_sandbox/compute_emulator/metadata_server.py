"""The part of a VM's metadata server (metadata.google.internal) that forja uses: guest attributes.

On GCE every VM reaches its own metadata server at 169.254.169.254:80; the server knows the VM by
where the request comes from, and refuses requests without `Metadata-Flavor: Google` (so a page
in a browser on the VM cannot be tricked into calling it). Here one server answers every instance
of the emulator: it finds the calling instance by its source address (the RUNNING instance whose
first interface has that `networkIP`, which the sandbox's hosts do) and refuses anyone else.

    server = MetadataServer(emulator.api, host="10.213.0.1", port=8090).start()
    # on the VM: curl -X PUT -H 'Metadata-Flavor: Google' --data 'idle 30 min' \\
    #   http://10.213.0.1:8090/computeMetadata/v1/instance/guest-attributes/forja/autostop
"""

from __future__ import annotations

import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .guest_attributes import GuestAttributeError, GuestAttributeMethods
from .server import LISTEN_BACKLOG

PREFIX = "/computeMetadata/v1/instance/guest-attributes/"
#: GCE caps a guest attribute's value; 1 KiB is a safe lower bound for what forja writes.
MAX_VALUE_BYTES = 1024


class _MetadataHTTPServer(ThreadingHTTPServer):
    """Every VM's autostop polls here: the same deep accept queue as the API (not Python's 5)."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG


class MetadataServer:
    """A threaded HTTP server for the guest-attributes endpoints of every emulated instance."""

    def __init__(self, api: GuestAttributeMethods, host: str = "127.0.0.1", port: int = 0) -> None:
        self.api = api
        self._server = _MetadataHTTPServer((host, port), _Handler)
        self._server.metadata_api = api  # type: ignore[attr-defined]
        self.host, self.port = str(self._server.server_address[0]), int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """What a VM uses instead of http://metadata.google.internal/computeMetadata/v1."""
        return f"http://{self.host}:{self.port}/computeMetadata/v1"

    def start(self) -> MetadataServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="metadata-server",
                                            kwargs={"poll_interval": 0.5}, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> MetadataServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    server_version = "Metadata Server for VM"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _reply(self, status: int, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.headers.get("Metadata-Flavor") != "Google":
            self._reply(403, "Missing Metadata-Flavor:Google header.")
            return
        api: GuestAttributeMethods = self.server.metadata_api  # type: ignore[attr-defined]
        record = api.instance_at(self.client_address[0])
        if record is None:
            self._reply(403, f"{self.client_address[0]} is not a running instance of this cloud.")
            return
        path = self.path.split("?", 1)[0]
        parts = path[len(PREFIX):].split("/") if path.startswith(PREFIX) else []
        if len(parts) != 2 or not all(parts):
            self._reply(404, f"{path} is not emulated (only instance/guest-attributes/NAMESPACE/KEY).")
            return
        namespace, key = parts
        try:
            if method == "PUT":
                if len(body) > MAX_VALUE_BYTES:
                    self._reply(400, f"The value is {len(body)} bytes; at most {MAX_VALUE_BYTES}.")
                    return
                api.put_guest_attribute(record, namespace, key, body.decode("utf-8", errors="replace"))
                self._reply(200, "")
            elif method == "DELETE":
                api.delete_guest_attribute(record, namespace, key)
                self._reply(200, "")
            else:
                value = api.guest_attribute(record, namespace, key)
                self._reply(404 if value is None else 200, "" if value is None else value)
        except GuestAttributeError as exc:
            self._reply(exc.status, exc.message)
        except Exception as exc:  # the server must answer, not drop the connection
            with contextlib.suppress(OSError):
                self._reply(500, f"internal error: {exc}")
