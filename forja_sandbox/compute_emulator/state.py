"""The emulated cloud's state: instances, firewalls, operations, keys; one lock, saved as JSON.

One re-entrant lock guards everything (requests are short; backends run outside it), and a
condition on that lock wakes `operations.wait` callers the moment an operation changes. Each
instance keeps its JSON encoding cached until it changes, which is what makes listing
thousands of instances cheap. With a state file, a background saver writes the state at most
a few times a second, atomically, so a restarted emulator keeps its instances.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..files import write_atomically
from . import catalog
from .auth import KeyRing
from .project_settings import ProjectSettings

SAVE_INTERVAL_S = 0.2
TRANSITIONAL = {"PROVISIONING": "RUNNING", "STAGING": "RUNNING", "STOPPING": "TERMINATED"}


class InstanceRecord:
    """One instance: its API JSON plus what the emulator needs around it."""

    __slots__ = ("_encoded", "data", "op_lock", "project", "zone")

    def __init__(self, project: str, zone: str, data: dict[str, Any]) -> None:
        self.project = project
        self.zone = zone
        self.data = data
        self._encoded: bytes | None = None
        self.op_lock = threading.Lock()  # operations on one instance run one after the other

    @property
    def name(self) -> str:
        return str(self.data["name"])

    def encoded(self) -> bytes:
        if self._encoded is None:
            self._encoded = json.dumps(self.data, separators=(",", ":")).encode()
        return self._encoded

    def touch(self) -> None:
        """Call after changing `data` (under the store lock)."""
        self._encoded = None


class Store:
    def __init__(self, projects: tuple[str, ...], state_file: Path | None = None, base_url: str = "") -> None:
        self.base_url = base_url
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.projects = set(projects)
        self.keyring = KeyRing()
        self.instances: dict[str, dict[str, dict[str, InstanceRecord]]] = {p: {} for p in projects}
        self.firewalls: dict[str, dict[str, dict[str, Any]]] = {p: {} for p in projects}
        self.operations: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.request_ids: dict[tuple[str, str], tuple[str, str, str]] = {}
        self.counters: dict[str, int] = {"id": 0, "nat": 0}
        # Guest attributes live beside the instance resource (GCE never returns them inside it),
        # keyed by instance id: a new instance of the same name starts with none.
        self.guest_attributes: dict[str, dict[str, str]] = {}
        # OS Login profiles' SSH keys (oslogin.py): account email -> fingerprint -> SshPublicKey.
        self.oslogin_keys: dict[str, dict[str, dict[str, Any]]] = {}
        # Resource policies (regional): project -> "region/name" -> ResourcePolicy.
        self.resource_policies: dict[str, dict[str, dict[str, Any]]] = {}
        # What each project is beyond its resources (APIs, billing, quotas, permissions), and the type
        # of each instance's disks by instance id (an attached disk does not say; quotas count them).
        self.settings: dict[str, ProjectSettings] = {}
        self.disk_types: dict[str, list[str]] = {}
        self._sorted: dict[str, list[InstanceRecord]] = {}
        self.version = 0  # bumped on every instance change; keys the query cache
        self._queries: dict[Any, tuple[int, list[InstanceRecord]]] = {}
        self.state_file = Path(state_file) if state_file else None
        self._dirty = False
        self._saver: threading.Thread | None = None
        self._stopping = threading.Event()
        if self.state_file and self.state_file.exists():
            self._load()

    # -- instances -------------------------------------------------------------------------
    def add_project(self, project: str) -> None:
        with self.lock:
            self.projects.add(project)
            self.instances.setdefault(project, {})
            self.firewalls.setdefault(project, {})

    def settings_for(self, project: str) -> ProjectSettings:
        """The project's settings; a served project without any has the defaults (all allowed),
        and a project the emulator does not serve does not exist."""
        with self.lock:
            settings = self.settings.get(project)
            if settings is None:
                settings = ProjectSettings()
                if project in self.projects:
                    self.settings[project] = settings
            settings.exists = project in self.projects  # the served set decides
            return settings

    def set_exists(self, project: str, exists: bool) -> None:
        """Serve a project (Compute answers for it) or stop serving it; its resources stay stored."""
        with self.lock:
            if exists:
                self.add_project(project)
            else:
                self.projects.discard(project)
            self.mark_dirty()

    def instance(self, project: str, zone: str, name: str) -> InstanceRecord | None:
        return self.instances.get(project, {}).get(zone, {}).get(name)

    def put_instance(self, record: InstanceRecord) -> None:
        with self.lock:
            self.instances[record.project].setdefault(record.zone, {})[record.name] = record
            self._sorted.pop(record.project, None)
            self.version += 1
            self.mark_dirty()

    def touch(self, record: InstanceRecord) -> None:
        """Call after changing an instance's data (under the lock)."""
        with self.lock:
            record.touch()
            self.version += 1
            self.mark_dirty()

    def cached_query(self, key: Any) -> list[InstanceRecord] | None:
        entry = self._queries.get(key)
        return entry[1] if entry and entry[0] == self.version else None

    def cache_query(self, key: Any, records: list[InstanceRecord]) -> None:
        if len(self._queries) > 64:
            self._queries.clear()
        self._queries[key] = (self.version, records)

    def remove_instance(self, record: InstanceRecord) -> None:
        with self.lock:
            zone = self.instances[record.project].get(record.zone, {})
            if zone.get(record.name) is record:
                del zone[record.name]
                self.guest_attributes.pop(str(record.data.get("id")), None)
                self.disk_types.pop(str(record.data.get("id")), None)
                self._sorted.pop(record.project, None)
                self.version += 1
                self.mark_dirty()

    def sorted_instances(self, project: str) -> list[InstanceRecord]:
        """All instances of a project ordered by (zone, name); cached until one is added/removed."""
        with self.lock:
            cached = self._sorted.get(project)
            if cached is None:
                zones = self.instances.get(project, {})
                cached = [zones[z][n] for z in sorted(zones) for n in sorted(zones[z])]
                self._sorted[project] = cached
            return cached

    def all_instances(self) -> Iterator[InstanceRecord]:
        for project in list(self.instances):
            yield from self.sorted_instances(project)

    # -- allocation ------------------------------------------------------------------------
    def next_id(self) -> str:
        """A fresh uint64-looking id, as a decimal string like Google's."""
        with self.lock:
            self.counters["id"] += 1
            return str(4_000_000_000_000_000_000 + self.counters["id"] * 7919)

    def private_ip(self, zone: str) -> str:
        region = catalog.ZONES[zone]
        prefix = catalog.REGION_SUBNETS.get(region, "10.200.0")
        with self.lock:
            key = f"ip:{region}"
            self.counters[key] = self.counters.get(key, 0) + 1
            n = self.counters[key]
        a, b, c = (int(x) for x in prefix.split("."))
        return f"{a}.{b}.{c + (n // 250) % 16}.{n % 250 + 2}"

    def public_ip(self) -> str:
        """A fake external address from documentation/benchmark ranges (never routable)."""
        with self.lock:
            self.counters["nat"] += 1
            n = self.counters["nat"]
        test_nets = ("203.0.113", "198.51.100", "192.0.2")
        if n <= 3 * 253:
            net, host = divmod(n - 1, 253)
            return f"{test_nets[net]}.{host + 1}"
        n -= 3 * 253
        return f"198.{18 + (n >> 16) % 2}.{(n >> 8) & 255}.{n & 255}"

    # -- persistence -----------------------------------------------------------------------
    def mark_dirty(self) -> None:
        self._dirty = True

    def start_saver(self) -> None:
        if self.state_file is None or self._saver is not None:
            return
        self._stopping.clear()
        self._saver = threading.Thread(target=self._save_loop, name="emulator-state-saver", daemon=True)
        self._saver.start()

    def close(self) -> None:
        """Wake every waiter, stop the saver, write the state one last time."""
        self._stopping.set()
        with self.changed:
            self.changed.notify_all()
        if self._saver is not None:
            self._saver.join(timeout=5)
            self._saver = None
        self.save()

    def _save_loop(self) -> None:
        while not self._stopping.wait(SAVE_INTERVAL_S):
            if self._dirty:
                self.save()

    def save(self) -> None:
        if self.state_file is None:
            return
        with self.lock:
            self._dirty = False
            data = {
                "base_url": self.base_url,
                "projects": sorted(self.projects),
                "instances": [
                    {"project": r.project, "zone": r.zone, "data": r.data} for r in self.all_instances()
                ],
                "firewalls": {p: list(f.values()) for p, f in self.firewalls.items()},
                "operations": [op for op in self.operations.values() if op["status"] == "DONE"][-1000:],
                "counters": dict(self.counters),
                "auth": self.keyring.dump(),
                "guest_attributes": self.guest_attributes,
                "oslogin_keys": self.oslogin_keys,
                "resource_policies": self.resource_policies,
                "project_settings": {p: s.to_json() for p, s in sorted(self.settings.items())},
                "disk_types": self.disk_types,
            }
            encoded = json.dumps(data, separators=(",", ":"))
        write_atomically(self.state_file, encoded, mode=0o600)

    def _load(self) -> None:
        assert self.state_file is not None
        text = self.state_file.read_text(encoding="utf-8")
        data = json.loads(text)
        old_base = data.get("base_url")
        if old_base and self.base_url and old_base != self.base_url:
            # Resources embed full URLs; a restart on another port must not leave stale links.
            data = json.loads(text.replace(json.dumps(old_base)[1:-1], json.dumps(self.base_url)[1:-1]))
        for project in data.get("projects", []):
            self.add_project(project)
        for item in data.get("instances", []):
            instance = item["data"]
            # Operations in flight died with the previous process: settle their instances.
            instance["status"] = TRANSITIONAL.get(instance["status"], instance["status"])
            self.add_project(item["project"])
            self.instances[item["project"]].setdefault(item["zone"], {})[instance["name"]] = InstanceRecord(
                item["project"], item["zone"], instance
            )
        for project, firewalls in data.get("firewalls", {}).items():
            self.add_project(project)
            self.firewalls[project] = {f["name"]: f for f in firewalls}
        for op in data.get("operations", []):
            scope = op["selfLink"].split("/projects/", 1)[1].split("/")
            self.operations[(scope[0], "/".join(scope[1:-2]), op["name"])] = op
        self.counters.update(data.get("counters", {}))
        self.keyring.load(data.get("auth", {}))
        self.guest_attributes = {k: dict(v) for k, v in data.get("guest_attributes", {}).items()}
        self.oslogin_keys = {k: dict(v) for k, v in data.get("oslogin_keys", {}).items()}
        self.resource_policies = {k: dict(v) for k, v in data.get("resource_policies", {}).items()}
        self.disk_types = {k: list(v) for k, v in data.get("disk_types", {}).items()}
        for project, settings in data.get("project_settings", {}).items():
            self.settings[project] = ProjectSettings.from_json(settings)
            if not self.settings[project].exists:  # its instances must not bring it back
                self.projects.discard(project)

    def wait_for(self, predicate: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping.is_set():
                    return bool(predicate())
                self.changed.wait(min(remaining, 0.5))
            return True
