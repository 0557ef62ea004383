"""Shared fixtures of the GCP tests: nothing may leave this machine, and the client code is importable.

The socket guard fails any test whose code (ours, google-auth's, requests') tries to resolve or
connect to anything but loopback: that is how we know google-auth's background Regional Access
Boundary lookup (iamcredentials.googleapis.com) is not started by our client. Subprocesses
(ansible-playbook, ansible-inventory) get proxy variables that point every non-loopback HTTP(S)
request at a closed loopback port, so a stray request fails fast instead of reaching out.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}


def _is_loopback(host: object) -> bool:
    if host is None or host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(str(host)).is_loopback
    except ValueError:
        return False


class OutboundAttempt(AssertionError):
    """A test tried to reach a host that is not this machine."""


@pytest.fixture(autouse=True)
def no_outbound_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Refuse (and record) DNS lookups and connections to anything but loopback."""
    attempts: list[str] = []
    real_connect = socket.socket.connect
    real_getaddrinfo = socket.getaddrinfo

    def guarded_connect(self: socket.socket, address: object) -> object:
        host = address[0] if isinstance(address, tuple) else None
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(host):
            attempts.append(f"connect {address}")
            raise OutboundAttempt(f"test tried to connect to {address}")
        return real_connect(self, address)

    def guarded_getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
        if not _is_loopback(host):
            attempts.append(f"resolve {host}")
            raise OutboundAttempt(f"test tried to resolve {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    yield attempts
    assert not attempts, f"outbound network attempts: {attempts}"


@pytest.fixture
def emulator():
    """A fresh Compute emulator on a loopback port (real HTTP, real OAuth token endpoint)."""
    from forja_sandbox.compute_emulator import ComputeEmulator

    with ComputeEmulator() as emu:
        yield emu


@pytest.fixture
def key_file(emulator, tmp_path: Path) -> Path:
    """A real service-account key whose token_uri is the emulator's."""
    return emulator.write_service_account_key(tmp_path / "sa-key.json")


#: google-auth's Regional Access Boundary lookup, which Google's clients start on their own thread.
BACKGROUND_LOOKUP = "iamcredentials.googleapis.com"


@pytest.fixture
def only_googles_background_lookup_left_the_machine(no_outbound_network: list[str]):
    """Anything but google-auth's own lookup (e.g. a call to compute.googleapis.com) fails the test.

    The lookup threads are joined first, while the guard still stands: one that ran late would
    otherwise reach the network, or land in the next test's guard.
    """
    yield
    for thread in threading.enumerate():
        if type(thread).__name__ == "_RegionalAccessBoundaryRefreshThread":
            thread.join(timeout=10)
    stray = [a for a in no_outbound_network if BACKGROUND_LOOKUP not in a]
    no_outbound_network.clear()
    assert stray == [], f"a Google client went past the emulator: {stray}"
