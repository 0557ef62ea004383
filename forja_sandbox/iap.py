"""A stand-in for Identity-Aware Proxy's TCP forwarding, and the client that Ansible's ssh runs.

On Google Cloud, `gcloud compute start-iap-tunnel VM 22 --listen-on-stdin --project P --zone Z`
(ssh's ProxyCommand) opens a WebSocket to tunnel.cloudproxy.app; Google looks the instance up,
checks the caller's permission, and connects to the VM's internal address from its range
35.235.240.0/20. The VM therefore needs a firewall rule admitting tcp:22 from that range, and
nothing else: a rule for the caller's own address does not help, nor is one needed.

The sandbox keeps exactly those consequences and nothing of the protocol:
- `IapStandIn` (run by the sandbox service on 127.0.0.1, `ports.iap_port()`) reads one JSON line
  naming project, zone, instance and port, finds the instance in the emulator (it must exist and be
  RUNNING, as IAP requires), connects to its internal address *from 35.235.240.1*, an address of
  IAP's range that `th-up.sh` puts on the hosts' bridge, answers `OK`, then relays bytes. The
  sandbox's firewall (nftables in each host's namespace, from the API's rules) decides, as GCE's
  does, whether that connection is admitted.
- `main` is the client, with gcloud's arguments, so the ProxyCommand differs from the real one only
  in its program: `python -m forja_sandbox.iap start-iap-tunnel VM %p --listen-on-stdin ...`.
No authentication or authorisation (roles/iap.tunnelResourceAccessor) is modelled, and only
`--listen-on-stdin` is: see forja_sandbox/README.md.
"""

from __future__ import annotations

import argparse
import json
import socket
import socketserver
import sys
import threading
from collections.abc import Callable
from typing import Any

from forja_sandbox.ports import iap_port
from forja_sandbox.serving import ServedOnThread, pump, relay

#: The address of Google's IAP range (35.235.240.0/20) that the stand-in connects from.
IAP_SOURCE = "35.235.240.1"
#: Google's documented IAP TCP forwarding range: what a firewall rule must admit.
IAP_RANGE = "35.235.240.0/20"
CONNECT_TIMEOUT_S = 10.0


def _no_delay(sock: socket.socket) -> socket.socket:
    """ssh's many small packets must not wait for Nagle's algorithm at either hop (40 ms each)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock

#: (project, zone, instance) -> the instance dict, or None when there is no such instance.
InstanceLookup = Callable[[str, str, str], "dict[str, Any] | None"]


def internal_address(lookup: InstanceLookup, project: str, zone: str, name: str) -> str:
    """The instance's internal address, or ValueError with IAP's reason for refusing."""
    instance = lookup(project, zone, name)
    if instance is None:
        raise ValueError(f"instance '{name}' not found in project '{project}', zone '{zone}'")
    if instance.get("status") != "RUNNING":
        raise ValueError(f"instance '{name}' is {instance.get('status')}, not RUNNING")
    for nic in instance.get("networkInterfaces") or []:
        if nic.get("networkIP"):
            return str(nic["networkIP"])
    raise ValueError(f"instance '{name}' has no internal address")


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: IapStandIn = self.server  # type: ignore[assignment]
        client: socket.socket = self.request
        header = b""
        while not header.endswith(b"\n") and len(header) < 4096:
            byte = client.recv(1)
            if not byte:
                return
            header += byte
        try:
            ask = json.loads(header)
            address = internal_address(server.lookup, ask["project"], ask["zone"], ask["instance"])
            upstream = socket.create_connection((address, int(ask["port"])), timeout=CONNECT_TIMEOUT_S,
                                                source_address=(server.source, 0))
        except (ValueError, KeyError, TypeError) as exc:
            client.sendall(f"ERROR {exc}\n".encode())
            return
        except OSError as exc:
            client.sendall(
                f"ERROR failed to connect to backend: {address}:{ask['port']} from {server.source} "
                f"({exc.strerror or exc}); is a firewall rule admitting tcp:{ask['port']} from "
                f"{IAP_RANGE} (IAP's range)?\n".encode())
            return
        upstream.settimeout(None)
        _no_delay(upstream)
        _no_delay(client)
        client.sendall(b"OK\n")
        relay(client, upstream)
        upstream.close()


class IapStandIn(ServedOnThread, socketserver.ThreadingTCPServer):
    """The sandbox's IAP endpoint: one relay per connection, from `source` to the instance."""

    daemon_threads = True
    allow_reuse_address = True
    thread_name = "iap-stand-in"

    def __init__(self, lookup: InstanceLookup, host: str = "127.0.0.1", port: int = 0,
                 source: str = IAP_SOURCE) -> None:
        self.lookup, self.source = lookup, source
        super().__init__((host, port), _Handler)
        self.port = int(self.server_address[1])


def proxy_command(instance: str, zone: str, project: str) -> str:
    """ssh's ProxyCommand through this stand-in, as the sandbox's inventory gives it to Ansible."""
    return (f"{sys.executable} -m forja_sandbox.iap start-iap-tunnel {instance} %p --listen-on-stdin "
            f"--project={project} --zone={zone} --verbosity=warning")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """gcloud compute start-iap-tunnel's arguments, as much as an ssh ProxyCommand uses."""
    parser = argparse.ArgumentParser(prog="python -m forja_sandbox.iap")
    sub = parser.add_subparsers(dest="command", required=True)
    tunnel = sub.add_parser("start-iap-tunnel", help="relay stdin/stdout to a port of an instance")
    tunnel.add_argument("instance")
    tunnel.add_argument("port", type=int)
    tunnel.add_argument("--listen-on-stdin", action="store_true", required=True)
    tunnel.add_argument("--project", required=True)
    tunnel.add_argument("--zone", required=True)
    tunnel.add_argument("--verbosity", default="warning")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Relay stdin/stdout through the sandbox's IAP stand-in (ssh -o ProxyCommand=...)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    prefix = "ERROR: (forja_sandbox.iap start-iap-tunnel)"
    try:
        sock = socket.create_connection(("127.0.0.1", iap_port()), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        print(f"{prefix} the sandbox's IAP stand-in does not answer ({exc}); run `make sandbox`",
              file=sys.stderr)
        return 1
    ask = {"project": args.project, "zone": args.zone, "instance": args.instance, "port": args.port}
    sock.sendall(json.dumps(ask).encode() + b"\n")
    reply = b""
    while not reply.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte:
            break
        reply += byte
    if reply != b"OK\n":
        message = reply.decode(errors="replace").strip().removeprefix("ERROR ") or "connection closed"
        print(f"{prefix} {message}", file=sys.stderr)
        return 1
    sock.settimeout(None)
    _no_delay(sock)
    back = threading.Thread(target=pump, args=(sock, sys.stdout.fileno()), daemon=True)
    back.start()
    pump(sys.stdin.fileno(), sock)
    back.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
