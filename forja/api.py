"""The forja Python API: provision, configure, train, follow, fetch and stop, as typed calls.

    from forja.api import Forja
    f = Forja(project_dir="~/my-project", inventory="inventory/sandbox")
    f.up(); f.configure()
    result = f.train("trainer/configs/digits.yaml")      # streams, waits, fetches
    print(result.summary["final_loss"], result.artifact_dir)
    f.down()

Every method runs one of the repository's playbooks through `forja.runner` (real Ansible, no
shortcuts), returns frozen dataclasses and raises the typed errors of `forja.errors` carrying the
failing host, task and message. Every training run is recorded in `forja.history` before it
starts, so a run that fails, is cancelled or preempted is marked as such, never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forja import errors
from forja import events as ev
from forja.history import History
from forja.runner import PlaybookRun, RunResult
from forja.runner import run as run_playbook

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
#: The status play's task whose stdout holds one JSON line per run (roles/trainer_run/tasks/status.yml).
STATE_TASK = "Read the state of the training runs"
#: Terminal statuses of a run, as the host reports them.
FINAL = ("completed", "failed", "preempted", "stopped")


@dataclass(frozen=True)
class TrainStatus:
    """One run on one host, as the host reports it."""

    host: str
    run: str
    status: str
    unit_state: str
    step: int | None
    total_steps: int | None
    loss: float | None
    exit_status: int
    restarts: int
    node_rank: int
    summary: dict[str, Any] | None = None
    journal: str = ""


@dataclass(frozen=True)
class TrainResult:
    """What `Forja.train` did: the run, where its results are, and the playbook's own result."""

    run_id: str
    status: str
    hosts: list[str]
    summary: dict[str, Any]
    artifact_dir: Path | None
    playbook_result: RunResult = field(repr=False)


@dataclass(frozen=True)
class InventoryHost:
    """How to reach one inventory host (what `forja tunnel` needs)."""

    name: str
    address: str
    user: str | None
    port: int
    key_file: str | None
    vars: dict[str, Any] = field(default_factory=dict, repr=False)


def _config_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _new_run_id(config: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_-]", "-", config.stem)[:30] or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


