"""`ComputeEmulator`: the one object tests, the sandbox and the CLI hold.

It binds a loopback HTTP server at construction (so `base_url` and `token_uri` are known before
anything else happens), serves it on a background thread after `start()`, and exposes the
knobs tests need: fault rules, request counters, seeding, and direct reads of the state.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..emulator_http import LISTEN_BACKLOG, EmulatorService
from . import catalog
from .advice import AdviceSettings
from .api import ComputeApi, InstanceBackend
from .auth import write_private_file
from .catalog import project_number
from .faults import Faults
from .instances import build_instance, now
from .project_settings import ProjectSettings
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
        self.advice = AdviceSettings()
        self.api.advice = self.advice

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

    def configure_project(
        self,
        project: str,
        *,
        exists: bool | None = None,
        billing_enabled: bool | None = None,
        billing_account: str | None = None,
        disabled_services: Iterable[str] | None = None,
        quotas: Mapping[Any, float | None] | None = None,
        denied_permissions: Iterable[str] | None = None,
        viewers: Iterable[str] | str | None = None,
        flex_start_wait_s: float | None = None,
    ) -> None:
        """Make a preflight question answer differently; a keyword left None keeps its setting.

        - `exists`: False stops serving the project (Compute 404, Resource Manager 403), True
          serves it (also the effect of configuring a project the emulator did not serve);
        - `billing_enabled` / `billing_account` (`billingAccounts/XXXXXX-XXXXXX-XXXXXX`; disabling
          billing without naming an account unlinks it: `billingAccountName` "");
        - `disabled_services`: the APIs (`compute.googleapis.com`, ...) that answer SERVICE_DISABLED
          (replaces the set);
        - `quotas`: limits by `(scope, metric)` or `"scope/METRIC"`, scope a region, `"*"` (every
          region) or `"global"`: `{("us-east1", "NVIDIA_L4_GPUS"): 0, ("global", "GPUS_ALL_REGIONS"):
          0}`; merged into the project's overrides, a limit of None drops one;
        - `denied_permissions`: the permissions no caller holds on the project (replaces the set);
        - `viewers`: the client emails that may see the project at all, or `"*"` (every key);
        - `flex_start_wait_s`: how long a Flex-start insert waits PENDING for capacity (0: none);
          longer than the request's `params.requestValidForDuration`, the request fails.

        Raises ValueError/TypeError (and changes nothing) for a value Google could not hold.
        """
        if exists is not None and not isinstance(exists, bool):
            raise TypeError(f"exists: true or false, not {exists!r}")
        with self.store.lock:
            if exists is None:  # keep; a project the emulator has never heard of becomes served
                exists = project in self.store.projects or project not in self.store.settings
            # Changed on a copy, so that a bad value changes nothing.
            settings = ProjectSettings.from_json(self.store.settings_for(project).to_json())
            settings.update(
                billing_enabled=billing_enabled, billing_account=billing_account,
                disabled_services=disabled_services, quotas=quotas,
                denied_permissions=denied_permissions, viewers=viewers,
                flex_start_wait_s=flex_start_wait_s,
            )  # fmt: skip
            self.store.set_exists(project, exists)
            settings.exists = exists
            self.store.settings[project] = settings
            self.store.mark_dirty()

    def new_project(self, project: str) -> None:
        """Serve `project` as a brand-new Google Cloud project looks: GPU quota 0 (GPUS_ALL_REGIONS
        and NVIDIA_L4_GPUS / PREEMPTIBLE_NVIDIA_L4_GPUS in every region), compute, iap and aiplatform
        APIs disabled, and no caller holding `iap.tunnelInstances.accessViaIAP`. Billing is linked.
        Resets the settings of a project that exists; its resources stay."""
        with self.store.lock:
            self.store.set_exists(project, True)
            settings = ProjectSettings()
            settings.make_brand_new()
            self.store.settings[project] = settings
            self.store.mark_dirty()

    def set_advice(
        self,
        project: str,
        zone: str | None = None,
        machine_type: str | None = None,
        provisioning_model: str = "SPOT",
        **scores: Any,
    ) -> dict[str, Any]:
        """What the capacity advisor answers (`advice.capacity`, `capacityHistory`, `calendarMode`)
        for one zone's machine type and provisioning model: `obtainability` (0-1),
        `estimated_uptime` ("60s", "600s", "3600s"), `preemption_rate` and `price` (USD an hour:
        one number, or 30, one a day, oldest first); `available=False` makes the project's advice
        calls answer 400 "The service is not available for this project.". Returns the project's
        advice settings. `emu.advice.clear()` forgets them all."""
        return self.advice.set(project, zone, machine_type, provisioning_model, **scores)

    def project_settings(self, project: str) -> dict[str, Any]:
        """The project's settings as `configure_project` takes them (quota keys as "scope/METRIC"),
        plus `number`, its project number."""
        with self.store.lock:
            settings = self.store.settings_for(project).to_json()
        return {"project": project, "number": project_number(project), **settings}

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
        """(method_id, path, query, body) of recent API requests, oldest first: for Compute the
        discovery method id and the path after /compute/v1/, for the other Google APIs
        `"<prefix> <HTTP method>"` (`"serviceusage/v1 GET"`) and the path after that prefix."""
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
