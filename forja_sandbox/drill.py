"""The managed-Spot drill on the sandbox: a watched run preempted twice, the second time into a stock-out.

What it does, through the same parts a user has (`Forja.train`, `Forja.watch`, `Forja.keep_tunnel`)
and Google's own clients for what Google does (google-cloud-compute's simulateMaintenanceEvent,
google-cloud-storage's listing of the checkpoint bucket):
1. holds the Colab tunnel open and runs a cell through it;
2. sends a Spot run and watches it (`forja train --managed`);
3. once a verified checkpoint is in the bucket, Google preempts the VM: the watcher starts it again in
   its zone and training resumes from the disk; the same tunnel and token run a cell again;
4. the zone is made to stock out (the emulator's fault injection) and Google preempts the VM again:
   the watcher's restart fails, it makes the VM again in the next zone, configures it, and sends the
   run again, which resumes from the bucket; the same tunnel and token run a cell again;
5. the run completes; the report holds what was measured.

`tests/sandbox/test_site_e2e.py` asserts on the report; `bench/managed_bench.py` prints it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forja.api import Forja
from forja.errors import ForjaError
from forja_sandbox import colab, service

CELL = "print(6 * 7)"


@dataclasses.dataclass
class Recovery:
    """One preemption, and how long the run was down."""

    kind: str  # "restart" (same zone) or "move" (stock-out: another zone)
    zone_before: str
    zone_after: str
    step_at_preemption: int | None
    seconds_to_resumed: float


@dataclasses.dataclass
class DrillReport:
    run: str
    outcome: str
    recoveries: list[Recovery]
    events: list[tuple[str, dict[str, Any]]]
    summary: dict[str, Any]
    cells: list[str]
    said: list[str]
    tunnel_said: list[str]


def _compute():  # type: ignore[no-untyped-def]
    """Google's own Compute client, pointed at the sandbox with the sandbox's service-account key."""
    from google.cloud import compute_v1
    from google.oauth2 import service_account

    endpoint = service.endpoint()
    creds = service_account.Credentials.from_service_account_file(
        endpoint["credentials_file"], scopes=["https://www.googleapis.com/auth/compute"])
    options = {"api_endpoint": f"http://127.0.0.1:{service.port()}"}
    return compute_v1.InstancesClient(credentials=creds, transport="rest", client_options=options)


def _vm_status(instances: Any, name: str) -> str | None:
    """The VM's Compute status in whichever zone it is, None when it is in none.

    One HTTP call to the emulator: the drill's polls cost no playbook, so they leave the cores to
    the run and the watcher they are watching.
    """
    for _, scoped in instances.aggregated_list(project=service.PROJECT):
        for vm in scoped.instances:
            if vm.name == name:
                return str(vm.status)
    return None


def _bucket_markers(bucket: str, prefix: str) -> list[str]:
    """The completion markers of a run's checkpoints in the sandbox's bucket (google-cloud-storage)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project=service.PROJECT, credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": service.storage_url()})
    blobs = client.list_blobs(bucket, prefix=prefix)
    return sorted(b.name for b in blobs if b.name.endswith(".complete.json"))


