"""The sandbox's IAP stand-in and its gcloud-shaped client, as ssh runs it (a ProxyCommand on stdio).

No test host here: the "instance" is a TCP echo on loopback and the stand-in connects from
127.0.0.1 (in the sandbox it connects from 35.235.240.1; tests/sandbox/test_site_e2e.py goes through
the hosts' firewall that way).
"""

from __future__ import annotations

import os
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from forja_sandbox import iap

INSTANCES = {
    ("p", "us-east1-d", "vm"): {"status": "RUNNING", "networkInterfaces": [{"networkIP": "127.0.0.1"}]},
    ("p", "us-east1-d", "off"): {"status": "TERMINATED", "networkInterfaces": [{"networkIP": "127.0.0.1"}]},
}


class _Echo(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        self.server.peers.append(self.client_address[0])  # type: ignore[attr-defined]
        while data := self.request.recv(4096):
            self.request.sendall(data.upper())


@pytest.fixture
def echo() -> Iterator[socketserver.ThreadingTCPServer]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    server.peers = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def stand_in() -> Iterator[iap.IapStandIn]:
    server = iap.IapStandIn(lambda p, z, n: INSTANCES.get((p, z, n)), source="127.0.0.1").start()
    yield server
    server.stop()


def client(stand_in: iap.IapStandIn, instance: str, port: int, data: bytes) -> subprocess.CompletedProcess:
    """The ProxyCommand as ssh runs it: stdin in, stdout out, messages on stderr."""
    env = dict(os.environ, FORJA_SANDBOX_PORT=str(stand_in.port - 2))  # service.iap_port() = port + 2
    argv = [sys.executable, "-m", "forja_sandbox.iap", "start-iap-tunnel", instance, str(port),
            "--listen-on-stdin", "--project=p", "--zone=us-east1-d", "--verbosity=warning"]
    return subprocess.run(argv, input=data, capture_output=True, env=env, timeout=30, check=False)


def test_bytes_pass_both_ways_from_the_iap_source(stand_in, echo) -> None:
    done = client(stand_in, "vm", echo.server_address[1], b"ssh-2.0 hello\n" * 1000)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"SSH-2.0 HELLO\n" * 1000
    assert echo.peers == ["127.0.0.1"], "the stand-in connects from its source address"


def test_an_unknown_or_stopped_instance_is_refused_as_iap_does(stand_in, echo) -> None:
    missing = client(stand_in, "nope", echo.server_address[1], b"")
    assert missing.returncode == 1 and b"instance 'nope' not found in project 'p'" in missing.stderr
    stopped = client(stand_in, "off", echo.server_address[1], b"")
    assert stopped.returncode == 1 and b"TERMINATED, not RUNNING" in stopped.stderr
    assert echo.peers == []


def test_a_closed_port_names_the_firewall_rule_iap_needs(stand_in) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    refused = client(stand_in, "vm", closed, b"")
    assert refused.returncode == 1, refused
    assert b"firewall rule admitting tcp:" in refused.stderr and b"35.235.240.0/20" in refused.stderr


def test_the_proxy_command_is_gclouds_shape() -> None:
    command = iap.proxy_command("forja-l4", "us-east1-b", "forja-sandbox")
    assert command.split()[1:] == ["-m", "forja_sandbox.iap", "start-iap-tunnel", "forja-l4", "%p",
                                   "--listen-on-stdin", "--project=forja-sandbox", "--zone=us-east1-b",
                                   "--verbosity=warning"]
