"""Helpers the emulator tests share (a unique module name, so tests import them directly)."""

from __future__ import annotations

import time
from typing import Any

import requests

from forja_sandbox.compute_emulator import ComputeEmulator

PROJECT = "forja-sandbox"
ZONE = "us-east1-d"
DLVM_FAMILY = (
    "projects/deeplearning-platform-release/global/images/family/pytorch-2-7-cu128-ubuntu-2204-nvidia-570"
)


class Client:
    """Plain `requests` against the emulator, with a bearer token: what any real client does."""

    def __init__(self, emu: ComputeEmulator, token: str | None) -> None:
        self.emu = emu
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def url(self, path: str) -> str:
        return path if path.startswith("http") else f"{self.emu.base_url}projects/{PROJECT}/{path}"

    def get(self, path: str, **params: Any) -> requests.Response:
        return self.session.get(self.url(path), params=params, timeout=30)

    def post(self, path: str, body: Any = None, **params: Any) -> requests.Response:
        return self.session.post(self.url(path), json=body, params=params, timeout=30)

    def patch(self, path: str, body: Any) -> requests.Response:
        return self.session.patch(self.url(path), json=body, timeout=30)

    def delete(self, path: str) -> requests.Response:
        return self.session.delete(self.url(path), timeout=30)

    def ok(self, response: requests.Response) -> dict[str, Any]:
        assert response.status_code == 200, response.text
        return response.json()

    def wait(self, op: dict[str, Any]) -> dict[str, Any]:
        """Wait on an operation through its own selfLink + /wait, until DONE."""
        for _ in range(50):
            op = self.ok(self.session.post(op["selfLink"] + "/wait", timeout=30))
            if op["status"] == "DONE":
                return op
        raise AssertionError(f"operation never finished: {op}")

    def insert(self, body: dict[str, Any], zone: str = ZONE) -> dict[str, Any]:
        op = self.ok(self.post(f"zones/{zone}/instances", body))
        return self.wait(op)


def l4_body(name: str = "l4-vm-1", zone: str = ZONE, **overrides: Any) -> dict[str, Any]:
    """The insert body forja sends for its g2-standard-8 (one L4) training VM."""
    body: dict[str, Any] = {
        "name": name,
        "machineType": f"zones/{zone}/machineTypes/g2-standard-8",
        "scheduling": {
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": True,
            "provisioningModel": "STANDARD",
        },
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "type": "PERSISTENT",
                "interface": "NVME",
                "initializeParams": {
                    "sourceImage": DLVM_FAMILY,
                    "diskSizeGb": "300",
                    "diskType": f"zones/{zone}/diskTypes/pd-balanced",
                },
            }
        ],
        "networkInterfaces": [
            {
                "network": "global/networks/default",
                "accessConfigs": [
                    {"name": "External NAT", "type": "ONE_TO_ONE_NAT", "networkTier": "PREMIUM"}
                ],
            }
        ],
        "metadata": {"items": [{"key": "install-nvidia-driver", "value": "True"}]},
        "labels": {"managed-by": "forja"},
    }
    body.update(overrides)
    return body


def small_body(
    name: str, zone: str = ZONE, machine: str = "e2-standard-4", **overrides: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "machineType": f"zones/{zone}/machineTypes/{machine}",
        "disks": [
            {
                "boot": True,
                "initializeParams": {
                    "sourceImage": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
                },
            }
        ],
        "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}],
    }
    body.update(overrides)
    return body


def eventually(predicate: Any, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