def _until(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 1.0) -> Any:
    """Poll `check` until it returns something truthy; a drill must end, so it has a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"drill: {what} did not happen within {timeout_s:.0f} s")
        time.sleep(every_s)


def _status(forja: Forja, run: str) -> Any:
    """The run's state on its host, asked again while the host is too busy to answer (it trains)."""

    last: list[str] = []

    def attempt() -> Any:
        try:
            return forja.status(run)[0]
        except ForjaError as exc:
            last[:] = [exc.message.splitlines()[0][:300]]
            return None

    try:
        return _until("the run's status", attempt, 300, every_s=2.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last answer: {last[0] if last else 'none'}") from None


def _cell(port: int, token: str, timeout_s: float = 300.0) -> str:
    """Run the cell through the tunnel as Colab does, as often as it takes the tunnel to come back."""

    def attempt() -> str | None:
        try:
            return colab.run_via_direct(f"http://localhost:{port}", token, CELL, timeout_s=60)
        except Exception:  # the tunnel or the server is not back yet
            return None

    return str(_until("a Colab cell through the tunnel", attempt, timeout_s, every_s=2.0)).strip()


def run_drill(forja: Forja, config: Path, *, run: str, host: str, fallback_zones: list[str], token_file: Path,
              bucket: str, bucket_prefix: str, port: int = 8888, poll_s: float = 10.0,
              advised: tuple[str, str] | None = None, machine_type: str = "g2-standard-8") -> DrillReport:
    """The whole drill (see the module's docstring); raises AssertionError when a step never happens.

    `poll_s`: the watcher's poll, and the drill's between looks at the run's status. Each is a
    playbook; a look every 2 s kept a core busy and slowed the run being watched.
    `advised`: (low, high), two of the fallback zones, the user's order putting `low` first. Google's
    capacity advice (the emulator's scores) rates `low` 0.1 and `high` 0.95, so the move goes straight
    to `high`; an insert in `low` fails loudly (a fault rule), so any attempt there fails the drill.
    """
    if advised is not None:
        low, high = advised
        for zone, score, uptime in ((low, 0.1, "60s"), (high, 0.95, "3600s")):
            service.set_advice(zone=zone, machine_type=machine_type, obtainability=score,
                               estimated_uptime=uptime)
        service.inject_fault(method="instances.insert", status=400, zone=low, times=None,
                             message=f"drill: no VM may be attempted in the low-scored zone {low}")
    said: list[str] = []
    tunnel_said: list[str] = []
    cells: list[str] = []
    recoveries: list[Recovery] = []
    stop_tunnel = threading.Event()
    tunnel = threading.Thread(target=forja.keep_tunnel, daemon=True,
                              kwargs={"host": host, "say": tunnel_said.append,
                                      "stop": stop_tunnel})
    tunnel.start()
    token = token_file.read_text()
    cells.append(_cell(port, token))
    watched: dict[str, Any] = {}

    def watch() -> None:
        try:
            watched["outcome"] = forja.watch(run, fallback_zones=fallback_zones,
                                             train={"config": str(config)}, poll_s=poll_s, say=said.append)
        except BaseException as exc:  # handed to the drill's own thread, which raises it
            watched["error"] = exc

    try:
        forja.train(config, name=run, wait=False)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        instances = _compute()
        markers = f"{bucket_prefix}/{run}/"
        for kind in ("restart", "move"):
            _until("a verified checkpoint in the bucket", lambda: _bucket_markers(bucket, markers), 300)
            name, before = next(iter(forja.observe().items()))
            status = _status(forja, run)
            if kind == "move":  # the zone runs out: the watcher's start there fails
                service.inject_fault(method="instances.start", error="ZONE_RESOURCE_POOL_EXHAUSTED",
                                     zone=before.zone, times=1)
            started = time.monotonic()
            instances.simulate_maintenance_event(project=service.PROJECT, zone=before.zone, instance=name)
            _until("the preemption", lambda: _vm_status(instances, host) != "RUNNING", 120, every_s=0.5)

            def resumed(at: int | None = status.step) -> bool:
                assert "error" not in watched, watched.get("error")
                if _vm_status(instances, host) != "RUNNING":
                    return False
                try:
                    now = forja.status(run)
                except ForjaError:  # SSH not up yet, or the run not sent again yet
                    return False
                # trained on since the preemption: still running, or (a short run on a fast machine)
                # already completed once the host answered again
                return (bool(now) and now[0].status in ("running", "completed")
                        and now[0].step not in (None, at))

            _until("training resumed", resumed, 900, every_s=poll_s)
            after = next(iter(forja.observe().values()))
            took = time.monotonic() - started
            recoveries.append(Recovery(kind, before.zone, after.zone, status.step, took))
            cells.append(_cell(port, token))
        watcher.join(timeout=1800)
        if "error" in watched:
            raise watched["error"]
        final = _status(forja, run)
        events = [(e.kind, e.data) for e in forja.history.events(run)]
        return DrillReport(run, str(watched.get("outcome")), recoveries, events, final.summary or {}, cells,
                           said, tunnel_said)
    except Exception as exc:  # say what the watcher and the tunnel saw up to the failure
        seen = "\n".join(["watcher:", *said[-40:], "tunnel:", *tunnel_said[-20:]])
        raise AssertionError(f"{exc}\n{seen}") from exc
    finally:
        stop_tunnel.set()
        tunnel.join(timeout=30)
        if advised is not None:
            service.clear_faults()
            service.set_advice(clear=True)


