"""A stand-in for a "what is my public address" service (api.ipify.org), for direct SSH.

In direct mode the gcp_instance role opens port 22 to the controller's own address, which it
detects by asking such a service (gcp_instance_ssh_address_url), which answers with the address the
internet sees the caller at (after NAT), as plain text. The sandbox's VMs see this machine at the
hosts' bridge address (10.213.0.1), so that is what this echo answers a caller on this machine; any
other caller gets its own address.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from forja_sandbox.serving import ServedOnThread


class _Handler(BaseHTTPRequestHandler):
    server_version = "forja-sandbox-address-echo"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        caller = self.client_address[0]
        seen_as: str = self.server.seen_as  # type: ignore[attr-defined]
        body = (seen_as if caller.startswith("127.") else caller).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class AddressEcho(ServedOnThread, ThreadingHTTPServer):
    """Answers every GET with the caller's address (`seen_as` for a caller on this machine)."""

    thread_name = "address-echo"

    def __init__(self, seen_as: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.seen_as = seen_as
        super().__init__((host, port), _Handler)
        self.port = int(self.server_address[1])
