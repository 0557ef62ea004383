"""What runs a sweep's trials: the inventory's VMs (forja's own verbs), or trainer processes here.

Why a seam: the sweep's loop (`forja.sweep.Driver`) decides; a runner only sends a trial's run,
looks at it and stops it, the way `forja train`, `forja status` and `forja stop` do. On the VMs
that is exactly those verbs (`forja.training.train`, the status play, `forja.following.stop`), so a
trial is an ordinary run in every other command. Here (`LocalRunner`) it is the built-in trainer as
a child process, the same program the VM's unit runs: a CPU-sized sweep needs no VM, and the check
tier drives the whole loop with real trainer runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from forja import cost_report, errors, lifecycle, managed
from forja.runs import config_hash, now

#: Run statuses a queue reports for a run that waits its turn (the on-VM queue's words).
WAITING = ("queued", "pending", "waiting")
#: What a look says of a trial that is not over: still to run, running, not seen, or preempted (it resumes).
GOES_ON = ("queued", "running", "unknown", "preempted")
#: How long a trial sent ahead may wait in the VM's queue: the whole of the trial before it (the
#: queue's own 10-minute default is for a run nobody watches; the sweep watches each of its trials).
QUEUE_WAIT_S = 7 * 24 * 3600
#: Journal lines asked of each trial per look: the progress lines since the last look (one per
#: log_every_steps; a look every 15 s), so the pruner sees every step logged, not only the newest.
JOURNAL_LINES = 100
#: How long a trial a recovery brought back may still say "preempted" (its unit starting again on
#: the restarted VM) before it is sent again.
RESUME_GRACE_S = 300.0
#: A trainer progress line (trainer.metrics.progress_line): "step 120/400 | loss 0.3120 | ...".
PROGRESS = re.compile(r"\bstep (\d+)/\d+ \| loss ([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))")


@dataclass(frozen=True)
class Look:
    """One trial's run as a runner sees it now."""

    #: queued, running, completed, failed, diverged, preempted, stopped, cancelled or unknown.
    status: str
    step: int | None = None
    #: The run's newest metric line (loss, cost_usd, ...).
    last: dict[str, Any] = field(default_factory=dict)
    #: The run's summary once it ended (trainer.summary: eval_loss, accuracy, cost_usd, ...).
    summary: dict[str, Any] | None = None
    #: Of which training: the trainer's own count so far (its newest metric line's, its summary's once
    #: it ended), a part of the run's cost and a floor of it (docs/cost-definition.md).
    training_usd: float | None = None
    reason: str = ""
    #: The metric lines seen, oldest first: all of them here, the journal's progress lines since the
    #: last look on a VM (`series_of`); the pruner compares trials at the same steps, so each is a report.
    series: tuple[dict[str, Any], ...] = ()
    #: The run's cost once it ended and was settled (forja.cost_report.settled_cost): the figure every
    #: view shows. None while it goes on, and for a run with no rate known.
    cost_usd: float | None = None


@dataclass(frozen=True)
class Recovery:
    """What a runner did about a preempted trial on one look."""

    #: The trial was brought back (a restart, a zone move, or sent again): one recovery, counted once.
    resumed: bool = False
    #: Why it cannot be brought back (the trial is told FAIL with it); empty otherwise.
    why: str = ""


#: Nothing done yet: the VM is still going down or coming back (the next look asks again).
WAIT = Recovery()


class TrialRunner(Protocol):
    #: Trials sent beyond the free slots, to wait in the VM's queue (0 without one).
    ahead: int

    def slots(self) -> int:
        """How many trials may run at once: one per GPU."""

    def describe(self) -> str:
        """Where the trials run, for people."""

    def start(self, run: str, config: Path, slot: int) -> None:
        """Send the trial's run (its config already written); a ForjaError when it could not be sent."""

    def adopt(self, run: str, config: Path, slot: int) -> None:
        """Take over a run an earlier session of the sweep sent (its config and slot as kept then)."""

    def look(self, runs: Sequence[str]) -> dict[str, Look]:
        """Each run's state now (one look for all of them)."""

    def stop(self, run: str) -> Look | None:
        """Stop a run (a pruned trial): it checkpoints and ends; how it ended (its cost), when known."""

    def recover(self, run: str, slot: int) -> Recovery:
        """Bring a preempted run back from its own checkpoint, wait for its VM, or say why it cannot be."""

    def model_of(self, run: str) -> Path | None:
        """Where the run's exported model is on this machine (fetched if need be), or None."""


