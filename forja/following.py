"""A sent run, looked at on its hosts: follow it to its end, its status and journal, fetch and stop it.

Why one module: each of these reads the run's state as the hosts publish it (playbooks/train_wait.yml,
train_status.yml: the typed contract) and brings the history up to date with it; the host's status,
never a clock's, decides how a run ended. Following has no fixed limit: it lasts as long as the run.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from forja import contract, cost_report, defaults, errors, runstate
from forja import events as ev
from forja import format as fmt
from forja import notify as notifications
from forja.history import History, summary_fields
from forja.runner import RunResult
from forja.runs import TrainResult, TrainStatus, checked_name, now, rank0
from forja.session import Session

#: Journal lines per host that `logs` shows (and `follow_logs` starts with) unless told otherwise.
LOG_LINES = defaults.LOG_LINES


def follow(
    session: Session,
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
    checked_name(name)
    limit, poll = session.follow_limit(timeout_s), session.poll(poll_s)
    deadline = None if limit is None else time.monotonic() + limit
    progress = _ProgressRecorder(session.history, name)

    def both(event: ev.Event) -> None:
        progress(event)
        if on_event is not None:
            on_event(event)

    last: RunResult | None = None
    states: list[tuple[str, runstate.RunState]] = []
    while True:
        window = session.follow_window_s
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return _detached(session, name, "timeout", states, last)
            window = max(1, min(window, math.ceil(left)))
        # trainer_run_fetch false: fetch() lists the results itself; the wait need not hash them.
        extravars = {"trainer_run_name": name, "trainer_run_wait_timeout_s": window,
                     "trainer_run_poll_s": poll, "trainer_run_fetch": False,
                     **session.cluster_hosts(rank0=True)}
        try:
            last = session.run("train_wait.yml", extravars, on_event=both, cancel=cancel, check=False)
        except KeyboardInterrupt:
            return _detached(session, name, "interrupted", states, last)
        if last.status in ("canceled", "timeout"):
            return _detached(session, name, "interrupted", states, last)
        states = [(h, s) for h, s in contract.read_stats(last.artifact_data).runs if s.run == name]
        first = rank0(states)
        if first is None:
            last.raise_for_status()
            where = ", ".join(sorted(last.stats)) or "no host"
            raise errors.RunNotFound(f"run {name!r} is on none of the hosts ({where}); see forja status")
        if first.status == "unknown":
            where = ", ".join(h for h, _ in states)
            raise errors.RunNotFound(f"run {name!r} is not on {where}; see `forja status`")
        if first.final or not last.ok:
            return _finish(session, name, states, first, last, fetch=fetch, checkpoints=checkpoints)
        session.history.record_host_run(first, hosts=session.run_hosts(states))  # one started elsewhere


def _finish(
    session: Session,
    name: str,
    states: Sequence[tuple[str, runstate.RunState]],
    first: runstate.RunState,
    last: RunResult,
    *,
    fetch: bool,
    checkpoints: bool,
) -> TrainResult:
    """Record how a followed run ended (the host's status, never a clock's), fetch it, report it."""
    hosts = session.run_hosts(states)
    session.history.record_host_run(first, hosts=hosts)  # adds a run started outside forja
    summary: dict[str, Any] = dict(first.summary or {})
    fields: dict[str, Any] = {"status": first.status, "hosts": hosts, **summary_fields(summary)}
    artifact: Path | None = None
    fetched = first.status == "completed" and fetch
    if fetched:  # the fetch settles the run's cost, with its files: the one place for a fetched run
        try:
            fetch_run(session, name, checkpoints=checkpoints)
        except errors.ForjaError:
            cost_report.settle(session, name)  # not fetched, its end is still priced
            raise
        results, artifact = session.read_results(name)
        summary = results or summary
    if not last.ok:
        failed = (last.unreachable or last.failed_tasks or [None])[0]
        fields["message"] = f"{failed.host}: {failed.task}: {failed.message}" if failed else f"rc {last.rc}"
    if first.final:
        fields["ended_at"] = session.history.get(name).ended_at or now()
    session.history.update(name, **fields)
    if not fetched:
        cost_report.settle(session, name)  # the run's cost, once it has ended: what every view shows
    announce_end(session, name, first.status, hosts, fields.get("message"))
    if first.status == "diverged" and last.failed_tasks:
        failed = last.failed_tasks[0]
        raise errors.RunDiverged(failed.host, failed.task, failed.message, playbook=last.playbook)
    last.raise_for_status()
    return TrainResult.ended(session.history.get(name), cost_report.settled_cost(session.history, name),
                             summary, artifact, last)


def _detached(
    session: Session, name: str, reason: str, states: Sequence[tuple[str, runstate.RunState]],
    last: RunResult | None,
) -> TrainResult:
    """Stop following a run that goes on: the history keeps "running" and notes why."""
    with contextlib.suppress(errors.RunNotFound):
        session.history.record_event(name, "detached", reason=reason)
    hosts = (session.run_hosts(states) if states else []) or (sorted(last.stats) if last else [])
    return TrainResult(name, "running", hosts, {}, None, last, detached=reason)


def status(session: Session, name: str | None = None) -> list[TrainStatus]:
    """The state of one run (or every run) on every host, as the hosts report it.

    Updates the history: runs that ended take their final status, and runs the history does
    not know (started by site.yml or another controller) are added.
    """
    pairs = session.read_states({"trainer_run_status_runs": [name] if name else []})
    for ended in session.sync_history(pairs):
        cost_report.settle(session, ended)  # the run's cost, once it has ended: what every view shows
    return [TrainStatus.from_state(host, state) for host, state in pairs]


def runs(session: Session, limit: int = 50, status: str | None = None, sync: bool = False) -> list[Any]:
    """The run history, newest first. `sync` first reads every run on the hosts (`status()`), so
    runs started elsewhere are added and ended ones take their final status."""
    if sync:  # what status() reads, without making statuses of it
        for ended in session.sync_history(session.read_states({"trainer_run_status_runs": []})):
            cost_report.settle(session, ended)
    return session.history.list(limit=limit, status=status)


#: What each line of a run's hook log (its user hooks' output: forja-train-launch) starts with in `logs`.
HOOK_PREFIX = "hook| "


def hook_lines(text: str) -> str:
    """The hook log's lines as `logs` shows them after the journal, each prefixed: they read as the hook's."""
    return "".join(f"{HOOK_PREFIX}{line}\n" for line in text.splitlines())


def logs(session: Session, name: str, lines: int = LOG_LINES) -> dict[str, str]:
    """The training unit's journal per host, then the last lines of the run's hook log (its stop,
    preemption and down hooks' output and how each ended), each line prefixed `hook| `."""
    pairs = session.read_states({"trainer_run_status_runs": [name], "trainer_run_journal_lines": int(lines)})
    return {host: state.journal + hook_lines(state.hook_log) for host, state in pairs}


def follow_logs(
    session: Session, name: str, lines: int = LOG_LINES, poll_s: int | None = None,
    cancel: threading.Event | None = None,
) -> Iterator[tuple[str, str]]:
    """Yield (host, new journal lines) as the run writes them, each line once, until it ends.

    Starts with the last `lines` lines, then reads only what follows each host's journal cursor,
    so it stays cheap for runs of days. The run's hook log comes the same way, its lines prefixed
    `hook| ` (the stop or preemption hook runs as the run ends, so its lines come last). Ends when
    the rank-0 host reports a final status, or when `cancel` is set (Ctrl-C in `forja logs -f`).
    A run no host knows raises RunNotFound.
    """
    checked_name(name)
    poll = session.poll(poll_s)
    stop = cancel or threading.Event()
    cursors: dict[str, str] = {}
    hooks_seen: dict[str, int] = {}
    while not stop.is_set():
        try:
            request = {"trainer_run_status_runs": [name], "trainer_run_journal_lines": int(lines),
                       "trainer_run_journal_after": dict(cursors)}
            pairs = session.read_states(request, cancel=stop)
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
            hooked = unseen_hook_lines(state, hooks_seen.get(host))
            if hooked:
                yield host, hook_lines(hooked)
            hooks_seen[host] = state.hook_log_lines
        first = rank0(known)
        if first is None or first.final:
            for ended in session.sync_history(known):
                cost_report.settle(session, ended)
            return
        stop.wait(poll)


def unseen_hook_lines(state: runstate.RunState, seen: int | None) -> str:
    """The hook log's lines that `follow_logs` has not shown (all it was sent on its first look)."""
    tail = state.hook_log.splitlines(keepends=True)
    if seen is None or state.hook_log_lines < seen:  # the first look, or a log that started again
        return "".join(tail)
    new = state.hook_log_lines - seen
    return "".join(tail[-new:]) if new > 0 else ""


def fetch_run(
    session: Session, name: str, dest: str | Path | None = None, checkpoints: bool = False
) -> RunResult:
    """Copy a run's results (and checkpoints) to `dest` (default: the project's forja-runs/<run>)."""
    checked_name(name)
    target = Path(dest).expanduser().resolve() if dest else session.results_dir(name)
    result = session.run(
        "train_fetch.yml",
        {"trainer_run_name": name, "trainer_run_fetch_dir": str(target),
         "trainer_run_fetch_checkpoints": checkpoints, **session.cluster_hosts(rank0=True)},
    )
    summary, artifact = session.read_results(name, target)
    with contextlib.suppress(errors.RunNotFound):
        session.history.update(name, artifact_dir=str(artifact or target), **summary_fields(summary))
        cost_report.settle(session, name)  # an ended run: priced with its files, once (cost_report.settle)
    return RunResult(**{**result.__dict__, "artifact_dir": artifact or target})


def stop(session: Session, name: str, notify: str | bool | None = None) -> RunResult:
    """Stop a run's unit (it checkpoints on SIGTERM) and keep it from resuming at boot.

    `notify` posts a "run stopped" event to the webhook (see `train`)."""
    checked_name(name)
    notifications_for(session, notify)
    result = session.run("train_stop.yml", {"trainer_run_name": name})
    with contextlib.suppress(errors.RunNotFound):
        session.history.update(name, status="stopped", ended_at=now())
        cost_report.settle(session, name)  # it ended here: the host's "stopped" later changes nothing
    announce(session, "run_stopped", name, f"run {name} was stopped (forja stop); it checkpointed")
    return result


# -- notifications (forja/notify.py): the run's events posted to a webhook ------------------------
#: How a run's end on its host maps to the event posted.
END_EVENTS = {"completed": "run_finished", "failed": "run_failed", "diverged": "run_failed",
              "stopped": "run_stopped", "cancelled": "run_stopped", "preempted": "preempted"}


def notifications_for(session: Session, notify: str | bool | None) -> None:
    """Post this session's run events to the webhook when asked (`notify`: True reads the URL from
    FORJA_NOTIFY_WEBHOOK or the inventory's `notify_webhook`; a string is the URL itself). Called
    before anything is created, so a missing or non-http(s) URL stops the verb with its fix."""
    if notify and session.notifier is None:
        session.notifier = notifications.from_setting(notify, lambda: _inventory_webhook(session))


def _inventory_webhook(session: Session) -> str | None:
    """The inventory's `notify_webhook` (group_vars all, or a host's), when an inventory is named."""
    if not session.inventory:
        return None
    try:
        hosts = session.hosts("all")
    except errors.ForjaError:
        return None
    found = (h.vars.get(notifications.SETTING) for h in hosts)
    return next((v for v in found if isinstance(v, str) and v.strip()), None)


def announce(session: Session, kind: str, run: str, text: str, *, vm: str = "", **details: Any) -> None:
    """Post one event of `run` (its VM and cost so far from the history) when notifications are on.

    Never raises: a notification never fails a run."""
    notifier = session.notifier
    if notifier is None:
        return
    try:
        cost = None
        with contextlib.suppress(errors.ForjaError):
            record = session.history.get(run)
            vm = vm or ", ".join(record.hosts)
            cost = record.cost_usd
        if cost is not None:
            text = f"{text} (cost so far {fmt.money(cost)})"
        notifier.send(notifications.Event(kind, run, text, vm=vm, cost_usd=cost, details=details))
    except Exception:  # the run goes on whatever the notification does
        return


def announce_end(session: Session, name: str, status: str, hosts: Sequence[str], message: Any) -> None:
    """Post how a run ended (finished, failed, stopped or preempted), when notifications are on."""
    kind = END_EVENTS.get(status)
    if kind is None:
        return
    said = message and kind in ("run_failed", "run_stopped")
    why = f": {str(message).splitlines()[0][:200]}" if said else ""
    announce(session, kind, name, f"run {name} {status} on {', '.join(hosts) or 'its host'}{why}",
             status=status)


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
