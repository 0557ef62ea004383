"""Binds Compute emulator instances to real local hosts, so "creating a VM" boots one.

The emulator calls this from its operation worker: create/start boot a systemd-nspawn host and
return its address (shown as the instance's IP), stop halts it but keeps its disk, delete removes
it. The instance-to-host binding is persisted next to the emulator's state so a restarted
sandbox finds its hosts again.

Each host also gets its instance's GCE firewall (`forja_sandbox.firewall`: the project's rules
and the instance's tags, as nftables in the host's namespace), loaded before the host has an
address and replaced whenever the emulator reports a change (`firewalls_changed`), so SSH that
the rules do not admit fails here as on Google Cloud.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from forja_sandbox import firewall, testhosts
from forja_sandbox.files import write_atomically

FIRST_INDEX = 10
LAST_INDEX = 19
#: The image project whose instances boot the Deep Learning VM layer (the image's PyTorch).
DLVM_IMAGE_PROJECT = "deeplearning-platform-release"


class SandboxFull(RuntimeError):
    """Every host slot of the sandbox is taken."""


def instance_key(instance: dict[str, Any]) -> str:
    """A stable key for an instance: its zone's short name and its own name."""
    zone = str(instance.get("zone", "")).rstrip("/").rsplit("/", 1)[-1]
    return f"{zone}/{instance['name']}"


def project_of(instance: dict[str, Any]) -> str:
    """The project an instance belongs to, from its selfLink (`.../projects/P/zones/...`)."""
    return str(instance.get("selfLink", "")).partition("/projects/")[2].split("/", 1)[0]


def image_of(instance: dict[str, Any]) -> str:
    """`dlvm` for an instance whose boot disk comes from a Deep Learning VM image, else `golden`.

    The disk's licenses name the image's project (the emulator sets them from the source image,
    as Compute Engine does), so the host boots what the instance asked for.
    """
    for disk in instance.get("disks") or []:
        licenses = disk.get("licenses") or []
        if disk.get("boot") and any(f"/projects/{DLVM_IMAGE_PROJECT}/" in lic for lic in licenses):
            return "dlvm"
    return "golden"