class Forja:
    """One project's view of its GPU hosts.

    Args:
        project_dir: the user's project folder: sent with the trainer by `train()` unless told
            otherwise, and home of fetched results (`<project_dir>/forja-runs/<run id>/<host>/`).
        inventory: inventory path(s); None uses the repository's ansible.cfg (the sandbox).
        private_data_dir: ansible-runner's folder; None is <forja home>/runner.
        extravars: variables for every playbook (e.g. GCP settings).
        host_key_checking: verify SSH host keys. On by default; the sandbox and the tests turn it
            off explicitly because their throwaway hosts share a generated key.
        limit: Ansible host pattern restricting every playbook.
        on_event: called with every typed event of every playbook (progress UIs).
        history: where runs are recorded; None is the default SQLite file (FORJA_HOME).
        send_project: send `project_dir` with the trainer (False sends only the trainer).
    """

    def __init__(
        self,
        project_dir: str | Path = ".",
        inventory: str | Path | Sequence[str | Path] | None = None,
        private_data_dir: str | Path | None = None,
        extravars: Mapping[str, Any] | None = None,
        *,
        host_key_checking: bool = True,
        limit: str | None = None,
        on_event: Callable[[ev.Event], None] | None = None,
        history: History | None = None,
        send_project: bool = True,
    ) -> None:
        self.project_dir = Path(project_dir).expanduser().resolve()
        if isinstance(inventory, str | Path):
            self.inventory: str | list[str] | None = str(Path(inventory).expanduser().resolve())
        elif inventory is not None:
            self.inventory = [str(Path(i).expanduser().resolve()) for i in inventory]
        else:
            self.inventory = None
        self.private_data_dir = Path(private_data_dir).resolve() if private_data_dir else None
        self.extravars = dict(extravars or {})
        self.host_key_checking = host_key_checking
        self.limit = limit
        self.on_event = on_event
        self.history = history or History()
        self.send_project = send_project
        self._cancel = threading.Event()

    # -- plumbing ---------------------------------------------------------------------------
    def _request(
        self, playbook: str, extravars: Mapping[str, Any] | None = None, timeout_s: int | None = None
    ) -> PlaybookRun:
        return PlaybookRun(
            playbook=playbook,
            inventory=self.inventory,
            extravars={**self.extravars, **(extravars or {})},
            limit=self.limit,
            host_key_checking=self.host_key_checking,
            timeout_s=timeout_s,
            private_data_dir=self.private_data_dir,
        )

    def _run(
        self,
        playbook: str,
        extravars: Mapping[str, Any] | None = None,
        *,
        on_event: Callable[[ev.Event], None] | None = None,
        cancel: threading.Event | None = None,
        timeout_s: int | None = None,
        check: bool = True,
    ) -> RunResult:
        def cancelled() -> bool:
            return self._cancel.is_set() or (cancel is not None and cancel.is_set())

        def fan_out(event: ev.Event) -> None:
            for cb in (on_event, self.on_event):
                if cb is not None:
                    cb(event)

        try:
            request = self._request(playbook, extravars, timeout_s)
            result = run_playbook(request, on_event=fan_out, cancel=cancelled)
        finally:
            self._cancel.clear()
        return result.raise_for_status() if check else result

    def cancel(self) -> None:
        """Cancel the playbook this object is running (from another thread). A training unit
        already started on a host keeps running; `stop()` ends it."""
        self._cancel.set()

    # -- the host's lifecycle ---------------------------------------------------------------
    def up(self) -> RunResult:
        """Create or start the GPU host(s): playbooks/provision.yml."""
        return self._run("provision.yml")

    def configure(self) -> list[RunResult]:
        """GPU stack then Jupyter: playbooks/gpu.yml and playbooks/jupyter.yml."""
        return [self._run("gpu.yml"), self._run("jupyter.yml")]

    def down(self, delete: bool = False) -> RunResult:
        """Stop (or delete) the GPU host(s): playbooks/teardown.yml."""
        return self._run("teardown.yml", {"forja_teardown_delete": delete})

    # -- training ---------------------------------------------------------------------------
    def train(
        self,
        config: str | Path,
        *,
        project: str | Path | None = None,
        name: str | None = None,
        excludes: Sequence[str] = (),
        wait: bool = True,
        fetch: bool = True,
        checkpoints: bool = False,
        wait_timeout_s: int = 3600,
        poll_s: int = 5,
        on_event: Callable[[ev.Event], None] | None = None,
        cancel: threading.Event | None = None,
        extravars: Mapping[str, Any] | None = None,
    ) -> TrainResult:
        """Send the trainer (and the project), start the run as a systemd unit, follow it, fetch results.

        With `wait=False` it returns once the unit has started (status "running"); follow it with
        `status()`, `logs()` and get results with `fetch()`.
        """
        config_path = Path(config).expanduser().resolve()
        if not config_path.is_file():
            raise errors.ConfigError("config", f"{config} is not a file; give a trainer config YAML")
        project_dir = Path(project).expanduser().resolve() if project else (
            self.project_dir if self.send_project else None
        )
        if project_dir is not None and not project_dir.is_dir():
            raise errors.ConfigError("project", f"{project} is not a folder")
        run_id = name or _new_run_id(config_path)
        if not RUN_NAME.match(run_id):
            raise errors.ConfigError(
                "name", f"{run_id!r} must be 1-63 letters, digits, '-' or '_' (first a letter or digit)"
            )
        results = self.results_dir(run_id)
        self.history.start(
            run_id,
            name=run_id,
            config_path=str(config_path),
            config_hash=_config_hash(config_path),
            artifact_dir=str(results) if wait and fetch else None,
        )
        vars_ = {
            "trainer_run_config": str(config_path),
            "trainer_run_name": run_id,
            "trainer_run_project_dir": str(project_dir) if project_dir else "",
            "trainer_run_excludes": list(excludes),
            "trainer_run_wait": wait,
            "trainer_run_fetch": fetch,
            "trainer_run_fetch_checkpoints": checkpoints,
            "trainer_run_fetch_dir": str(results),
            "trainer_run_wait_timeout_s": int(wait_timeout_s),
            "trainer_run_poll_s": int(poll_s),
            **(extravars or {}),
        }
        progress = _ProgressRecorder(self.history, run_id)

        def both(event: ev.Event) -> None:
            progress(event)
            if on_event is not None:
                on_event(event)

        try:
            result = self._run("train.yml", vars_, on_event=both, cancel=cancel, check=False)
        except BaseException as exc:
            self.history.update(run_id, status="failed", ended_at=_now(), message=f"controller error: {exc}")
            raise
        hosts = sorted(result.stats)
        if result.status in ("canceled", "timeout"):
            self.history.update(run_id, status="cancelled", hosts=hosts, ended_at=_now(),
                                message="the playbook was cancelled; the unit may still run (forja status)")
            result.raise_for_status()
        if not result.ok:
            first = (result.unreachable or result.failed_tasks or [None])[0]
            why = f"{first.host}: {first.task}: {first.message}" if first else f"rc {result.rc}"
            self.history.update(run_id, status="failed", hosts=hosts, ended_at=_now(), message=why)
            result.raise_for_status()
        summary, artifact = self._read_results(run_id) if wait and fetch else ({}, None)
        status = str(summary.get("status") or ("completed" if wait else "running"))
        known = status in (*FINAL, "running")
        fields: dict[str, Any] = {"status": status if known else "unknown", "hosts": hosts}
        if wait:
            fields.update(_summary_fields(summary))
            fields["ended_at"] = _now()
        if artifact is not None:
            fields["artifact_dir"] = str(artifact)
        self.history.update(run_id, **fields)
        return TrainResult(run_id, fields["status"], hosts, summary, artifact, result)

    async def train_async(self, config: str | Path, **kwargs: Any) -> TrainResult:
        """asyncio variant of `train`: cancelling the awaiting task cancels the playbook."""
        stop = threading.Event()
        try:
            return await asyncio.to_thread(self.train, config, cancel=stop, **kwargs)
        except asyncio.CancelledError:
            stop.set()
            raise

    def iter_events(self, method: str, *args: Any, **kwargs: Any) -> Iterator[ev.Event | Any]:
        """Yield the typed events of any method (`"train"`, `"up"`, ...) as they happen, then its
        return value last. Stopping the iteration early cancels the playbook."""
        q: queue.Queue[tuple[str, Any]] = queue.Queue()
        previous = self.on_event
        target = getattr(self, method)

        def tee(event: ev.Event) -> None:
            q.put(("event", event))
            if previous is not None:
                previous(event)

        def work() -> None:
            try:
                q.put(("done", target(*args, **kwargs)))
            except BaseException as exc:  # handed to the consumer
                q.put(("error", exc))

        self.on_event = tee
        thread = threading.Thread(target=work, name=f"forja-{method}", daemon=True)
        thread.start()
        try:
            while True:
                kind, item = q.get()
                if kind == "error":
                    raise item
                yield item
                if kind == "done":
                    return
        finally:
            if thread.is_alive():
                self.cancel()
                thread.join()
            self.on_event = previous

    def status(self, name: str | None = None) -> list[TrainStatus]:
        """The state of one run (or every run) on every host; updates the history with what ended."""
        states = self._states({"trainer_run_status_runs": [name] if name else []})
        self._sync_history(states)
        return states

    def logs(self, name: str, lines: int = 50) -> dict[str, str]:
        """The training unit's journal per host."""
        states = self._states({"trainer_run_status_runs": [name], "trainer_run_journal_lines": int(lines)})
        return {s.host: s.journal for s in states}

    def fetch(self, name: str, dest: str | Path | None = None, checkpoints: bool = False) -> RunResult:
        """Copy a run's results (and checkpoints) to `dest` (default: the project's forja-runs/<run>)."""
        if not RUN_NAME.match(name):
            raise errors.ConfigError("name", f"{name!r} is not a run name")
        target = Path(dest).expanduser().resolve() if dest else self.results_dir(name)
        result = self._run(
            "train_fetch.yml",
            {"trainer_run_name": name, "trainer_run_fetch_dir": str(target),
             "trainer_run_fetch_checkpoints": checkpoints},
        )
        summary, artifact = self._read_results(name, target)
        with contextlib.suppress(errors.RunNotFound):
            self.history.update(name, artifact_dir=str(artifact or target), **_summary_fields(summary))
        return RunResult(**{**result.__dict__, "artifact_dir": artifact or target})

    def stop(self, name: str) -> RunResult:
        """Stop a run's unit (it checkpoints on SIGTERM) and keep it from resuming at boot."""
        if not RUN_NAME.match(name):
            raise errors.ConfigError("name", f"{name!r} is not a run name")
        result = self._run("train_stop.yml", {"trainer_run_name": name})
        with contextlib.suppress(errors.RunNotFound):
            self.history.update(name, status="stopped", ended_at=_now())
        return result

    def runs(self, limit: int = 50, status: str | None = None) -> list[Any]:
        """The run history, newest first."""
        return self.history.list(limit=limit, status=status)

    def hosts(self, pattern: str = "forja_gpu") -> list[InventoryHost]:
        """The inventory's hosts in a group (or "all"), with their connection variables."""
        import ansible_runner

        out, err = ansible_runner.interface.get_inventory(
            "list",
            [self.inventory] if isinstance(self.inventory, str) else (self.inventory or []),
            response_format="json",
            quiet=True,
            host_cwd=str(_repo_root()),
        )
        if not isinstance(out, dict):
            raise errors.ConfigError("inventory", f"could not read the inventory: {err or out}")
        meta = out.get("_meta", {}).get("hostvars", {})
        names = _group_hosts(out, pattern) if pattern != "all" else sorted(meta)
        hosts = []
        for name in names:
            hv = meta.get(name, {})
            hosts.append(
                InventoryHost(
                    name=name,
                    address=str(hv.get("ansible_host") or name),
                    user=hv.get("ansible_user"),
                    port=int(hv.get("ansible_port") or 22),
                    key_file=hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file"),
                    vars=hv,
                )
            )
        return hosts

    # -- helpers ------------------------------------------------------------------------------
    def results_dir(self, run_id: str) -> Path:
        return self.project_dir / "forja-runs" / run_id

    def _states(self, extravars: Mapping[str, Any]) -> list[TrainStatus]:
        result = self._run("train_status.yml", extravars)
        states: list[TrainStatus] = []
        for e in result.events:
            if isinstance(e, ev.TaskOk) and e.task == STATE_TASK:
                for line in str(e.result.get("stdout", "")).splitlines():
                    states.append(_status(e.host, json.loads(line)))
        return states

    def _read_results(self, run_id: str, folder: Path | None = None) -> tuple[dict[str, Any], Path | None]:
        """The summary from the rank-0 host's fetched folder (the one that has summary.json)."""
        root = folder or self.results_dir(run_id)
        if not root.is_dir():
            return {}, None
        hosts = sorted(p for p in root.iterdir() if p.is_dir())
        for host_dir in hosts:
            summary_file = host_dir / "summary.json"
            if summary_file.is_file():
                return json.loads(summary_file.read_text()), host_dir
        return {}, hosts[0] if hosts else None

    def _sync_history(self, states: Sequence[TrainStatus]) -> None:
        for s in states:
            if s.status not in FINAL or s.node_rank != 0:
                continue
            try:
                record = self.history.get(s.run)
            except errors.RunNotFound:
                continue
            if record.status != s.status:
                fields = {"status": s.status, **_summary_fields(s.summary or {})}
                if s.status != "running":
                    fields.setdefault("ended_at", _now())
                self.history.update(s.run, **fields)


