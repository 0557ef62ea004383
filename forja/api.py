"""The forja Python API: provision, configure, train, follow, fetch and stop, as typed calls.

    from forja.api import Forja
    f = Forja(project_dir="~/my-project", inventory="inventory/sandbox")
    f.up(); f.configure()
    result = f.train("trainer/configs/digits.yaml")      # streams, follows to the end, fetches
    print(result.summary["final_loss"], result.artifact_dir)
    run = f.train(script="train.py", args=["--lr", "3e-4"], wait=False)   # your own script, detached
    f.follow(run.run_id)                                  # pick it up again: hours or days later
    print(f.tunnel().colab_url, f.cost().lines[0].usd_per_hour)
    stream = f.iter_events("status")                      # events as they happen, then the result
    for item in stream: ...                               # stream.cancel() stops this call only
    f.down()

Every verb of the `forja` command is one of these methods, with the same docstring. Every method
runs one of the repository's playbooks through `forja.runner` (real Ansible, no shortcuts), returns
frozen dataclasses and raises the typed errors of `forja.errors` carrying the failing host, task and
message. Every training run is recorded in `forja.history` before it
starts, so a run that fails, is cancelled or preempted is marked as such, never lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forja import contract, errors, live, runstate, trainer_config
from forja import events as ev
from forja.history import History, summary_fields
from forja.inventory import Cluster, InventoryHost
from forja.runner import PlaybookRun, RunResult, Stream
from forja.runner import run as run_playbook
from forja.tunnel import TunnelPlan

if TYPE_CHECKING:  # the push's result; forja.hub itself is imported when a push runs
    from forja.hub import HubPush
    from forja.vertex import VertexOptions

#: What a run name may be: the host contract's pattern (roles/host_contract), which trainer_run checks too.
RUN_NAME = runstate.RUN_NAME
#: trainer_run's task that moves a replaced run's host folder aside (tasks/main.yml): whether the
#: host was touched when a `--replace` play fails.
SET_ASIDE_TASK = "Set the replaced run's folder aside"
#: The role's refusal of a name whose run completed on the host (roles/trainer_run/tasks/validate.yml):
#: this history may not know that run (another machine sent it), so the host is asked too.
COMPLETED_TASK = "Refuse to send a run under the name of one that completed on this host"
#: Seconds one follow playbook (playbooks/train_wait.yml) polls before the next one takes over.
#: A window, not a limit: following goes on window after window until the run ends; the window
#: only bounds what one playbook holds. FORJA_FOLLOW_WINDOW_S overrides it (tests use seconds).
FOLLOW_WINDOW_S = 600
#: Seconds between two looks at a run while following it (-e trainer_run_poll_s overrides it).
POLL_S = 5


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
    #: Nodes of the run (1: one VM); node_rank is this host's among them.
    nnodes: int = 1
    #: Worker-group restarts of torchrun's elastic agent on this node (None: not an elastic run).
    elastic_restarts: int | None = None


@dataclass(frozen=True)
class TrainResult:
    """What `Forja.train` did: the run, where its results are, and the playbook's own result."""

    run_id: str
    status: str
    hosts: list[str]
    summary: dict[str, Any]
    artifact_dir: Path | None
    playbook_result: RunResult | None = field(default=None, repr=False)
    #: None when forja followed the run to its end; otherwise why it stopped following while the
    #: run goes on: "detach" (asked not to wait), "timeout" (the caller's limit), "interrupted"
    #: (Ctrl-C, KeyboardInterrupt or `cancel`). `follow()` picks the run up again.
    detached: str | None = None
    #: What of the config the controller could not check, imported only where the run starts
    #: ("model pkg.mod:net", forja.trainer_config.Judged); empty for a script or a run followed again.
    unchecked: tuple[str, ...] = ()


@dataclass(frozen=True)
class CostReport:
    """What `Forja.cost` found: one line per priced instance, its budget check, the hosts not priced,
    and one line per cluster (forja.cost.cluster: its members added up, "2 × g2-standard-24")."""

    prices_date: str
    now: datetime
    lines: list[Any]
    #: One per line (None without a per-instance cap; a cluster's members share their cluster's
    #: check); `project` is the check of a project cap.
    checks: list[Any]
    project: Any | None
    skipped: list[str]
    clusters: list[Any] = field(default_factory=list)
    #: The user's own machines in the inventory (host_contract_platform: own): no cloud price.
    own_machines: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The JSON document of `forja --json cost`: every figure at full precision."""
        out: dict[str, Any] = {
            "prices_date": self.prices_date,
            "now": self.now.isoformat(),
            "instances": [
                {**line.as_dict(),
                 "budget": None if chk is None else {"level": chk.level.value, "message": chk.message}}
                for line, chk in zip(self.lines, self.checks, strict=True)
            ],
            "skipped": self.skipped,
            "clusters": [c.as_dict() for c in self.clusters],
            "own_machines": self.own_machines,
        }
        if self.project is not None:
            out["project_budget"] = {"level": self.project.level.value, "message": self.project.message}
        return out


def how_to_follow(run_id: str) -> str:
    """What to tell a person whose command stopped following a run that goes on."""
    return (f"follow it with `forja follow {run_id}` or `forja logs -f {run_id}`; "
            f"stop it with `forja stop {run_id}`")


@dataclass(frozen=True)
class _SetAside:
    """A replaced run's new name, and the bucket its checkpoints were moved in (None: no bucket)."""

    aside: str
    bucket: str | None


@dataclass(frozen=True)
class _RunPlan:
    """What `train` sends: the role variables that say what to run, and what the history records."""

    extravars: dict[str, Any]
    record_path: Path
    name_source: Path
    #: What of the config only the run's start can check (forja.trainer_config.Judged.unchecked).
    unchecked: tuple[str, ...] = ()


def _plan_run(
    config: str | Path | None, script: str | Path | None, args: Sequence[str], project_dir: Path | None
) -> _RunPlan:
    """Check the config and the script before anything is sent; say what to fix when they are wrong."""
    extravars: dict[str, Any] = {}
    config_path: Path | None = None
    if config is not None:
        config_path = Path(config).expanduser().resolve()
        if not config_path.is_file():
            raise errors.ConfigError("config", f"{config} is not a file; give a trainer config YAML")
        extravars["trainer_run_config"] = str(config_path)
    if script is None:
        if args:
            raise errors.ConfigError("args", "arguments after -- are for your script; give it with --script")
        if config_path is None:
            raise errors.ConfigError("config", "give a trainer config YAML, or your own script with --script")
        judged = trainer_config.judge(config_path)  # the trainer's own check, before anything is sent
        return _RunPlan(extravars, config_path, config_path, judged.unchecked)
    if project_dir is None:
        raise errors.ConfigError(
            "script", f"{script} is sent with your project; give the project folder (--project)"
        )
    given = Path(script).expanduser()
    path = (given if given.is_absolute() else project_dir / given).resolve()
    try:
        relative = path.relative_to(project_dir)
    except ValueError:
        raise errors.ConfigError(
            "script", f"{script} is not inside the project {project_dir}; put it there or give --project"
        ) from None
    if not path.is_file():
        raise errors.ConfigError(
            "script",
            f"{script} is not a file in the project {project_dir} (looked for {path}); give the path "
            "of your script relative to the project folder (--project)",
        )
    extravars["trainer_run_command"] = [relative.as_posix(), *map(str, args)]
    return _RunPlan(extravars, config_path or path, path)