class TestHostBackend:
    """An `InstanceBackend` whose instances are systemd-nspawn hosts th10 … th19."""

    def __init__(
        self,
        bindings_file: Path,
        first: int = FIRST_INDEX,
        last: int = LAST_INDEX,
        enforce_firewall: bool = True,
        metadata_url: str | None = None,
        boot_over_file: Path | None = None,
    ) -> None:
        self._file = bindings_file
        self._boot_over_file = boot_over_file
        # With a metadata server's URL, hosts run the guest-agent stand-in and have no baked-in key:
        # SSH access is then what the instance's `ssh-keys` metadata grants, as on GCE.
        self._metadata_url = metadata_url
        self._first, self._last = first, last
        self._lock = threading.Lock()
        self._bindings: dict[str, int] = {}
        self._enforce_firewall = enforce_firewall
        # The project's stored rules as the emulator last reported them; the lock also orders the
        # loads, so a host never ends with older rules than the newest report.
        self._firewall_lock = threading.Lock()
        self._firewalls: dict[str, list[dict[str, Any]]] = {}
        # ... and its instances (their tags and internal IPs: the sources of sourceTags rules).
        self._peers: dict[str, list[dict[str, Any]]] = {}
        if bindings_file.exists():
            self._bindings = {k: int(v) for k, v in json.loads(bindings_file.read_text()).items()}

    def _save(self) -> None:
        write_atomically(self._file, json.dumps(self._bindings, indent=1, sort_keys=True))

    def bindings(self) -> dict[str, int]:
        with self._lock:
            return dict(self._bindings)

    def index_of(self, instance: dict[str, Any]) -> int | None:
        with self._lock:
            return self._bindings.get(instance_key(instance))

    def _bind(self, instance: dict[str, Any]) -> int:
        key = instance_key(instance)
        with self._lock:
            if key in self._bindings:
                return self._bindings[key]
            used = set(self._bindings.values())
            free = [i for i in range(self._first, self._last + 1) if i not in used]
            if not free:
                raise SandboxFull(
                    f"the sandbox has {self._last - self._first + 1} host slots and all are taken; "
                    "delete an instance first")
            self._bindings[key] = free[0]
            self._save()
            return free[0]

    def boot_over(self, image: str) -> Path | None:
        """The cached layer (forja_sandbox/hostlayers.py) a new host of ``image`` boots over: what the
        boot-over file names for it (`service.boot_over`), read at each create; by default none, so a
        VM's first converge installs everything, as on Google Cloud. Tests whose subject is not the
        install (a cluster's training, a Spot VM's move) name one to save the converge's pip installs.
        A started VM boots its own disk's layers, whatever the file says now.
        """
        if self._boot_over_file is None or not self._boot_over_file.exists():
            return None
        layer = json.loads(self._boot_over_file.read_text()).get(image)
        return Path(layer) if layer else None

    def create(self, instance: dict[str, Any]) -> str:
        index = self._bind(instance)
        testhosts.down(index)  # a fresh disk, whatever an earlier instance left in this slot
        rules = self._ruleset(instance)
        image = image_of(instance)
        address = testhosts.up(index, image=image, firewall=rules, metadata_url=self._metadata_url,
                               over=self.boot_over(image)).address
        self._reload_if_changed(instance, index, rules)
        return address

    def start(self, instance: dict[str, Any]) -> str:
        # A stopped host boots its own layers again (th-up.sh keeps them); the image only matters
        # for a slot whose disk is gone.
        index = self._bind(instance)
        rules = self._ruleset(instance)
        address = testhosts.up(index, image=image_of(instance), firewall=rules,
                               metadata_url=self._metadata_url).address
        self._reload_if_changed(instance, index, rules, always=True)  # it may have been up already
        return address

    def _ruleset(self, instance: dict[str, Any]) -> str | None:
        if not self._enforce_firewall:
            return None
        with self._firewall_lock:
            return self._ruleset_locked(instance)

    def _ruleset_locked(self, instance: dict[str, Any]) -> str:
        project = project_of(instance)
        return firewall.ruleset(self._firewalls.get(project, []), instance, self._peers.get(project, []))

    def _reload_if_changed(
        self, instance: dict[str, Any], index: int, loaded: str | None, always: bool = False
    ) -> None:
        """Load the newest rules if a change was reported while the host booted with `loaded`."""
        if loaded is None:
            return
        with self._firewall_lock:
            rules = self._ruleset_locked(instance)
            if always or rules != loaded:
                testhosts.apply_firewall(index, rules)

    def firewalls_changed(
        self, project: str, firewalls: list[dict[str, Any]], instances: list[dict[str, Any]]
    ) -> None:
        """The emulator's report of a project's rules and instances: keep them, and reload every host of it.

        Instances count too: a rule whose sources are tags admits the tagged instances' addresses,
        which change when one is created, started or deleted.
        """
        if not self._enforce_firewall:
            return
        with self._firewall_lock:
            self._firewalls[project] = list(firewalls)
            self._peers[project] = list(instances)
            for instance in instances:
                index = self.index_of(instance)
                if index is not None:
                    testhosts.apply_firewall(index, firewall.ruleset(firewalls, instance, instances))

    def stop(self, instance: dict[str, Any]) -> None:
        index = self.index_of(instance)
        if index is not None:
            testhosts.stop(index)

    def delete(self, instance: dict[str, Any]) -> None:
        key = instance_key(instance)
        with self._lock:
            index = self._bindings.pop(key, None)
            self._save()
        if index is not None:
            testhosts.down(index)

    def is_running(self, instance: dict[str, Any]) -> bool:
        """Whether the instance's host is up; False once the guest powered itself off."""
        index = self.index_of(instance)
        return index is not None and testhosts.is_up(index)

    def remove_all(self) -> None:
        with self._lock:
            indices = list(self._bindings.values())
            self._bindings = {}
            self._save()
        for index in indices:
            testhosts.down(index)