class _ProgressRecorder:
    """Writes the newest step and loss of a run into the history while it trains (at most every 5 s)."""

    def __init__(self, history: History, run_id: str) -> None:
        self.history = history
        self.run_id = run_id
        self.last_write = 0.0

    def __call__(self, event: ev.Event) -> None:
        if not isinstance(event, ev.TrainProgress) or event.run != self.run_id:
            return
        if time.monotonic() - self.last_write < 5 or not event.step:
            return
        self.last_write = time.monotonic()
        fields: dict[str, Any] = {"steps": event.step}
        if event.loss is not None:
            fields["last_loss"] = event.loss
        cost = event.metrics.get("cost_usd")
        if isinstance(cost, int | float):
            fields["cost_usd"] = float(cost)
        self.history.update(self.run_id, **fields)


def _summary_fields(summary: Mapping[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, col, kind in (("steps", "steps", int), ("final_loss", "last_loss", float),
                           ("cost_usd", "cost_usd", float), ("lost_steps", "lost_steps", int),
                           ("preemptions", "preemptions", int)):
        value = summary.get(key)
        if isinstance(value, int | float):
            fields[col] = kind(value)
    return fields


def _status(host: str, data: Mapping[str, Any]) -> TrainStatus:
    last = data.get("last") or {}
    loss = last.get("loss")
    return TrainStatus(
        host=host,
        run=str(data.get("run", "")),
        status=str(data.get("status", "unknown")),
        unit_state=f"{data.get('active_state', '')}/{data.get('sub_state', '')}",
        step=last.get("step"),
        total_steps=data.get("total_steps"),
        loss=float(loss) if isinstance(loss, int | float) else None,
        exit_status=int(data.get("exit_status") or 0),
        restarts=int(data.get("restarts") or 0),
        node_rank=int(data.get("node_rank") or 0),
        summary=data.get("summary"),
        journal=str(data.get("journal") or ""),
    )


def _group_hosts(inventory: Mapping[str, Any], group: str) -> list[str]:
    """Hosts of a group, children included, in inventory order."""
    seen: list[str] = []
    node = inventory.get(group) or {}
    for host in node.get("hosts", []):
        if host not in seen:
            seen.append(host)
    for child in node.get("children", []):
        for host in _group_hosts(inventory, child):
            if host not in seen:
                seen.append(host)
    return seen


def _repo_root() -> Path:
    from forja.runner import REPO_ROOT

    return REPO_ROOT


def _now() -> str:
    from forja.history import now

    return now()