def training_of(last: Mapping[str, Any] | None, summary: Mapping[str, Any] | None) -> float | None:
    """The trainer's own count so far (its ``cost_usd``): its summary's when it ended, else its newest
    metric line's. A part of the run's cost, never the run's cost (forja/cost/run.py says why)."""
    for source in (summary, last):
        value = (source or {}).get("cost_usd")
        if isinstance(value, int | float):
            return float(value)
    return None


# -- here: trainer processes ---------------------------------------------------------------------
class LocalRunner:
    """Trials as `python -m trainer train` children of this process, each in its run folder under
    `root`; `parallel` at once (CPU cores are the "GPUs" here). The session's history records each run,
    so `forja runs` lists them beside the VMs' runs, each priced at its end at its config's
    price_per_hour (no VM: no disk), as every view prices a run."""

    ahead = 0

    def __init__(self, root: Path, *, parallel: int = 1, project: Path | None = None,
                 session: Any = None) -> None:
        self.root, self.parallel, self.project, self.session = root, parallel, project, session
        self.history = session.history if session is not None else None
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.configs: dict[str, Path] = {}
        #: Runs this runner stopped (pruned): their SIGTERM is the sweep's, not a preemption.
        self.stopped: set[str] = set()

    def slots(self) -> int:
        return self.parallel

    def describe(self) -> str:
        return "this machine"

    def folder(self, run: str) -> Path:
        return self.root / run

    def start(self, run: str, config: Path, slot: int) -> None:
        self.configs[run] = config
        if self.history is not None:  # the run starts when forja records it, before the trainer starts
            self.history.start(run, name=run, config_path=str(config), config_hash=config_hash(config),
                               artifact_dir=str(self.folder(run)))
        self._launch(run)

    def _launch(self, run: str) -> None:
        """The trainer on the run's config and folder: a fresh start, or a resume from its checkpoints."""
        out = self.folder(run)
        out.mkdir(parents=True, exist_ok=True)
        (out / "exit_code").unlink(missing_ok=True)
        env = {**os.environ, "FORJA_RUN": run}
        if self.project is not None:
            env["FORJA_PROJECT_DIR"] = str(self.project)
        with open(out / "train.log", "ab") as log:  # the child holds its own copy of the descriptor
            self.children[run] = subprocess.Popen(
                [sys.executable, "-m", "trainer", "train", "--config", str(self.configs[run]),
                 "--out", str(out)],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.project or out,
            )

    def adopt(self, run: str, config: Path, slot: int) -> None:
        """Nothing to take over: a trainer child ends with the session that started it (the look says so)."""

    def look(self, runs: Sequence[str]) -> dict[str, Look]:
        return {run: self._look(run) for run in runs}

    def _look(self, run: str) -> Look:
        from trainer.exit_codes import COMPLETED

        out = self.folder(run)
        series = tuple(_lines(out / "metrics.jsonl"))
        last = series[-1] if series else {}
        step = last.get("step") if isinstance(last.get("step"), int) else None
        child = self.children.get(run)
        code = child.poll() if child is not None else _exit_of(out)
        if child is None and code is None:
            return Look("failed", step, last, reason="its trainer process belonged to an earlier session of "
                        "the sweep, which ended")
        if code is None:
            return Look("running", step, last, training_usd=training_of(last, None), series=series)
        summary = _json(out / "summary.json")
        status = "completed" if code == COMPLETED else str((summary or {}).get("status") or "failed")
        if status == "completed" and code != COMPLETED:
            status = "failed"
        if status != "completed" and run in self.stopped:
            status = "stopped"  # the sweep's SIGTERM, even one that came before the trainer's handler
        reason = "" if status == "completed" else (
            f"exit {code}: {(summary or {}).get('error') or _tail(out / 'train.log')}")
        if run in self.children:
            self.children.pop(run)
            (out / "exit_code").write_text(str(code))
            self._record(run, status, step)
        cost = cost_report.settled_cost(self.history, run) if self.history is not None else None
        return Look(status, step, last, summary, training_of(last, summary), reason,
                    cost_usd=None if status == "preempted" else cost)

    def _record(self, run: str, status: str, step: int | None) -> None:
        """The run's end in the history, its cost settled (once: cost_report.settle); a preemption is an
        event of a run that goes on."""
        if self.history is None:
            return
        fields: dict[str, Any] = {"status": status, "steps": step,
                                  "ended_at": None if status == "preempted" else now()}
        with contextlib.suppress(errors.ForjaError):
            self.history.update(run, **{k: v for k, v in fields.items() if v is not None})
            if status == "preempted":
                self.history.record_event(run, "preempted", last_step=step)
            else:  # no VM ran it: its config's price_per_hour over its span, never the inventory's VMs
                cost_report.settle(self.session, run, [])

    def stop(self, run: str) -> Look | None:
        """SIGTERM, as `forja stop` sends it (with its request marker): the trainer checkpoints and exits."""
        from trainer.run_folder import STOP_REQUESTED

        child = self.children.get(run)
        if child is not None and child.poll() is None:
            self.stopped.add(run)
            (self.folder(run) / STOP_REQUESTED).write_text("forja stop")
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        return self._look(run)

    def recover(self, run: str, slot: int) -> Recovery:
        """Start the trainer again on the run's folder: it resumes from its newest checkpoint there."""
        if run not in self.configs:
            return Recovery(why="its trainer process belonged to an earlier session of the sweep")
        self._launch(run)
        return Recovery(resumed=True)

    def model_of(self, run: str) -> Path | None:
        model = self.folder(run) / "model"
        return model if model.is_dir() else None


