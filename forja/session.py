"""What every verb of forja needs: the project, its inventory and history, and one way to run a playbook.

Why a small core: every verb (training, tunnel, cost, data, the managed watcher, Vertex AI, the
dashboard) is a module of functions over a `Session`; they call this core and it never calls them,
so a feature can be read, tested and changed by its own name. `forja.api.Forja` is a `Session` whose
methods are one-line delegations to those functions.

A `Session` may serve concurrent calls from several threads (or `iter_events` streams): each call has
its own cancel token and its own listeners, and the history is a SQLite file opened per operation.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forja import contract, errors, inventory, runstate
from forja import events as ev
from forja import notify as notifications
from forja.history import History
from forja.inventory import Cluster, InventoryHost
from forja.runner import PlaybookRun, RunResult, Stream
from forja.runner import run as run_playbook
from forja.runs import rank0
from trainer import run_folder

#: Seconds one follow playbook (playbooks/train_wait.yml) polls before the next one takes over.
#: A window, not a limit: following goes on window after window until the run ends; the window
#: only bounds what one playbook holds. FORJA_FOLLOW_WINDOW_S overrides it (tests use seconds).
FOLLOW_WINDOW_S = 600
#: Seconds between two looks at a run while following it (-e trainer_run_poll_s overrides it).
POLL_S = 5
#: Where fetched results go inside the project: <project>/forja-runs/<run id>/<host>/.
RESULTS_FOLDER = "forja-runs"


@dataclass(frozen=True)
class _Call:
    """One call streamed by `Session.iter_events`: its own cancel token and its own listener, seen by
    every playbook the call runs (train runs several) and by no other call."""

    session: Session
    cancelled: threading.Event
    emit: Callable[[ev.Event], None]


#: The call the current thread is serving (set by iter_events in the call's own thread).
_CALL: ContextVar[_Call | None] = ContextVar("forja_call", default=None)


class Session:
    """One project's view of its GPU hosts.

    One session may serve concurrent calls from several threads (or `iter_events` streams): each
    call has its own cancel token and its own events, and the history is a SQLite file opened per
    operation.

    Args:
        project_dir: the user's project folder: sent with the trainer by `train()` unless told
            otherwise, and home of fetched results (`<project_dir>/forja-runs/<run id>/<host>/`).
            None: the current folder holds the results, and a run sends its config's or script's
            own project (its git root; none for a built-in config: forja.project.default_project).
        inventory: inventory path(s), e.g. "inventory/sandbox" or "inventory/gcp_gpu.yml"; None reads
            FORJA_INVENTORY as the CLI does (`forja.inventory.chosen`), else ANSIBLE_INVENTORY; with
            none of them, a call that needs hosts raises ConfigError naming the choices, before
            anything runs (the history and price lookups need no inventory).
        private_data_dir: ansible-runner's folder; None is <forja home>/runner.
        extravars: variables for every playbook (e.g. GCP settings).
        host_key_checking: verify SSH host keys. On by default; the sandbox and the tests turn it
            off explicitly because their throwaway hosts share a generated key.
        limit: Ansible host pattern restricting every playbook.
        on_event: called with every typed event of every playbook (progress UIs).
        history: where runs are recorded; None is the default SQLite file (FORJA_HOME).
        send_project: send `project_dir` with the trainer (False sends only the trainer).
        follow_window_s: seconds one follow playbook polls before the next takes over (not a
            limit; None: FORJA_FOLLOW_WINDOW_S or FOLLOW_WINDOW_S).
        cluster: act on this cluster of the inventory (`gcp_instance_count: N`), named as its VMs
            were (gcp_instance_name, e.g. "forja-l4"): the playbooks aim at its group, a run is
            followed and fetched on its rank-0 member and recorded with every member as its hosts.
            A name the inventory has no cluster of raises ConfigError naming those it has.
    """

    def __init__(
        self,
        project_dir: str | Path | None = None,
        inventory: str | Path | Sequence[str | Path] | None = None,
        private_data_dir: str | Path | None = None,
        extravars: Mapping[str, Any] | None = None,
        *,
        host_key_checking: bool = True,
        limit: str | None = None,
        on_event: Callable[[ev.Event], None] | None = None,
        history: History | None = None,
        send_project: bool = True,
        follow_window_s: int | None = None,
        cluster: str | None = None,
    ) -> None:
        from forja import inventory as inventories

        self.project_dir = Path(project_dir or ".").expanduser().resolve()
        #: The user named the project (else a run sends its config's or script's own: forja.project).
        self.project_named = project_dir is not None
        self.inventory: str | list[str] | None = inventories.chosen(inventory)
        self.private_data_dir = Path(private_data_dir).resolve() if private_data_dir else None
        self.extravars = dict(extravars or {})
        self.host_key_checking = host_key_checking
        self.limit = limit
        self.on_event = on_event
        self.history = history or History()
        self.send_project = send_project
        window = follow_window_s or os.environ.get("FORJA_FOLLOW_WINDOW_S") or FOLLOW_WINDOW_S
        self.follow_window_s = max(1, int(window))
        self.cluster = cluster
        self._cluster: Cluster | None = None  # read from the inventory on first use
        #: Where the run's events are posted (`notify=` of train and watch; forja/notify.py); None: nowhere.
        self.notifier: notifications.Notifier | None = None
        #: The cancel token of every call in flight (one per call: calls never cancel each other).
        self._inflight: set[threading.Event] = set()
        self._lock = threading.Lock()

    # -- running a playbook -----------------------------------------------------------------
    def run(
        self,
        playbook: str,
        extravars: Mapping[str, Any] | None = None,
        *,
        on_event: Callable[[ev.Event], None] | None = None,
        cancel: threading.Event | None = None,
        timeout_s: int | None = None,
        check: bool = True,
    ) -> RunResult:
        """Run one of forja's playbooks with this session's inventory, variables and listeners.

        An inventory that does not parse raises ConfigError, a stopped VM HostStopped, whatever
        `check` says; otherwise a failed play raises only with `check` (its RunResult says why)."""
        call = self._call()
        # A call streamed by iter_events owns one token for all its playbooks; a plain call gets
        # one per playbook. Either way it is this call's alone.
        token = call.cancelled if call is not None else threading.Event()

        def cancelled() -> bool:
            return token.is_set() or (cancel is not None and cancel.is_set())

        request = PlaybookRun(
            playbook=playbook,
            inventory=inventory.required(self.inventory),
            extravars={**self.extravars, **self.cluster_hosts(), **(extravars or {})},
            limit=self.limit,
            host_key_checking=self.host_key_checking,
            timeout_s=timeout_s,
            private_data_dir=self.private_data_dir,
        )
        with self._tracked(token):
            result = run_playbook(request, on_event=self.fan_out(on_event), cancel=cancelled)
        self._raise_if_unparsed(result)
        self._raise_if_stopped(result)
        return result.raise_for_status() if check else result

    def _call(self) -> _Call | None:
        """The `iter_events` call this thread serves for this object (None: a plain call, or another
        session's call made from inside it)."""
        call = _CALL.get()
        return call if call is not None and call.session is self else None

    def fan_out(self, on_event: Callable[[ev.Event], None] | None = None) -> Callable[[ev.Event], None]:
        """What hands an event to every listener of the current call, in order: the method's own
        `on_event`, the `iter_events` stream serving the call, this object's `on_event`. Playbook
        events and the API's own (`HostStarting`) take this one path."""
        call = self._call()
        listeners = (on_event, call.emit if call is not None else None, self.on_event)

        def fan_out(event: ev.Event) -> None:
            for cb in listeners:
                if cb is not None:
                    cb(event)

        return fan_out

    def _raise_if_unparsed(self, result: RunResult) -> None:
        """An inventory Ansible could not parse raises ConfigError (exit 2) naming it, whatever
        `check` says: the play stopped before any host was read, so there is no run to report."""
        if result.ok or result.failed_tasks or result.unreachable:
            return
        not_parsed = inventory.unparsed(result.output_tail)
        if not_parsed is not None:
            raise not_parsed

    def _raise_if_stopped(self, result: RunResult) -> None:
        """A host that did not answer because its VM is stopped raises `HostStopped` (exit 6),
        whatever `check` says: nothing ran there, and "start it" is the fix, not SSH debugging.

        Only asked after a host was unreachable, so a healthy run pays nothing for it. If the
        inventory cannot be read now, the plain "unreachable" error stands.
        """
        if not result.unreachable:
            return
        try:
            known = {h.name: h for h in inventory.hosts(self.inventory, "all")}
        except errors.ForjaError:
            return
        for outcome in result.unreachable:
            host = known.get(outcome.host)
            if host is not None and host.stopped:
                raise inventory.stopped_error(host, task=outcome.task)

    @contextlib.contextmanager
    def _tracked(self, token: threading.Event) -> Iterator[None]:
        """Count a call's token as in flight (for `cancel()`) while its playbook runs."""
        with self._lock:
            self._inflight.add(token)
        try:
            yield
        finally:
            with self._lock:
                self._inflight.discard(token)

    def cancel(self) -> None:
        """Cancel every call this object is running now (from another thread or an event callback).

        Calls are independent: to cancel one of several concurrent calls, run it through
        `iter_events` and cancel its stream, or give it its own `cancel` event. A training unit
        already started on a host keeps running; `stop()` ends it.
        """
        with self._lock:
            tokens = list(self._inflight)
        for token in tokens:
            token.set()

    def iter_events(self, method: str, *args: Any, **kwargs: Any) -> Stream[ev.Event, Any]:
        """Stream any method (`"train"`, `"up"`, `"status"`, ...): its typed events as they happen,
        then its return value last. The call runs in its own thread with its own cancel token:
        `cancel()` on the stream, or leaving the loop early, cancels this call and no other, so one
        `Forja` can serve several streams at once."""
        target = getattr(self, method)

        def work(emit: Callable[[ev.Event], None], cancelled: threading.Event) -> Any:
            entered = _CALL.set(_Call(self, cancelled, emit))
            try:
                with self._tracked(cancelled):
                    return target(*args, **kwargs)
            finally:
                _CALL.reset(entered)

        return Stream(work, name=f"forja-{method}")

    # -- the inventory ----------------------------------------------------------------------
    def chosen_cluster(self) -> Cluster | None:
        """The cluster named with `cluster=`, read from the inventory once; None when none is named."""
        if self.cluster is None:
            return None
        if self._cluster is None:
            listing = inventory.read(inventory.required(self.inventory))
            self._cluster = inventory.cluster(listing, self.cluster)
        return self._cluster

    def cluster_hosts(self, rank0: bool = False) -> dict[str, Any]:
        """The play's hosts when a cluster is named: its group, or its rank-0 member alone (`rank0`:
        the one that follows a run and has its results, as trainer_run's own wait and fetch do)."""
        chosen = self.chosen_cluster()
        if chosen is None:
            return {}
        return {"forja_hosts": chosen.rank0 if rank0 else chosen.group}

    def run_hosts(self, states: Sequence[tuple[str, runstate.RunState]]) -> list[str]:
        """The hosts a followed run is recorded on: every member of the named cluster (all of them
        are kept up, and priced), else the hosts that reported it."""
        chosen = self.chosen_cluster()
        return list(chosen.members) if chosen is not None else sorted({h for h, _ in states})

    def hosts(self, pattern: str = "forja_gpu") -> list[InventoryHost]:
        """The inventory's hosts in a group (or "all"), with their connection variables and record.

        Values are plain (no ansible-core "unsafe" markers) and never include cached facts; see
        `forja.inventory`, the one reader of the inventory.
        """
        return inventory.hosts(inventory.required(self.inventory), pattern)

    def gpu_host(self, host: str | None = None) -> InventoryHost:
        """The GPU host a one-host verb (tunnel) acts on: `host`, or the first of the forja_gpu group.

        Raises ConfigError naming --host when the inventory has no such host.
        """
        hosts = self.hosts()
        chosen = [h for h in hosts if host in (None, h.name)]
        if not chosen:
            raise errors.ConfigError(
                "--host", f"{host or 'forja_gpu'} is not in the inventory ({len(hosts)} GPU hosts)"
            )
        return chosen[0]

    def instances_if_named(self) -> list[dict[str, Any]]:
        """The inventory's priced hosts when an inventory is named, else none (history needs none)."""
        if not self.inventory:
            return []
        return inventory.gcp_instances(self.inventory)[0]

    # -- runs on the hosts and their results here -------------------------------------------
    def project_folder(
        self, project: str | Path | None = None, config: str | Path | None = None,
        script: str | Path | None = None,
    ) -> Path | None:
        """The folder sent with a run: `project` when given, else this session's project_dir when
        the user named it, else the config's or script's own project (forja.project.default_project);
        None when it sends none (send_project=False). ConfigError naming `project` when it is not a folder."""
        from forja.project import default_project

        if not project:
            if not self.send_project or self.project_named:
                return self.project_dir if self.send_project else None
            found = default_project(*(Path(p).expanduser().resolve() if p is not None else None
                                      for p in (config, script)), Path.cwd().resolve())
            return found if found is not None and found.is_dir() else None  # a missing file: train says
        folder = Path(project).expanduser().resolve()
        if not folder.is_dir():
            raise errors.ConfigError("project", f"{project} is not a folder")
        return folder

    def results_dir(self, run_id: str) -> Path:
        """Where a run's results are fetched to by default: <project>/forja-runs/<run id>."""
        return self.project_dir / RESULTS_FOLDER / run_id

    def read_states(
        self, extravars: Mapping[str, Any], cancel: threading.Event | None = None
    ) -> list[tuple[str, runstate.RunState]]:
        """(host, state) of runs as the status play publishes them (set_stats: the typed contract)."""
        result = self.run("train_status.yml", extravars, cancel=cancel)
        return contract.read_stats(result.artifact_data).runs

    def read_results(self, run_id: str, folder: Path | None = None) -> tuple[dict[str, Any], Path | None]:
        """The summary from the rank-0 host's fetched folder (the one that has summary.json)."""
        root = folder or self.results_dir(run_id)
        if not root.is_dir():
            return {}, None
        hosts = sorted(p for p in root.iterdir() if p.is_dir())
        for host_dir in hosts:
            summary_file = host_dir / run_folder.SUMMARY
            if summary_file.is_file():
                return json.loads(summary_file.read_text()), host_dir
        return {}, hosts[0] if hosts else None

    def sync_history(self, pairs: Sequence[tuple[str, runstate.RunState]]) -> list[str]:
        """Bring the history up to date with what the hosts report (rank 0 speaks for a run); the runs
        it found ended just now (the caller prices them: forja.cost_report.settle)."""
        ended: list[str] = []
        hosts: dict[str, list[str]] = {}
        for host, state in pairs:
            if state.status != "unknown":
                hosts.setdefault(state.run, []).append(host)
        for run, run_hosts in hosts.items():
            first = rank0([(h, s) for h, s in pairs if s.run == run])
            if first is not None and self.history.record_host_run(
                first, hosts=sorted(run_hosts), message="found on the hosts (not started by this forja)"
            ) and first.final:
                ended.append(run)
        return ended

    # -- how long and how often to look -------------------------------------------------------
    def follow_limit(self, timeout_s: float | None) -> float | None:
        """The caller's own limit on following, in seconds; None is none (0 or unset means none)."""
        field_name = "timeout_s"
        if timeout_s is None:
            field_name = "trainer_run_wait_timeout_s"
            timeout_s = self.extravars.get(field_name)
        try:
            value = float(timeout_s or 0)
        except (TypeError, ValueError):
            value = -1.0
        if value < 0 or math.isnan(value):
            raise errors.ConfigError(field_name, f"{timeout_s!r} is not a number of seconds >= 0 (0: none)")
        return value or None

    def poll(self, poll_s: int | None) -> int:
        """Seconds between two looks at a run: `poll_s`, else -e trainer_run_poll_s, else POLL_S."""
        value = poll_s if poll_s is not None else self.extravars.get("trainer_run_poll_s", POLL_S)
        try:
            poll = int(value)
        except (TypeError, ValueError):
            poll = 0
        if poll < 1:
            raise errors.ConfigError("trainer_run_poll_s", f"{value!r} is not a whole number of seconds >= 1")
        return poll
