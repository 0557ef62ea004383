"""`ComputeEmulator`: the one object tests, the sandbox and the CLI hold.

It binds a loopback HTTP server at construction (so `base_url` and `token_uri` are known before
anything else happens), serves it on a background thread after `start()`, and exposes the
knobs tests need: fault rules, request counters, seeding, and direct reads of the state.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from ..emulator_http import LISTEN_BACKLOG, EmulatorService
from . import catalog
from .api import ComputeApi, InstanceBackend
from .auth import write_private_file
from .faults import Faults
from .instances import build_instance, now
from .server import EmulatorHTTPServer, RequestLog
from .state import InstanceRecord, Store

DEFAULT_PROJECT = "forja-sandbox"


class ComputeEmulator(EmulatorService):
    """A local Compute Engine v1 API plus OAuth token endpoint on a real loopback HTTP port."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        backend: InstanceBackend | None = None,
        operation_delay_s: float = 0.0,
        projects: tuple[str, ...] | list[str] = (DEFAULT_PROJECT,),
        state_file: str | Path | None = None,
        wait_timeout_s: float = 120.0,
        listen_backlog: int = LISTEN_BACKLOG,
    ) -> None:
        self.faults = Faults()
        self.log = RequestLog()
        self._server = EmulatorHTTPServer((host, port), self, listen_backlog)
        bound_host, bound_port = self._server.server_address[:2]
        self.host = str(bound_host)
        self.port = int(bound_port)
        try:
            self.store = Store(tuple(projects), Path(state_file) if state_file else None, self.base_url)
        except Exception:
            self._server.server_close()  # an unreadable state file must not leak the bound port
            raise
        self.api = ComputeApi(
            self.store, self.faults, lambda: self.base_url, backend, operation_delay_s, wait_timeout_s
        )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> ComputeEmulator:
        if not self._server.serving:
            self.store.start_saver()
            super().start()
            self.api.sync_firewalls()  # a backend that enforces them gets the rules of a state file
        return self

    def stop(self) -> None:
        """Stop serving, release the port, and write the state file one last time."""
        super().stop()
        self.store.close()

    # -- addresses (`url` is EmulatorService's) --------------------------------------------
    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT/compute/v1/`; clients append `projects/...`."""
        return f"{self.url}/compute/v1/"

    @property
    def token_uri(self) -> str:
        return f"{self.url}/token"

    # -- knobs -----------------------------------------------------------------------------
    @property
    def backend(self) -> InstanceBackend | None:
        return self.api.backend

    @backend.setter
    def backend(self, backend: InstanceBackend | None) -> None:
        self.api.backend = backend
        if self._server.serving:
            self.api.sync_firewalls()

    @property
    def operation_delay_s(self) -> float:
        return self.api.operation_delay_s

    @operation_delay_s.setter
    def operation_delay_s(self, seconds: float) -> None:
        self.api.operation_delay_s = seconds

    @property
    def projects(self) -> tuple[str, ...]:
        return tuple(sorted(self.store.projects))

    def add_project(self, project: str) -> None:
        self.store.add_project(project)

    # -- auth ------------------------------------------------------------------------------
    def write_service_account_key(
        self, path: str | Path, client_email: str | None = None, project: str | None = None
    ) -> Path:
        """A real RSA service-account key file (0600) whose token_uri points at this emulator."""
        key = self.store.keyring.new_key(self.token_uri, project or self.projects[0], client_email)
        self.store.mark_dirty()
        return write_private_file(Path(path), key)

    def load_service_account_key(self, path: str | Path) -> None:
        """Trust an existing key file again (e.g. one written by an earlier emulator process)."""
        self.store.keyring.register(json.loads(Path(path).read_text(encoding="utf-8")))
        self.store.mark_dirty()

    def issue_token(self, client_email: str = "tester@forja-sandbox.iam.gserviceaccount.com") -> str:
        """An access token without the JWT dance (for access-token auth and quick tests)."""
        self.store.mark_dirty()
        return str(self.store.keyring.issue(client_email)["access_token"])

    # -- observation -----------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, Any]:
        """{"token_requests": n, "requests": n, "by_method": {"compute.instances.get": n, ...}}."""
        return self.log.snapshot()

    def stats_reset(self) -> None:
        self.log.reset()

    @property
    def requests(self) -> list[tuple[str, str, dict[str, list[str]], Any]]:
        """(method_id, path, query, body) of recent Compute requests, oldest first."""
        with self.log.lock:
            return list(self.log.recent)

    def instance(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        with self.store.lock:
            record = self.store.instance(project, zone, name)
            return copy.deepcopy(record.data) if record else None

    def instances(self, project: str | None = None) -> list[dict[str, Any]]:
        with self.store.lock:
            projects = [project] if project else sorted(self.store.projects)
            return [copy.deepcopy(r.data) for p in projects for r in self.store.sorted_instances(p)]

    def instances_with_status(self, status: str, project: str | None = None) -> list[dict[str, Any]]:
        return [i for i in self.instances(project) if i["status"] == status]

    # -- seeding and events ----------------------------------------------------------------
    def seed_instances(
        self,
        project: str,
        zone: str,
        count: int,
        name_prefix: str = "seed",
        labels: dict[str, str] | None = None,
        status: str = "RUNNING",
        machine_type: str = "e2-standard-4",
        start_index: int = 0,
    ) -> list[str]:
        """Create instances directly in a final state (no operations, no backend): fixtures."""
        if zone not in catalog.ZONES:
            raise ValueError(f"unknown zone {zone!r}; known: {', '.join(sorted(catalog.ZONES))}")
        self.add_project(project)
        template_body: dict[str, Any] = {
            "name": "template",
            "machineType": f"zones/{zone}/machineTypes/{machine_type}",
            "disks": [
                {
                    "boot": True,
                    "autoDelete": True,
                    "initializeParams": {
                        "sourceImage": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
                    },
                }
            ],
            "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}],
            "labels": dict(labels or {}),
        }
        if catalog.MACHINE_TYPES[machine_type].gpu:
            template_body["scheduling"] = {"onHostMaintenance": "TERMINATE"}
        template = json.dumps(build_instance(template_body, project, zone, self.base_url))
        names = []
        stamp = now()
        with self.store.lock:
            for index in range(start_index, start_index + count):
                name = f"{name_prefix}-{index}"
                instance = json.loads(template)  # much faster than deepcopy, for thousands
                instance["name"] = name
                instance = {"kind": instance.pop("kind"), "id": self.store.next_id(), **instance}
                instance["selfLink"] = instance["selfLink"].rsplit("/", 1)[0] + f"/{name}"
                instance["disks"][0]["source"] = instance["disks"][0]["source"].rsplit("/", 1)[0] + f"/{name}"
                instance["status"] = status
                instance["creationTimestamp"] = stamp
                nic = instance["networkInterfaces"][0]
                nic["networkIP"] = self.store.private_ip(zone)
                if status == "RUNNING":
                    instance["lastStartTimestamp"] = stamp
                    nic["accessConfigs"][0]["natIP"] = self.store.public_ip()
                elif status == "TERMINATED":
                    instance["lastStopTimestamp"] = stamp
                self.store.put_instance(InstanceRecord(project, zone, instance))
                names.append(name)
        return names

    def guest_powered_off(self, instance: dict[str, Any]) -> bool:
        """The guest shut itself down: the instance becomes TERMINATED, as on GCE.

        Skipped (returns False) while an operation is changing the instance anyway.
        """
        return self.api.guest_powered_off(instance)

    def preempt(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """Preempt a Spot instance as Google does (STOP -> TERMINATED, DELETE -> gone)."""
        return self.api.preempt(project, zone, name)