def _lines(path: Path) -> list[dict[str, Any]]:
    """The metric lines of a run folder (a line cut mid-write is skipped, as trainer.metrics does; that
    module imports torch, which the controller need not have)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            obj = json.loads(line)
            if isinstance(obj, dict):
                found.append(obj)
    return found


def _json(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _exit_of(out: Path) -> int | None:
    try:
        return int((out / "exit_code").read_text())
    except (FileNotFoundError, ValueError):
        return None


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "no output"
    return (lines[-1] if lines else "no output")[:300]


# -- the inventory's VMs ----------------------------------------------------------------------------
def gpus_of(host: Any) -> int:
    """A host's GPUs: its machine type's in forja's catalog (g2-standard-8: one L4); 1 for a host
    the catalog does not know (an own machine trains one trial at a time)."""
    from forja import machines

    kind = host.vars.get("machine_type") or host.vars.get("machineType")
    entry = machines.machine_type(str(kind).rsplit("/", 1)[-1]) if kind else None
    count = getattr(entry, "gpu_count", None) if entry is not None else None
    return int(count) if isinstance(count, int) and count > 0 else 1


class TrialsWatcher(managed.Watcher):
    """The managed watcher of one VM of a sweep (`forja train --managed`'s own, forja.managed): its
    policy, budget, tally and zone moves, with the VM's trials as the work a move sends again; each
    resumes from its own checkpoint in the bucket. Its tally is kept under NAME-HOST in forja's watch
    folder, so `forja sweep resume` goes on with what the VM spent."""

    def __init__(self, session: Any, state: managed.WatchState, budget: managed.RecoveryBudget,
                 trials: Callable[[], list[dict[str, Any]]], say: Callable[[str], None]) -> None:
        super().__init__(session, state, budget, say=say)
        self.trials = trials

    def can_send_again(self) -> bool:
        return True

    def send_again(self) -> None:
        """Each trial that was on the VM, in the order they were sent (those that ran first, then
        those that waited in its queue)."""
        from forja import training

        for how in self.trials():
            training.train(self.session, **how)


class VmRunner:
    """Trials as forja runs on the inventory's VMs (or on the session's cluster's members, each alone).

    With the VM run queue (`forja train --queue`), a trial per GPU and one more waiting in the queue, so
    the next starts the moment a GPU frees; without it, one trial per VM. A VM Spot took is brought
    back by a managed watcher per VM (`TrialsWatcher`): started again in its zone, or made again in the
    next of `fallback_zones` when it is gone or its zone has no capacity, its trials sent again there."""

    def __init__(self, session: Any, *, project: Path | None, queue: bool = True, name: str = "sweep",
                 fallback_zones: Sequence[str] = (), budget: managed.RecoveryBudget | None = None,
                 say: Callable[[str], None] = print) -> None:
        self.session = session
        self.project = project
        self.queue = queue
        chosen = session.chosen_cluster()
        hosts = {h.name: h for h in session.hosts()}
        names = list(chosen.members) if chosen is not None else sorted(hosts)
        if not names:
            raise errors.ConfigError("inventory", "no GPU host to run the trials on; `forja up` creates "
                                     "the VM")
        self.hosts = names
        #: slot -> the host that runs it (a host with N GPUs holds N slots under the queue).
        self.slot_hosts = [n for n in names for _ in range(gpus_of(hosts[n]) if self.queue and n in hosts
                                                            else 1)]
        self.ahead = 1 if self.queue else 0
        #: One session per host, each sending `project` or nothing: a trial's config lives under forja's
        #: home, and the project a run would find from it is not the user's.
        self.sessions = {n: self._session_for(n) for n in names}
        self.sent: dict[str, dict[str, Any]] = {}
        self.name, self.fallback_zones, self.say = name, list(fallback_zones), say
        self.budget = budget or managed.RecoveryBudget()
        #: Each host's zone as the inventory knows it (where its VM was, once it is gone).
        self.zones = {n: _zone_of(hosts[n].vars) for n in names if n in hosts}
        self.watchers: dict[str, TrialsWatcher] = {}
        #: The trials the sweep still watches, in the order sent: what a zone move sends again.
        self.live: dict[str, None] = {}
        #: Trials a recovery brought back, and when (their unit starts again on the restarted VM) ...
        self.resuming: dict[str, float] = {}
        #: ... and those of them whose recovery the sweep has not counted yet (one per preemption).
        self.uncounted: set[str] = set()
        #: Trials whose send Spot cut short (the VM was taken while the playbook ran): sent once it is back.
        self.unsent: set[str] = set()
        #: Trials' results fetched here as each ended (its folder): a zone move later deletes their VM's disk.
        self.fetched: dict[str, Path | None] = {}

    def _session_for(self, host: str) -> Any:
        """A session aimed at one host of the inventory: a trial trains alone there, even on a cluster
        member."""
        from forja.session import Session

        s = self.session
        return Session(s.project_dir, s.inventory, s.private_data_dir, s.extravars,
                       host_key_checking=s.host_key_checking, limit=host if len(self.hosts) > 1 or
                       s.cluster else s.limit, on_event=s.on_event, history=s.history,
                       send_project=self.project is not None, follow_window_s=s.follow_window_s)

    def slots(self) -> int:
        return len(self.slot_hosts)

    def describe(self) -> str:
        where = f"cluster {self.session.cluster}" if self.session.cluster else ", ".join(self.hosts)
        return where + (" (run queue)" if self.queue else "")

    def host_of(self, slot: int) -> str:
        return self.slot_hosts[slot % len(self.slot_hosts)]

    def _how(self, run: str, config: Path, host: str) -> dict[str, Any]:
        alone = {"forja_hosts": host, "trainer_run_nnodes": 1, "trainer_run_node_rank": 0} \
            if self.session.cluster else {}
        how: dict[str, Any] = {"config": str(config), "name": run, "project": self.project, "wait": False,
                               "extravars": alone}
        if self.queue:
            how.update(queue=True, queue_timeout_s=QUEUE_WAIT_S)
        return how

    def adopt(self, run: str, config: Path, slot: int) -> None:
        host = self.host_of(slot)
        self.sent[run] = {"host": host, **self._how(run, config, host)}
        self.live[run] = None

    def start(self, run: str, config: Path, slot: int) -> None:
        from forja import training

        host = self.host_of(slot)
        how = self._how(run, config, host)
        self.sent[run] = {"host": host, **how}
        self.live[run] = None
        try:
            training.train(self.sessions[host], **how)
        except errors.ForjaError:
            if not self._taken(host):
                self.sent.pop(run)
                self.live.pop(run, None)
                raise
            # Not the trial's fault: its next look finds the VM down, the watcher brings it back, and
            # the trial is sent then (or with the VM's trials after a zone move).
            self.unsent.add(run)
            self.say(f"{run}: its VM was preempted while the trial was sent; it is sent once the VM is back")

    def _taken(self, host: str) -> bool:
        """Whether Spot took the host's VM (it is not running): asked only when a send failed."""
        try:
            return not self._watcher(host).observe().running
        except errors.ForjaError:
            return False

    def _send_unsent(self, host: str, named: Sequence[str]) -> dict[str, Look]:
        """Send the trials a preemption cut short, once their VM answers; a send that fails on a running
        VM is the trial's own failure."""
        from forja import training

        failed: dict[str, Look] = {}
        for run in [r for r in named if r in self.unsent]:
            try:
                training.train(self.sessions[host], **self._how_again(run))
            except errors.ForjaError as exc:
                if not self._taken(host):
                    self.unsent.discard(run)
                    failed[run] = Look("failed", reason=exc.message.splitlines()[0][:300])
                continue
            self.unsent.discard(run)
            self.resuming[run] = time.monotonic()
        return failed

    def look(self, runs: Sequence[str]) -> dict[str, Look]:
        by_host: dict[str, list[str]] = {}
        for run in runs:
            by_host.setdefault(self.sent.get(run, {}).get("host", self.hosts[0]), []).append(run)
        found: dict[str, Look] = {}
        ended: dict[str, Any] = {}  # run -> its host's session: settled below, at its fetch or as it is
        for host, named in by_host.items():
            session = self.sessions[host]
            try:
                pairs = session.read_states({"trainer_run_status_runs": named,
                                             "trainer_run_journal_lines": JOURNAL_LINES})
            except errors.HostStopped as exc:  # Spot took the VM: its trials resume once it is back
                found.update((run, Look("preempted", reason=exc.message)) for run in named)
                continue
            except (errors.HostUnreachable, errors.PlaybookFailed):  # not a verdict: the next look asks again
                found.update((run, Look("unknown")) for run in named)
                continue
            ended.update((run, session) for run in session.sync_history(pairs))
            states = {state.run: state for _, state in pairs if state.status != "unknown"}
            found.update(failed := self._send_unsent(host, named))  # the VM answers: send what Spot cut short
            for run in named:
                if run in failed:
                    continue
                state = states.get(run)
                if state is None:
                    found[run] = Look("unknown")
                    continue
                status = "queued" if state.status in WAITING else state.status
                last = dict(state.last or {})
                reason = ""
                if state.final and status != "completed":
                    reason = str((state.summary or {}).get("error") or
                                 f"its run {status} (exit {state.exit_status}); see forja logs {run}")
                found[run] = Look(status, state.step, last, state.summary, training_of(last, state.summary),
                                  reason, series=series_of(state.journal, last))
        for run in [r for r, look in found.items() if look.status == "running"]:
            self.resuming.pop(run, None)
        over = [run for run, look in found.items() if look.status not in GOES_ON]
        for run in over:  # it ended: nothing to send again
            self.live.pop(run, None)
            if run not in self.fetched:
                self.fetched[run] = self._fetch(run)
            if self.fetched[run] is not None:
                ended.pop(run, None)  # fetch_run settled its cost, with its files
            else:  # not fetched: settled here, whoever recorded its end (settle: once per end)
                ended.setdefault(run, self._session_of(run))
        for run, session in ended.items():  # an end no fetch settled: a preemption, a failed fetch
            cost_report.settle(session, run)
        history = self.session.history
        return {**found, **{run: replace(found[run], cost_usd=cost_report.settled_cost(history, run))
                            for run in over}}

    def _session_of(self, run: str) -> Any:
        """The session of the host the trial was sent to."""
        return self.sessions[self.sent.get(run, {}).get("host", self.hosts[0])]

    def _fetch(self, run: str) -> Path | None:
        """A trial's results fetched here once it ended, while the VM that ran it exists (the next
        trial trains meanwhile); None when they could not be (`model_of` tries again)."""
        from forja import following

        how = self.sent.get(run)
        try:
            return following.fetch_run(self.sessions[how["host"]] if how else self.session, run).artifact_dir
        except errors.ForjaError as exc:  # its cost is settled all the same (forja.cost_report.settle)
            self.say(f"{run}: its results were not fetched ({exc.message.splitlines()[0][:200]}); "
                     f"`forja fetch {run}` fetches them")
            return None

    def stop(self, run: str) -> Look | None:
        """`forja stop` (which settles the run's cost at its end), then that cost."""
        from forja import following

        self.live.pop(run, None)
        following.stop(self._session_of(run), run)
        return Look("stopped", cost_usd=cost_report.settled_cost(self.session.history, run))

    def recover(self, run: str, slot: int) -> Recovery:
        """Bring a preempted trial back as `forja train --managed` does, through its VM's managed
        watcher (`TrialsWatcher.act`: forja.managed's policy and budget): a VM Google preempted is
        started again in its zone (the trials' units resume from their checkpoints); one that is gone,
        or whose zone ran out, is made again in the next fallback zone and its trials are sent again
        there (resuming from the bucket's checkpoints). A VM still going down is waited for; a VM its
        user stopped, or a spent budget, is why not. One preemption is one recovery of each trial
        that was on the VM, however many looks it takes."""
        how = self.sent.get(run)
        if how is None:
            return Recovery(why="this controller did not send it; `forja train` it again by hand")
        host = how["host"]
        try:
            watcher = self._watcher(host)
            vm = watcher.observe()
            if vm.running:
                return self._brought_back(run, host)
            peek = managed.decide(vm, None, watcher.state.tally, watcher.budget, watcher.state.zones)
            if peek.action == "move" and len(watcher.state.zones) < 2:
                return Recovery(why=f"{peek.reason}, and the sweep names no zone to move it to: start it "
                                "with --fallback-zone ZONE")
            decision = watcher.act(vm, None)
        except errors.ForjaError as exc:
            return Recovery(why=exc.message.splitlines()[0][:300])
        if decision.action == "watch":
            return WAIT
        if decision.action not in ("restart", "move"):
            return Recovery(why=decision.reason)
        since = time.monotonic()
        for trial in self._on(host):
            self.resuming[trial] = since
            self.uncounted.add(trial)
            with contextlib.suppress(errors.ForjaError):
                self.session.history.record_event(trial, "preempted", zone=vm.zone, recovery=decision.action,
                                                  to_zone=watcher.state.zones[0], reason=decision.reason)
        return self._brought_back(run, host)

    def _brought_back(self, run: str, host: str) -> Recovery:
        """A preempted trial whose VM runs: counted once if a recovery brought it back; waited for while
        its unit starts again; else (its unit did not, or it was never brought back) sent again."""
        if run in self.uncounted:
            self.uncounted.discard(run)
            return Recovery(resumed=True)
        if time.monotonic() - self.resuming.get(run, -RESUME_GRACE_S) < RESUME_GRACE_S:
            return WAIT
        from forja import training

        again = self._how_again(run)
        if again.get("queue"):
            again["priority"] = 1  # before the trials waiting behind it: it was running
        try:
            training.train(self.sessions[host], **again)
        except errors.ForjaError as exc:
            return Recovery(why=exc.message.splitlines()[0][:300])
        self.resuming[run] = time.monotonic()
        return Recovery(resumed=True)

    def _on(self, host: str) -> list[str]:
        """The trials still watched on a host, in the order sent."""
        return [run for run in self.live if self.sent.get(run, {}).get("host") == host]

    def _watcher(self, host: str) -> TrialsWatcher:
        """The host's managed watcher, made on its first recovery (its kept tally, after a resume): its
        zones are the VM's own, then the sweep's fallback zones."""
        if host not in self.watchers:
            session = self.sessions[host]
            own = self.zones.get(host) or next(
                (vm.zone for vm in lifecycle.observe(session).values() if vm.zone), "")
            zones = list(dict.fromkeys(z for z in (own, *self.fallback_zones) if z))
            if not zones:
                raise errors.ConfigError("--fallback-zone", f"the zone of {host}'s VM is unknown; name the "
                                         "zones to bring it back in (--fallback-zone ZONE)")
            key = f"{self.name}-{host}"
            state = managed.WatchState.load(key) or managed.WatchState(run=key, zones=zones)
            state.zones = list(dict.fromkeys([*state.zones[:1], *zones]))
            self.watchers[host] = TrialsWatcher(session, state, self.budget,
                                                lambda h=host: self._send_again_on(h), self.say)
        return self.watchers[host]

    def _send_again_on(self, host: str) -> list[dict[str, Any]]:
        """What a zone move sends again: every trial still watched on the host, those a preemption cut
        short included (sent with the rest, so not again by the next look)."""
        trials = self._on(host)
        self.unsent.difference_update(trials)
        return [self._how_again(r) for r in trials]

    def _how_again(self, run: str) -> dict[str, Any]:
        """`training.train`'s arguments that sent the trial (what it is sent again with)."""
        return {k: v for k, v in self.sent[run].items() if k != "host"}

    def model_of(self, run: str) -> Path | None:
        """The run's results fetched here (forja-runs/RUN), its model among them."""
        folder = self.fetched.get(run) or self._fetch(run)
        if folder is None:
            return None
        return folder / "model" if (folder / "model").is_dir() else folder


def _zone_of(hostvars: Mapping[str, Any]) -> str:
    """A host's zone as the inventory gives it (the gcp_gpu plugin's `zone`, or the play's variable)."""
    for key in ("zone", "gcp_zone", "gcp_instance_zone"):
        value = hostvars.get(key)
        if value:
            return str(value).rsplit("/", 1)[-1]
    return ""


def series_of(journal: str, last: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """Every metric line a look saw, oldest first: {step, loss} of each progress line in the run's
    journal (trainer.metrics.progress_line, what `forja logs` shows), then its newest full metric
    line when that is newer. The pruner compares trials at the same steps, so each step logged since
    the last look is one `trial.report`, not only the newest."""
    found: list[dict[str, Any]] = []
    for match in PROGRESS.finditer(journal or ""):
        value = float(match[2])
        if math.isfinite(value):
            found.append({"step": int(match[1]), "loss": value})
    step = last.get("step")
    if last and (not found or (isinstance(step, int | float) and step > found[-1]["step"])):
        found.append(dict(last))
    return tuple(found)


def for_session(session: Any, *, local: bool, parallel: int, project: Path | None, name: str = "sweep",
                fallback_zones: Sequence[str] = (), budget: managed.RecoveryBudget | None = None,
                say: Callable[[str], None] = print) -> TrialRunner:
    """The runner a sweep uses: trainer processes here (`local`), else the session's VMs, each brought
    back by a managed watcher (`fallback_zones`, `budget`: as `forja train --managed`'s)."""
    if local:
        from forja.paths import forja_home

        return LocalRunner(forja_home() / "sweeps" / "local-runs", parallel=parallel, project=project,
                           session=session)
    return VmRunner(session, project=project, name=name, fallback_zones=fallback_zones, budget=budget,
                    say=say)
