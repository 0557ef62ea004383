"""Where the sandbox service listens: its Compute API's port, and its other services' beside it.

The port is `FORJA_SANDBOX_PORT` (8089 by default: inventory/sandbox states the endpoint as plain
variables); each other service takes the port at a fixed distance from it. Below the service
(forja_sandbox/service.py), which starts them all, so that a client of one (the IAP stand-in's) finds
its port without importing the service that runs it.
"""

from __future__ import annotations

import os

DEFAULT_PORT = 8089


def port() -> int:
    return int(os.environ.get("FORJA_SANDBOX_PORT", DEFAULT_PORT))


def metadata_port(p: int | None = None) -> int:
    """The guests' metadata server listens next to the API (GCE's is 169.254.169.254:80)."""
    return (p or port()) + 1


def iap_port(p: int | None = None) -> int:
    """The IAP stand-in (forja_sandbox/iap.py) listens on 127.0.0.1 here; its client finds it here."""
    return (p or port()) + 2


def address_port(p: int | None = None) -> int:
    """The "what is my address" echo (a stand-in for api.ipify.org) on 127.0.0.1."""
    return (p or port()) + 3


def storage_port(p: int | None = None) -> int:
    """The Cloud Storage emulator (forja_sandbox/storage_emulator.py)."""
    return (p or port()) + 4