def _config_hash(path: Path) -> str:
    from forja.cost.estimate import config_hash  # its one home: the estimate finds earlier runs by it

    return config_hash(path)


def _new_run_id(config: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_-]", "-", config.stem)[:30] or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


@dataclass(frozen=True)
class _Call:
    """One API call streamed by `Forja.iter_events`: its own cancel token and its own listener,
    seen by every playbook the call runs (train runs several) and by no other call."""

    forja: Forja
    cancelled: threading.Event
    emit: Callable[[ev.Event], None]


#: The call the current thread is serving (set by iter_events in the call's own thread).
_CALL: ContextVar[_Call | None] = ContextVar("forja_call", default=None)


class Forja:
    """One project's view of its GPU hosts.

    One `Forja` may serve concurrent calls from several threads (or `iter_events` streams): each
    call has its own cancel token and its own events, and the history is a SQLite file opened per
    operation.

    Args:
        project_dir: the user's project folder: sent with the trainer by `train()` unless told
            otherwise, and home of fetched results (`<project_dir>/forja-runs/<run id>/<host>/`).
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
        follow_window_s: int | None = None,
        cluster: str | None = None,
    ) -> None:
        from forja import inventory as inventories

        self.project_dir = Path(project_dir).expanduser().resolve()
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
        #: The cancel token of every call in flight (one per call: calls never cancel each other).
        self._inflight: set[threading.Event] = set()
        self._lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------------
    def _request(
        self, playbook: str, extravars: Mapping[str, Any] | None = None, timeout_s: int | None = None
    ) -> PlaybookRun:
        from forja import inventory

        return PlaybookRun(
            playbook=playbook,
            inventory=inventory.required(self.inventory),
            extravars={**self.extravars, **self._cluster_hosts(), **(extravars or {})},
            limit=self.limit,
            host_key_checking=self.host_key_checking,
            timeout_s=timeout_s,
            private_data_dir=self.private_data_dir,
        )

    def _chosen_cluster(self) -> Cluster | None:
        """The cluster named with `cluster=`, read from the inventory once; None when none is named."""
        if self.cluster is None:
            return None
        if self._cluster is None:
            from forja import inventory

            listing = inventory.read(inventory.required(self.inventory))
            self._cluster = inventory.cluster(listing, self.cluster)
        return self._cluster

    def _cluster_hosts(self, rank0: bool = False) -> dict[str, Any]:
        """The play's hosts when a cluster is named: its group, or its rank-0 member alone (`rank0`:
        the one that follows a run and has its results, as trainer_run's own wait and fetch do)."""
        chosen = self._chosen_cluster()
        if chosen is None:
            return {}
        return {"forja_hosts": chosen.rank0 if rank0 else chosen.group}

    def _run_hosts(self, states: Sequence[tuple[str, runstate.RunState]]) -> list[str]:
        """The hosts a followed run is recorded on: every member of the named cluster (all of them
        are kept up, and priced), else the hosts that reported it."""
        chosen = self._chosen_cluster()
        return list(chosen.members) if chosen is not None else sorted({h for h, _ in states})

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
        call = self._call()
        # A call streamed by iter_events owns one token for all its playbooks; a plain call gets
        # one per playbook. Either way it is this call's alone.
        token = call.cancelled if call is not None else threading.Event()

        def cancelled() -> bool:
            return token.is_set() or (cancel is not None and cancel.is_set())

        request = self._request(playbook, extravars, timeout_s)
        with self._tracked(token):
            result = run_playbook(request, on_event=self._fan_out(on_event), cancel=cancelled)
        self._raise_if_unparsed(result)
        self._raise_if_stopped(result)
        return result.raise_for_status() if check else result

    def _call(self) -> _Call | None:
        """The `iter_events` call this thread serves for this object (None: a plain call, or another
        Forja's call made from inside it)."""
        call = _CALL.get()
        return call if call is not None and call.forja is self else None

    def _fan_out(self, on_event: Callable[[ev.Event], None] | None = None) -> Callable[[ev.Event], None]:
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
        from forja import inventory

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
        from forja import inventory

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

    # -- the host's lifecycle ---------------------------------------------------------------
    def up(self, extravars: Mapping[str, Any] | None = None) -> RunResult:
        """Create or start the GPU host(s): playbooks/provision.yml (extravars: e.g. another zone)."""
        return self._run("provision.yml", extravars)

    def configure(self, extravars: Mapping[str, Any] | None = None) -> list[RunResult]:
        """GPU stack, Jupyter, then the autostop guard: playbooks/gpu.yml, jupyter.yml and autostop.yml.

        The guard is configured with Jupyter because it watches Jupyter's kernels: a port moved with
        `-e host_contract_jupyter_port=N` moves the agent too."""
        return [self._run(book, extravars) for book in ("gpu.yml", "jupyter.yml", "autostop.yml")]

    def down(self, delete: bool = False, extravars: Mapping[str, Any] | None = None) -> RunResult:
        """Stop (or delete) the GPU host(s): playbooks/teardown.yml."""
        return self._run("teardown.yml", {**(extravars or {}), "forja_teardown_delete": delete})

    def watch(
        self,
        name: str,
        *,
        fallback_zones: Sequence[str],
        budget: Any = None,
        train: Mapping[str, Any] | None = None,
        poll_s: float = 30.0,
        say: Callable[[str], None] = print,
    ) -> str:
        """Keep a run going on a Spot VM with nobody at the keyboard; returns why watching ended.

        A preempted VM is started again in its zone; one whose zone ran out of capacity (or that is
        gone) is made again in the next of `fallback_zones`, configured with the same playbooks, and
        the run is sent again (`train`: how it was sent, as `Forja.train`'s keywords), resuming from
        its newest checkpoint in the bucket. `budget` (`forja.managed.RecoveryBudget`) says when to stop
        trying. One watcher per run: a second raises WatchError naming the first. Every transition
        goes into the run's history. See forja/managed.py for the whole policy.
        """
        from forja import managed

        budget = managed.checked_request(fallback_zones, budget)
        found = self.observe()
        if len(found) != 1:
            raise errors.ConfigError("gcp_instance_name",
                                     f"a managed run needs exactly one VM; found {len(found)}")
        vm = next(iter(found.values()))
        if not vm.exists:
            raise errors.ConfigError("gcp_instance_name",
                                     "the run's VM does not exist; `forja up` creates it")
        state = managed.start_state(name, [vm.zone, *fallback_zones], train)
        return managed.Watcher(self, state, budget, poll_s=poll_s, say=say).run()

    def train_managed(
        self,
        config: str | Path | None = None,
        *,
        fallback_zones: Sequence[str],
        budget: Any = None,
        poll_s: float = 30.0,
        say: Callable[[str], None] = print,
        **train: Any,
    ) -> str:
        """`forja train --managed`: send a run (`train`'s keywords, never waiting), then `watch` it.

        The budget and the zones are checked before anything is sent. Returns why watching ended.
        """
        from forja import managed

        if self.cluster is not None:
            raise errors.ConfigError("--cluster", "a managed run watches one VM; drop --managed to train on "
                                                  "a cluster (its elastic torchrun outlives a lost member)")
        budget = managed.checked_request(fallback_zones, budget)
        sent = {"config": str(config) if config else None, **train, "wait": False}
        result = self.train(**sent)
        say(f"run {result.run_id} started; watching it")
        # what a recovery sends again: the same run resumed, never a second replacement
        how = {k: v for k, v in sent.items() if k not in ("wait", "name", "cancel", "on_event", "replace")}
        return self.watch(result.run_id, fallback_zones=fallback_zones, budget=budget, train=how,
                          poll_s=poll_s, say=say)

    def observe(self, extravars: Mapping[str, Any] | None = None) -> dict[str, contract.InstanceState]:
        """The GPU VM as Compute Engine reports it, by name: status, zone, preemptions.

        Runs playbooks/observe.yml (changes nothing); a managed run's watcher calls it every poll.
        """
        return contract.read_stats(self._run("observe.yml", extravars).artifact_data).instances

    # -- training ---------------------------------------------------------------------------
    def train(
        self,
        config: str | Path | None = None,
        *,
        script: str | Path | None = None,
        args: Sequence[str] = (),
        project: str | Path | None = None,
        name: str | None = None,
        excludes: Sequence[str] = (),
        wait: bool = True,
        fetch: bool = True,
        checkpoints: bool = False,
        timeout_s: float | None = None,
        poll_s: int | None = None,
        procs: int | None = None,
        on_event: Callable[[ev.Event], None] | None = None,
        cancel: threading.Event | None = None,
        extravars: Mapping[str, Any] | None = None,
        backend: str = "vm",
        vertex: VertexOptions | None = None,
        replace: bool = False,
    ) -> TrainResult:
        """Send the trainer (and the project), start the run as a systemd unit, follow it, fetch results.

        `backend="vertex"` runs the built-in trainer on `config` as a Vertex AI custom job instead
        (`vertex`: a `forja.vertex.VertexOptions`; default g2-standard-8 + NVIDIA_L4 x 1, one
        replica, us-central1): the trainer and the config go as a Python package to
        gs://BUCKET/vertex/packages/<hash>/ (once per content), the job's state changes are
        announced, and the checkpoints, logs and model land in gs://BUCKET/vertex/runs/<run>/.
        Ctrl-C, `wait=False` or `timeout_s` stop watching, never the job (`vertex_follow`,
        `vertex_cancel`).

        `procs` is the number of processes per host (torchrun, DDP); None lets the role choose: one
        per GPU, or trainer_run_cpu_procs on a host without one. On a cluster (`Forja(cluster=NAME)`,
        `forja train --cluster NAME`) every member runs elastic torchrun; its rank 0 is followed and
        fetched, and the history records every member as the run's hosts.

        What runs: the built-in trainer on `config`, or your own `script` (a file inside the project,
        run with `args`, e.g. `script="train.py", args=["--lr", "3e-4"]`; the run name then defaults
        to the script's name). Both are checked before anything is sent.

        A `name` is a run's identity: a completed run's name is refused, naming the run. With
        `replace=True` an ended run of that name is kept as `<name>-replaced-<UTC time>` (its history
        row with its events, its folder on the host, its fetched results, its checkpoints in the
        bucket: forja/replace.py) and the new run starts afresh under the name; a running one is
        refused (stop it first).

        Following (`follow()`) has no fixed limit: it lasts as long as the run, hours or days,
        streaming progress. It stops early while the run goes on, and returns status "running" with
        `detached` saying why, when `wait=False` (right after the unit started), when `timeout_s`
        expires (None: -e trainer_run_wait_timeout_s, 0 or unset: no limit), or on
        KeyboardInterrupt / `cancel`. A `cancel` before the unit started cancels the play instead
        (`Cancelled`, history "cancelled").
        """
        if backend != "vm":
            unsupported = {"script": script, "args": list(args), "project": project,
                           "excludes": list(excludes), "procs": procs, "extravars": dict(extravars or {}),
                           "cluster": self.cluster, "replace": replace}
            return self._train_vertex(config, backend, vertex, unsupported, name=name, wait=wait, fetch=fetch,
                                      checkpoints=checkpoints, timeout_s=timeout_s, poll_s=poll_s,
                                      on_event=on_event, cancel=cancel)
        project_dir = Path(project).expanduser().resolve() if project else (
            self.project_dir if self.send_project else None
        )
        if project_dir is not None and not project_dir.is_dir():
            raise errors.ConfigError("project", f"{project} is not a folder")
        plan = _plan_run(config, script, args, project_dir)
        run_id = name or _new_run_id(plan.name_source)
        if not RUN_NAME.match(run_id):
            raise errors.ConfigError(
                "name", f"{run_id!r} must be 1-63 letters, digits, '-' or '_' (first a letter or digit)"
            )
        limit, poll = self._follow_limit(timeout_s), self._poll(poll_s)
        if procs is not None and (isinstance(procs, bool) or not isinstance(procs, int) or procs < 1):
            raise errors.ConfigError("procs", f"{procs!r} is not a number >= 1 (omit it: one per GPU)")
        from forja import inventory

        inventory.required(self.inventory)  # no hosts named: stop before the history records a run
        self._chosen_cluster()  # nor a cluster the inventory does not have
        given = {**self.extravars, **(extravars or {})}
        self._refuse_several_runs(given)
        replaced: _SetAside | None = None
        if name is not None and replace:
            replaced = self._set_aside(name, plan, given)
        elif name is not None:
            self._refuse_a_completed_name(name)
        self.history.start(
            run_id, name=run_id, config_path=str(plan.record_path), config_hash=_config_hash(plan.record_path)
        )
        vars_ = {
            **plan.extravars,
            "trainer_run_name": run_id,
            "trainer_run_project_dir": str(project_dir) if project_dir else "",
            "trainer_run_excludes": list(excludes),
            # The play only starts the unit; forja follows the run itself (follow()), with no fixed limit.
            "trainer_run_wait": False,
            "trainer_run_fetch": False,
            "forja_history_record": False,  # this history records the run itself
            "trainer_run_refuse_completed": True,  # never the old run's results as the new one's
            **({"trainer_run_nproc_per_node": procs} if procs is not None else {}),
            **({"trainer_run_replaced_as": replaced.aside,
                "trainer_run_replaced_bucket_moved": replaced.bucket is not None} if replaced else {}),
            **(extravars or {}),
        }
        try:
            result = self._run("train.yml", vars_, on_event=on_event, cancel=cancel, check=False)
        except KeyboardInterrupt:
            self.history.update(
                run_id, status="cancelled", ended_at=_now(),
                message="interrupted while being set up; the unit may have started (forja status)",
            )
            raise
        except errors.ConfigError:  # the inventory did not parse (read first unless --limit): nothing sent
            if replaced:
                self._put_back(replaced, run_id)
            else:
                self.history.drop(run_id)
            raise
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
            if first is not None and first.task == COMPLETED_TASK:  # refused before anything changed
                self.history.drop(run_id)
                raise errors.ConfigError("name", f"{first.message} Nothing was sent.")
            if replaced and not any(t.task == SET_ASIDE_TASK for t in result.changed_tasks):
                self._put_back(replaced, run_id)  # the host still holds the old run as it was
            else:
                self.history.update(run_id, status="failed", hosts=hosts, ended_at=_now(), message=why)
            result.raise_for_status()
        self.history.update(run_id, hosts=hosts)
        if not wait:
            self.history.record_event(run_id, "detached", reason="detach")
            return TrainResult(run_id, "running", hosts, {}, None, result, detached="detach",
                               unchecked=plan.unchecked)
        followed = self.follow(run_id, fetch=fetch, checkpoints=checkpoints, timeout_s=limit or 0,
                               poll_s=poll, on_event=on_event, cancel=cancel)
        return dataclasses.replace(followed, playbook_result=result, unchecked=plan.unchecked)

    def _refuse_several_runs(self, extravars: Mapping[str, Any]) -> None:
        """`forja train` follows one run; a play over a VM and a cluster (or two VMs) starts one run on
        each (trainer_run groups nodes by cluster). Refused before anything is sent, naming what the
        inventory holds and how to choose. A cluster named (--cluster), a --limit or -e forja_hosts
        is the user's choice and is not second-guessed.
        """
        if self.cluster is not None or self.limit or "forja_hosts" in extravars:
            return
        from forja import inventory

        targets = inventory.run_targets(inventory.read(inventory.required(self.inventory)))
        if len(targets) > 1:
            raise errors.ConfigError(
                "--cluster", f"the inventory holds {len(targets)} runs' hosts: {'; '.join(targets)}. forja "
                "train follows one run: choose a cluster with --cluster NAME, or a VM with --limit HOST. To "
                "train several hosts as one run, give them the same forja_cluster and each its "
                "forja_node_rank in the inventory (the gcp_gpu inventory does it for gcp_instance_count > 1)",
            )

    def _set_aside(self, name: str, plan: _RunPlan, extravars: Mapping[str, Any]) -> _SetAside | None:
        """`--replace`: keep the ended run `name` as `<name>-replaced-<UTC time>` (forja/replace.py):
        its history row and events, fetched results and bucket checkpoints here, its VM folder by the
        role (SET_ASIDE_TASK), so the new run starts with nothing of it. None when there is no such
        run; a running one is refused."""
        from forja import datasets, replace

        try:
            old = self.history.get(name)
        except errors.RunNotFound:
            return None
        if old.ended_at is None:
            raise errors.ConfigError(
                "replace", f"run {name!r} is {old.status}, not ended: stop it first (forja stop {name}), "
                "then --replace it")
        aside = _SetAside(replace.aside_name(name), self._checkpoint_bucket(plan, extravars))
        if aside.bucket is not None:
            try:
                replace.move_bucket_run(self._storage_client(aside.bucket), aside.bucket, name, aside.aside)
            except Exception as exc:  # google-cloud-storage's errors, auth's, the network's: say which
                why = datasets.dataset_module().api_message(exc)  # Google's words, as a push says them
                raise errors.ForjaError(
                    f"--replace could not move run {name!r}'s checkpoints in {aside.bucket} to "
                    f"{aside.aside!r} ({type(exc).__name__}: {why}); nothing was sent. Objects already "
                    f"moved are under {aside.bucket}/{aside.aside}/: move them back, or use a new --name"
                ) from exc
        replace.move_run(self.history, self.results_dir, name, aside.aside)
        return aside

    def _put_back(self, aside: _SetAside, name: str) -> None:
        """Undo `_set_aside` when the play refused the replacement before touching the host."""
        from forja import replace

        self.history.drop(name)
        replace.move_run(self.history, self.results_dir, aside.aside, name)
        if aside.bucket is not None:
            replace.move_bucket_run(self._storage_client(aside.bucket), aside.bucket, aside.aside, name)

    def _checkpoint_bucket(self, plan: _RunPlan, extravars: Mapping[str, Any]) -> str | None:
        """Where the new run mirrors its checkpoints, as the trainer decides it (trainer/mirror.py):
        the config's checkpoint_bucket, else trainer_run_checkpoint_bucket (-e, else the inventory's);
        None when there is none."""
        import yaml

        from forja import datasets

        with contextlib.suppress(OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
            configured = yaml.safe_load(plan.record_path.read_text()).get("checkpoint_bucket")
            if configured:
                return str(configured)
        if "trainer_run_checkpoint_bucket" in extravars:
            return str(extravars["trainer_run_checkpoint_bucket"] or "") or None
        found = datasets.first_host_vars(self).get("trainer_run_checkpoint_bucket")
        return str(found) if found and "{{" not in str(found) else None

    def _storage_client(self, bucket_url: str) -> Any:
        """A Cloud Storage client as `forja data push` makes one (the inventory's emulator, project, key)."""
        from forja import datasets

        where = datasets.settings(self, bucket_url)
        make = datasets.dataset_module().make_client
        return make(where["project"], where["emulator"], where["credentials_file"])

    def _refuse_a_completed_name(self, name: str) -> None:
        """A name is a run's identity on its host (its folder, unit and checkpoints): sending a new
        run under a completed run's name started nothing (a completed run is never re-run) and
        reported the old run's results as the new one's, with its events. Refused, naming the run.

        A run that ended otherwise (preempted, stopped, failed, diverged) may be sent again under
        its name: that resumes it from its newest checkpoint, as the trainer always does.
        """
        with contextlib.suppress(errors.RunNotFound):
            old = self.history.get(name)
            if old.status == "completed":
                where = f" on {', '.join(old.hosts)}" if old.hosts else ""
                when = old.ended_at or old.started_at
                raise errors.ConfigError(
                    "name", f"run {name!r} already completed ({when}{where}); a new run needs a new --name "
                    f"(e.g. {name}-2), or --replace to keep the old one as {name}-replaced-<time> and start "
                    f"afresh. Its results stay under its name: forja runs, forja cost --run {name}, "
                    f"forja fetch {name}",
                )

    def follow(
        self,
        name: str,
        *,
        fetch: bool = True,
        checkpoints: bool = False,
        timeout_s: float | None = None,
        poll_s: int | None = None,
        on_event: Callable[[ev.Event], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> TrainResult:
        """Follow a started run until it ends, however long, then fetch its results and record them.

        Polls the hosts through playbooks/train_wait.yml, one window of `follow_window_s` after
        another, streaming `TrainProgress` events and writing progress into the history: no fixed
        clock ends it. It returns status "running" with `detached` set, the run going on, when
        `timeout_s` expires (None: -e trainer_run_wait_timeout_s; 0: no limit) or on
        KeyboardInterrupt / `cancel`. A run that ends other than completed raises `PlaybookFailed`
        after the history took the status its host reported (failed, preempted, stopped).
        """
        if not RUN_NAME.match(name):
            raise errors.ConfigError("name", f"{name!r} is not a run name")
        limit, poll = self._follow_limit(timeout_s), self._poll(poll_s)
        deadline = None if limit is None else time.monotonic() + limit
        progress = _ProgressRecorder(self.history, name)

        def both(event: ev.Event) -> None:
            progress(event)
            if on_event is not None:
                on_event(event)

        last: RunResult | None = None
        states: list[tuple[str, runstate.RunState]] = []
        while True:
            window = self.follow_window_s
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._detached(name, "timeout", states, last)
                window = max(1, min(window, math.ceil(left)))
            # trainer_run_fetch false: fetch() lists the results itself; the wait need not hash them.
            extravars = {"trainer_run_name": name, "trainer_run_wait_timeout_s": window,
                         "trainer_run_poll_s": poll, "trainer_run_fetch": False,
                         **self._cluster_hosts(rank0=True)}
            try:
                last = self._run("train_wait.yml", extravars, on_event=both, cancel=cancel, check=False)
            except KeyboardInterrupt:
                return self._detached(name, "interrupted", states, last)
            if last.status in ("canceled", "timeout"):
                return self._detached(name, "interrupted", states, last)
            states = [(h, s) for h, s in contract.read_stats(last.artifact_data).runs if s.run == name]
            rank0 = _rank0(states)
            if rank0 is None:
                last.raise_for_status()
                where = ", ".join(sorted(last.stats)) or "no host"
                raise errors.RunNotFound(f"run {name!r} is on none of the hosts ({where}); see forja status")
            if rank0.status == "unknown":
                where = ", ".join(h for h, _ in states)
                raise errors.RunNotFound(f"run {name!r} is not on {where}; see `forja status`")
            if rank0.final or not last.ok:
                return self._finish(name, states, rank0, last, fetch=fetch, checkpoints=checkpoints)
            self.history.record_host_run(rank0, hosts=self._run_hosts(states))  # one started elsewhere

    def _train_vertex(
        self, config: str | Path | None, backend: str, options: VertexOptions | None,
        unsupported: dict[str, Any], *, on_event: Callable[[ev.Event], None] | None = None, **how: Any,
    ) -> TrainResult:
        """`train(backend="vertex")`: forja/vertex.py does the work (its docstring says why so)."""
        from forja import vertex

        if backend != "vertex":
            raise errors.ConfigError("backend", f"{backend!r} is not vm (the inventory's VM) or vertex")
        return vertex.train(self, config, options=options, unsupported=unsupported,
                            emit=self._fan_out(on_event), **how)

    def vertex_follow(
        self,
        name: str,
        options: VertexOptions | None = None,
        *,
        fetch: bool = True,
        timeout_s: float | None = None,
        poll_s: float | None = None,
        on_event: Callable[[ev.Event], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> TrainResult:
        """Follow a run sent with `forja train --backend vertex` until its Vertex AI job ends, saying
        each replica's new log lines (from Cloud Logging) as they come, then fetch its logs, summary
        and model from the bucket. The job is found by the run's name in the project
        (FORJA_GCP_PROJECT) and region (--region). Ctrl-C or a timeout stop watching, never the job."""
        from forja import vertex

        return vertex.follow_run(self, name, options or vertex.VertexOptions(), fetch=fetch,
                                 timeout_s=timeout_s, poll_s=poll_s, emit=self._fan_out(on_event),
                                 cancel=cancel)

    def vertex_cancel(self, name: str, options: VertexOptions | None = None) -> dict[str, Any]:
        """Cancel the Vertex AI job of a run sent with `forja train --backend vertex`, found by the
        run's name in the project (FORJA_GCP_PROJECT) and region (--region); returns the job once
        Vertex says CANCELLED (or after a minute, as it is then). A job that ended is left alone."""
        from forja import vertex

        return vertex.cancel_run(self, name, options or vertex.VertexOptions())

    def _finish(
        self,
        name: str,
        states: Sequence[tuple[str, runstate.RunState]],
        rank0: runstate.RunState,
        last: RunResult,
        *,
        fetch: bool,
        checkpoints: bool,
    ) -> TrainResult:
        """Record how a followed run ended (the host's status, never a clock's), fetch it, report it."""
        hosts = self._run_hosts(states)
        self.history.record_host_run(rank0, hosts=hosts)  # adds a run started outside forja
        summary: dict[str, Any] = dict(rank0.summary or {})
        fields: dict[str, Any] = {"status": rank0.status, "hosts": hosts, **summary_fields(summary)}
        artifact: Path | None = None
        if rank0.status == "completed" and fetch:
            self.fetch(name, checkpoints=checkpoints)
            fetched, artifact = self._read_results(name)
            summary = fetched or summary
        if not last.ok:
            first = (last.unreachable or last.failed_tasks or [None])[0]
            fields["message"] = f"{first.host}: {first.task}: {first.message}" if first else f"rc {last.rc}"
        if rank0.final:
            fields["ended_at"] = self.history.get(name).ended_at or _now()
        self.history.update(name, **fields)
        if rank0.status == "diverged" and last.failed_tasks:
            first = last.failed_tasks[0]
            raise errors.RunDiverged(first.host, first.task, first.message, playbook=last.playbook)
        last.raise_for_status()
        return TrainResult(name, rank0.status, hosts, summary, artifact, last)

    def _detached(
        self, name: str, reason: str, states: Sequence[tuple[str, runstate.RunState]], last: RunResult | None
    ) -> TrainResult:
        """Stop following a run that goes on: the history keeps "running" and notes why."""
        with contextlib.suppress(errors.RunNotFound):
            self.history.record_event(name, "detached", reason=reason)
        hosts = (self._run_hosts(states) if states else []) or (sorted(last.stats) if last else [])
        return TrainResult(name, "running", hosts, {}, None, last, detached=reason)

    def _follow_limit(self, timeout_s: float | None) -> float | None:
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

    def _poll(self, poll_s: int | None) -> int:
        value = poll_s if poll_s is not None else self.extravars.get("trainer_run_poll_s", POLL_S)
        try:
            poll = int(value)
        except (TypeError, ValueError):
            poll = 0
        if poll < 1:
            raise errors.ConfigError("trainer_run_poll_s", f"{value!r} is not a whole number of seconds >= 1")
        return poll

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

    def status(self, name: str | None = None) -> list[TrainStatus]:
        """The state of one run (or every run) on every host, as the hosts report it.

        Updates the history: runs that ended take their final status, and runs the history does
        not know (started by site.yml or another controller) are added.
        """
        pairs = self._read_states({"trainer_run_status_runs": [name] if name else []})
        self._sync_history(pairs)
        return [_status(host, state) for host, state in pairs]

    def live(
        self, run: str | None = None, urls: Sequence[str] | None = None, timeout: float = 2.0
    ) -> list[live.LiveSample]:
        """The live metrics of the runs that serve them: step, loss, throughput, ETA, cost, GPU, CPU.

        Reads each run's Prometheus endpoint once, at `urls` (default: 127.0.0.1 at each of the host
        contract's metrics ports, where the tunnel of `forja tunnel` forwards them); `run` keeps that
        run only. No playbook runs: the numbers come straight from the runs (`forja.live`), so it can
        be called every second. Nothing serving is an empty list.
        """
        chosen = list(urls) if urls else [live.live_url(port) for port in live.metrics_ports()]
        return [sample for sample in live.scrape_any(chosen, timeout) if run is None or sample.run == run]

    def logs(self, name: str, lines: int = 50) -> dict[str, str]:
        """The training unit's journal per host."""
        pairs = self._read_states({"trainer_run_status_runs": [name],
                                   "trainer_run_journal_lines": int(lines)})
        return {host: state.journal for host, state in pairs}

    def follow_logs(
        self, name: str, lines: int = 50, poll_s: int | None = None, cancel: threading.Event | None = None
    ) -> Iterator[tuple[str, str]]:
        """Yield (host, new journal lines) as the run writes them, each line once, until it ends.

        Starts with the last `lines` lines, then reads only what follows each host's journal cursor,
        so it stays cheap for runs of days. Ends when the rank-0 host reports a final status, or
        when `cancel` is set (Ctrl-C in `forja logs -f`). A run no host knows raises RunNotFound.
        """
        if not RUN_NAME.match(name):
            raise errors.ConfigError("name", f"{name!r} is not a run name")
        poll = self._poll(poll_s)
        stop = cancel or threading.Event()
        cursors: dict[str, str] = {}
        while not stop.is_set():
            try:
                request = {"trainer_run_status_runs": [name], "trainer_run_journal_lines": int(lines),
                           "trainer_run_journal_after": dict(cursors)}
                pairs = self._read_states(request, cancel=stop)
            except errors.Cancelled:
                return
            known = [(h, s) for h, s in pairs if s.status != "unknown"]
            if not known:
                raise errors.RunNotFound(f"run {name!r} is on none of the hosts; see `forja status`")
            for host, state in known:
                if state.journal:
                    yield host, state.journal
                if state.journal_cursor:
                    cursors[host] = state.journal_cursor
            rank0 = _rank0(known)
            if rank0 is None or rank0.final:
                self._sync_history(known)
                return
            stop.wait(poll)

    def fetch(self, name: str, dest: str | Path | None = None, checkpoints: bool = False) -> RunResult:
        """Copy a run's results (and checkpoints) to `dest` (default: the project's forja-runs/<run>)."""
        if not RUN_NAME.match(name):
            raise errors.ConfigError("name", f"{name!r} is not a run name")
        target = Path(dest).expanduser().resolve() if dest else self.results_dir(name)
        result = self._run(
            "train_fetch.yml",
            {"trainer_run_name": name, "trainer_run_fetch_dir": str(target),
             "trainer_run_fetch_checkpoints": checkpoints, **self._cluster_hosts(rank0=True)},
        )
        summary, artifact = self._read_results(name, target)
        with contextlib.suppress(errors.RunNotFound):
            self.history.update(name, artifact_dir=str(artifact or target), **summary_fields(summary))
        return RunResult(**{**result.__dict__, "artifact_dir": artifact or target})

    def model_push(
        self,
        run: str,
        repo: str,
        token_file: str | Path | None = None,
        private: bool | None = None,
        folder: str | Path | None = None,
        endpoint: str | None = None,
    ) -> HubPush:
        """Push a run's exported model (model.safetensors + model.json) to a Hugging Face Hub model repo.

        The model is the one `forja fetch RUN` (or `forja train`) brought to this machine, in the run's
        results (`model/`), or the folder given. This machine uploads it, not the VM: the token never
        leaves it. The token is read from --token-file (mode 600), else HF_TOKEN, else the one `hf auth
        login` saved; never from the command line, never logged. The repo is created when missing
        (--private makes a new one private). A token that cannot write to the repo is an error naming
        the repo and how to get one that can, before anything is uploaded when the Hub says so up front.
        The Hub is HF_ENDPOINT when set (a stand-in for tests: forja_sandbox/hub_standin.py).
        """
        from forja.hub import push_model, read_token

        where = Path(folder).expanduser() if folder is not None else self._model_folder(run)
        return push_model(where, repo, token=read_token(token_file), private=private, endpoint=endpoint)

    def _model_folder(self, run: str) -> Path:
        """The exported model in a run's fetched results: the folder the history recorded (the rank-0
        host's), else the default results folder's host subfolders (as `fetch` lays them out)."""
        places: list[Path] = []
        with contextlib.suppress(errors.RunNotFound):
            recorded = self.history.find(run).artifact_dir
            if recorded:
                places.append(Path(recorded))
        places.append(self.results_dir(run))
        for place in places:
            _, host_dir = self._read_results(run, place)
            for candidate in (place, host_dir):
                if candidate is not None and (candidate / "model" / "model.json").is_file():
                    return candidate / "model"
        if not any(place.is_dir() for place in places):
            raise errors.RunNotFound(
                f"no results of run {run!r} on this machine (looked in {', '.join(map(str, places))}); "
                f"fetch them with `forja fetch {run}`"
            )
        raise errors.ConfigError(
            "run", f"{run} has no exported model in its results ({', '.join(map(str, places))}): the run "
            "did not complete, or export_model was off (export it on the host: python -m trainer export "
            f"RUN_DIR), then `forja fetch {run}`"
        )  # fmt: skip

    def stop(self, name: str) -> RunResult:
        """Stop a run's unit (it checkpoints on SIGTERM) and keep it from resuming at boot."""
        if not RUN_NAME.match(name):
            raise errors.ConfigError("name", f"{name!r} is not a run name")
        result = self._run("train_stop.yml", {"trainer_run_name": name})
        with contextlib.suppress(errors.RunNotFound):
            self.history.update(name, status="stopped", ended_at=_now())
        return result

    def push_data(
        self,
        path: str | Path,
        name: str | None = None,
        bucket: str | None = None,
        *,
        threads: int = 8,
        excludes: Sequence[str] = (),
        detect_secrets: bool = True,
        retry_deadline_s: float = 300.0,
        on_progress: Callable[[Any], None] | None = None,
        to_host: bool = False,
    ) -> Any:
        """Push a dataset folder to the project's bucket as gs://BUCKET/datasets/NAME (NAME: the folder's).

        Content-addressed: each distinct file goes to gs://BUCKET/datasets/blobs/<sha256> once, so a second
        push sends only what changed and an interrupted push resumes by skipping what is there. Uploads run
        in parallel (large files resumable, in chunks), each checked against its CRC32C; the manifest (path,
        size, SHA-256, CRC32C per file) is written last, so a partial push never looks complete. Secrets are
        left out as in the bundle (host_contract_send_excludes, plus the content check). The bucket is
        --bucket, else the inventory's dataset_bucket or gcp_bucket_name. `on_progress` gets a Progress
        (phase, files and bytes done and in all) as it goes; no clock of forja's stops a long push, only one
        blob left unanswered past `retry_deadline_s` of retries does (push again: what was sent is kept).
        Runs on the hosts read it as gs://BUCKET/datasets/NAME, or staged on their disk (roles/dataset).
        Without a bucket (or with --to-host), the folder goes straight to <host_contract_data_dir>/NAME on
        the VMs (rsync over the inventory's SSH, each file's SHA-256 checked there; a RunResult is returned).
        """
        from forja import datasets

        return datasets.push(self, path, name, bucket, threads=threads, excludes=excludes,
                             detect_secrets=detect_secrets, retry_deadline_s=retry_deadline_s,
                             on_progress=on_progress, direct=to_host)

    def runs(self, limit: int = 50, status: str | None = None, sync: bool = False) -> list[Any]:
        """The run history, newest first. `sync` first reads every run on the hosts (`status()`), so
        runs started elsewhere are added and ended ones take their final status."""
        if sync:
            self.status()
        return self.history.list(limit=limit, status=status)

    def hosts(self, pattern: str = "forja_gpu") -> list[InventoryHost]:
        """The inventory's hosts in a group (or "all"), with their connection variables and record.

        Values are plain (no ansible-core "unsafe" markers) and never include cached facts; see
        `forja.inventory`, the one reader of the inventory.
        """
        from forja import inventory

        return inventory.hosts(inventory.required(self.inventory), pattern)

    def tunnel(
        self,
        host: str | None = None,
        local_port: int | None = None,
        *,
        gcloud: bool = False,
        show_token: bool = False,
        start: bool = False,
    ) -> TunnelPlan:
        """The SSH tunnel to a host's Jupyter and the URL to paste into Colab (`TunnelPlan.open()` runs it).

        `host` is an inventory host of forja_gpu (None: the first). Both ends use the port the host's
        Jupyter serves, as the role publishes it (`jupyter()`): Colab needs them equal.
        A stopped VM raises `HostStopped` (exit 6) saying since when and why; `start=True` starts it
        first (playbooks/provision.yml, as `up()` does), announced to the listeners as `HostStarting`.
        """
        from forja import inventory

        chosen = self.gpu_host(host)
        if chosen.stopped and start:
            self._fan_out()(ev.HostStarting(0, host=chosen.name, status=chosen.status or "stopped",
                                            playbook="provision.yml"))
            self.up()
            chosen = self.gpu_host(host)
        if chosen.stopped:
            raise inventory.stopped_error(chosen)
        connection = self.jupyter(chosen.name, gcloud=gcloud)[chosen.name]
        return connection.plan(chosen.name, local_port, show_token)

    def keep_tunnel(
        self,
        host: str | None = None,
        local_port: int | None = None,
        *,
        gcloud: bool = False,
        retry_s: float = 10.0,
        say: Callable[[str], None] = print,
        stop: threading.Event | None = None,
        plan: TunnelPlan | None = None,
    ) -> None:
        """Hold the Colab tunnel open across stop/start, preemption and zone moves, on one local port.

        The first plan must work (a wrong --host or a stopped VM is said at once). After that, when
        ssh ends (the VM went away), the tunnel is planned again every `retry_s` seconds, each try
        announced, until the VM answers again: at its new address, in its new zone; the local port
        and the token stay the same (jupyter_colab gives a new VM the controller's token), so Colab
        only needs the cell run again. Returns when `stop` is set (Ctrl-C ends it in the CLI).
        `plan`: the first plan, when the caller made it already (to show it).
        """
        stop = stop or threading.Event()
        plan = plan or self.tunnel(host, local_port, gcloud=gcloud)
        local_port = plan.local_port
        while not stop.is_set():
            say(f"tunnel open on 127.0.0.1:{local_port} to {plan.host}")
            rc = plan.open(stop)
            if stop.is_set():
                return
            say(f"tunnel to {plan.host} closed (ssh exit {rc}); opening it again when the VM answers")
            while not stop.wait(retry_s):
                try:
                    plan = self.tunnel(host or plan.host, local_port, gcloud=gcloud)
                    break
                except errors.ForjaError as exc:
                    say(f"not yet ({exc.message.splitlines()[0][:160]}); next try in {retry_s:.0f} s")

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

    def jupyter(
        self, host: str | None = None, *, gcloud: bool = False
    ) -> dict[str, contract.JupyterConnection]:
        """How to reach each host's Jupyter from Colab, as the jupyter_colab role publishes it.

        Runs playbooks/jupyter_connection.yml (changes nothing on the host): the port is the one the
        host's Jupyter serves, the tunnel command ssh along Ansible's own path to the host (through
        IAP in iap mode, as the firewall admits), or gcloud compute ssh when `gcloud`; the token is
        copied to this machine again, never published.
        """
        extravars: dict[str, Any] = {"forja_hosts": host} if host else {}
        if gcloud:
            extravars["jupyter_colab_tunnel_style"] = "gcloud"
        result = self._run("jupyter_connection.yml", extravars)
        found = contract.read_stats(result.artifact_data).jupyter
        if host and host not in found:
            raise errors.ConfigError("--host", f"{host} has no Jupyter connection; run `forja configure`")
        return found

    def cost(
        self,
        instances: Sequence[Mapping[str, Any]] | None = None,
        *,
        prices: str | Path | None = None,
        cap: float | None = None,
        warn: float = 0.8,
        scope: str = "instance",
        now: str | datetime | None = None,
    ) -> CostReport:
        """Each instance's hourly rate, uptime, spend, monthly figure if left running, and disk cost.

        Instances are the inventory's GCP hosts (their records), or `instances` (dicts shaped like
        those records: offline reports, tests). `prices` is a YAML merged over the built-in table;
        `cap` checks spend against a cap in USD per 'instance' or for the 'project' (`scope`),
        warning at the `warn` fraction of it; `now` computes as of an RFC 3339 time.
        """
        from forja import inventory
        from forja.cost.budget import Budget, check_project, check_units
        from forja.cost.cluster import cluster_lines, unit_lines
        from forja.cost.prices import PriceError, load_prices
        from forja.cost.spend import cost_report, parse_time

        if scope not in ("instance", "project"):
            raise errors.ConfigError("scope", f"{scope!r}: use 'instance' or 'project'")
        try:
            table = load_prices(Path(prices) if prices else None)
            budget = Budget(cap, warn) if cap is not None else None
        except (PriceError, ValueError) as exc:
            raise errors.ConfigError("prices/cap/warn", str(exc)) from exc
        moment = parse_time(now) if now else datetime.now(timezone.utc)
        skipped: list[str] = []
        own: list[str] = []
        if instances is None:
            raw, own, skipped = inventory.gcp_instances(inventory.required(self.inventory))
        else:
            raw = [dict(i) for i in instances]
        try:
            lines = cost_report(raw, table, moment)
        except (PriceError, ValueError) as exc:
            raise errors.ConfigError("instances/prices", str(exc)) from exc
        checks: list[Any] = [None] * len(lines)
        project = None
        if budget is not None and scope == "instance":  # a cluster's members: one check of them all
            # cost_report keeps the records' order, so unit_lines pairs each record with its line
            found = check_units(budget, [unit for _, unit in unit_lines(raw, lines)])
            checks = [found[line.name] for line in lines]
        elif budget is not None:
            project = check_project(budget, lines)
        return CostReport(table.date, moment, lines, checks, project, skipped, cluster_lines(raw, lines), own)

    def rate(
        self, machine_type: str, zone: str, *, spot: bool = False, prices: str | Path | None = None
    ) -> Any:
        """The hourly rate of one machine type in one zone (on demand, or Spot), with its basis."""
        from forja.cost.prices import PriceError, load_prices
        from forja.cost.spend import rate_of

        try:
            return rate_of(machine_type, zone, load_prices(Path(prices) if prices else None), spot)
        except (PriceError, ValueError) as exc:
            raise errors.ConfigError("machine_type/zone/prices", str(exc)) from exc

    def run_cost(
        self,
        run_id: str,
        instances: Sequence[Mapping[str, Any]] | None = None,
        *,
        prices: str | Path | None = None,
        now: str | datetime | None = None,
    ) -> Any:
        """One run's cost from its history and fetched results: setup, recovery, compute, data wait,
        evaluation, checkpoints and the rest, the VM's time down, the disk (see forja/cost/run.py).

        The VMs' rate and disks are their instances' (`instances`, else the inventory when one is
        named): the run's hosts and every other member of their cluster ("2 × g2-standard-24");
        without one, the rate the run itself used (its config's price_per_hour) and no disk.
        """
        from forja.cost.cluster import groups, with_members
        from forja.cost.prices import PriceError, load_prices
        from forja.cost.run import RunFiles, run_cost
        from forja.cost.spend import parse_time

        record = self.history.find(run_id)
        moment = parse_time(now) if now else datetime.now(timezone.utc)
        found = [dict(i) for i in instances] if instances is not None else self._instances_if_named()
        mine = with_members(found, record.hosts)
        units = groups(found)
        if not mine and len(units) == 1 and not record.hosts:  # one VM (or one cluster): the run's
            mine = units[0][1]
        # The folder the history recorded; a run recorded without one (site.yml's, found on a host)
        # may still have been fetched to the default place since (`forja fetch RUN`).
        folder = record.artifact_dir or self._read_results(record.run_id)[1]
        try:
            table = load_prices(Path(prices) if prices else None)
            return run_cost(record, self.history.events(record.run_id), RunFiles.read(folder),
                            table, moment, mine)
        except (PriceError, ValueError) as exc:
            raise errors.ConfigError("run/instances/prices", str(exc)) from exc

    def estimate(
        self,
        config: str | Path,
        instances: Sequence[Mapping[str, Any]] | None = None,
        *,
        prices: str | Path | None = None,
    ) -> Any:
        """What sending `config` will cost: steps x seconds per step measured by the newest earlier run
        of that config (or of the same model, batch and precision), plus its setup and evaluation, at
        the VMs' hourly rate, plus their disks. `forja train` shows it before sending.

        The VMs are `instances` or the inventory's (their records), every member of a cluster counted
        ("2 × g2-standard-24"); with no earlier run the estimate has the rate and no time (the run it
        precedes measures it).
        """
        from forja import inventory
        from forja.cost.cluster import fleet_rate
        from forja.cost.estimate import estimate
        from forja.cost.prices import PriceError, load_prices
        from forja.cost.spend import Instance, disk_month_usd

        path = Path(config).expanduser()
        if not path.is_file():
            raise errors.ConfigError("config", f"{config} is not a file; give a trainer config YAML")
        found = [dict(i) for i in instances] if instances is not None else (
            inventory.gcp_instances(inventory.required(self.inventory))[0])
        chosen = self._chosen_cluster() if instances is None else None
        if chosen is not None:  # the run keeps its cluster up, not the inventory's other VMs
            found = [i for i in found if i.get("name") in chosen.members]
        if not found:
            raise errors.ConfigError("inventory", "no host with a machine_type and zone to price")
        try:
            table = load_prices(Path(prices) if prices else None)
            vms = [Instance.from_mapping(i) for i in found]
            rate = fleet_rate(vms, table)
            disk = disk_month_usd(vms, table)
        except (PriceError, ValueError) as exc:
            raise errors.ConfigError("instances/prices", str(exc)) from exc
        return estimate(path, self.history, rate.usd_per_hour, rate.what,
                        disk if any(vm.disks for vm in vms) else None, table.hours_per_month)

    def ui(
        self,
        *,
        port: int = 8877,
        token: str | None = None,
        metrics_urls: Sequence[str] | None = None,
        say: Callable[[str], None] = print,
    ) -> None:
        """Serve a local web dashboard until Ctrl-C: the runs of the history with their status, cost,
        preemptions and zone moves; each serving run's live metrics as charts (through the tunnel, as
        `forja top` reads them); each run's cost part by part and its final plots; the VMs' state and
        spend. It listens on 127.0.0.1 only and asks for a token, as Jupyter does: a random one per
        start (or `token`, or $FORJA_UI_TOKEN), in the URL printed once (`say`); the page then keeps
        it in the tab (sessionStorage, never a cookie). `port` 0 takes any free port; `metrics_urls`
        replaces the metrics ports' URLs.
        """
        from forja.ui.server import serve

        serve(self, port=port, token=token, metrics_urls=metrics_urls, say=say)

    def _instances_if_named(self) -> list[dict[str, Any]]:
        """The inventory's priced hosts when an inventory is named, else none (history needs none)."""
        from forja import inventory

        if not self.inventory:
            return []
        return inventory.gcp_instances(self.inventory)[0]

    # -- helpers ------------------------------------------------------------------------------
    def results_dir(self, run_id: str) -> Path:
        return self.project_dir / "forja-runs" / run_id

    def _read_states(
        self, extravars: Mapping[str, Any], cancel: threading.Event | None = None
    ) -> list[tuple[str, runstate.RunState]]:
        """(host, state) of runs as the status play publishes them (set_stats: the typed contract)."""
        result = self._run("train_status.yml", extravars, cancel=cancel)
        return contract.read_stats(result.artifact_data).runs

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

    def _sync_history(self, pairs: Sequence[tuple[str, runstate.RunState]]) -> None:
        """Bring the history up to date with what the hosts report (rank 0 speaks for a run)."""
        hosts: dict[str, list[str]] = {}
        for host, state in pairs:
            if state.status != "unknown":
                hosts.setdefault(state.run, []).append(host)
        for run, run_hosts in hosts.items():
            rank0 = _rank0([(h, s) for h, s in pairs if s.run == run])
            if rank0 is not None:
                self.history.record_host_run(
                    rank0, hosts=sorted(run_hosts), message="found on the hosts (not started by this forja)"
                )


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
        with contextlib.suppress(errors.RunNotFound):  # a run started elsewhere is added when it ends
            self.history.update(self.run_id, **fields)


def _rank0(pairs: Sequence[tuple[str, runstate.RunState]]) -> runstate.RunState | None:
    """The state that speaks for a run: its rank-0 host's (the one that writes the summary)."""
    # A host that does not know the run (status "unknown", rank 0 by default) speaks only when none does.
    ranked = sorted(pairs, key=lambda pair: (pair[1].status == "unknown", pair[1].node_rank, pair[0]))
    return ranked[0][1] if ranked else None


def _status(host: str, state: runstate.RunState) -> TrainStatus:
    return TrainStatus(
        host=host,
        run=state.run,
        status=state.status,
        unit_state=f"{state.active_state}/{state.sub_state}",
        step=state.step,
        total_steps=state.total_steps,
        loss=state.loss,
        exit_status=state.exit_status,
        restarts=state.restarts,
        node_rank=state.node_rank,
        summary=state.summary,
        journal=state.journal,
        nnodes=state.nnodes,
        elastic_restarts=state.elastic_restarts if state.elastic is not None else None,
    )


def _now() -> str:
    from forja.history import now

    return now()
