"""The run queue on each VM: `forja train --queue`, and `forja queue` to list, reorder and cancel.

Why on the VM and not here: a queue on the controller dies with the laptop that holds it, and a
VM that reboots (a Spot VM restarted, a maintenance) must still start its waiting runs. So the
queue is the host's, kept as files beside its run folders and driven by systemd
(roles/trainer_run/files/forja_queue.py says how, and decides who starts). This module only checks
what is sent (a priority that is an integer, a GPU memory that parses and fits the GPU), before
anything is; lists the queue from the runs' states (each queued run's `queue` in forja-train-state's
document); asks the hosts to cancel or move a run (playbooks/train_queue.yml); and, after a managed
run's zone move, sends the queue the old VM mirrored to the bucket again to the new one (`restore`;
what each run is sent with is decided by `requeued`, read directly by the tests).

A queued run with no declared peak gets the trainer's own plan of its config (`forja plan`'s kept
plan, the one the estimate before `forja train` makes) as its planned peak: no second estimator. The
host uses it only when the run spec and earlier runs of the same spec say nothing.

The admission rules and the parsing of an amount of memory have one home, the host's script: it is
standard-library Python, loaded here from the role's files (as forja.host_contract reads the role's
defaults), so the controller refuses exactly what the host would.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from forja import cost_report, errors, module_utils
from forja.runs import checked_name, now
from forja.session import Session

#: The host's queue program, relative to forja's Ansible content (the repository / collection root).
PROGRAM = ("roles", "trainer_run", "files", "forja_queue.py")
#: The inventory variable that gives a host's GPU memory in MiB where nvidia-smi cannot (the role's).
CAPACITY_VAR = "trainer_run_gpu_capacity_mib"
ACTIONS = ("cancel", "move")


@functools.cache
def rules() -> ModuleType:
    """The host's queue program as a module: its `decide`, `parse_memory` and `fmt_mib`."""
    return module_utils.load(PROGRAM[-1].removesuffix(".py"), "forja_queue_rules",
                             folder=Path(*PROGRAM[:-1]))


def priority_of(priority: object) -> int:
    """A queue priority as the host takes it: an integer (higher goes first); a clear error otherwise."""
    if isinstance(priority, bool):
        priority = repr(priority)
    if isinstance(priority, int):
        return priority
    text = str(priority).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    raise errors.ConfigError(
        "priority", f"{priority!r} is not an integer; give a whole number, higher goes first "
        "(e.g. --priority 5; omit it: 0)"
    )


def memory_mib(gpu_memory: object) -> int:
    """An amount of GPU memory ('10GiB', '10GB', '900MiB', a number of MiB) in MiB."""
    try:
        return int(rules().parse_memory(gpu_memory))
    except ValueError as exc:
        raise errors.ConfigError("gpu_memory", f"{exc} (the run's peak; omit it to let forja estimate)") \
            from None


def plan(
    session: Session, *, priority: object = None, gpu_memory: object = None, timeout_s: object = None,
    config: Path | None = None, queued_at: object = None,
) -> dict[str, Any]:
    """The role variables of a queued run (trainer_run_queue...), checked before anything is sent.

    A declared `gpu_memory` larger than a host's GPU (the inventory's trainer_run_gpu_capacity_mib,
    which the sandbox sets to the L4's) is refused here; a host whose GPU only nvidia-smi knows
    fails such a run out of its queue at once, with the same reason. Without one, the kept plan of
    `config` (the built-in trainer's) on the inventory's machine type goes as the planned peak.
    `queued_at` (Unix time) is when a run a zone move brought back was first queued (`resend`).
    """
    vars_: dict[str, Any] = {"trainer_run_queue": True}
    if queued_at is not None:
        if isinstance(queued_at, bool) or not isinstance(queued_at, int | float) or queued_at < 0:
            raise errors.ConfigError("queued_at", f"{queued_at!r} is not a Unix time (when the run was first "
                                     "queued); leave it out for now")
        vars_["trainer_run_queue_queued_at"] = queued_at
    if priority is not None:
        vars_["trainer_run_queue_priority"] = priority_of(priority)
    if timeout_s is not None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 0:
            raise errors.ConfigError("queue_timeout_s", f"{timeout_s!r} is not a number of seconds (0: no "
                                     "limit; omit it: 600, ten minutes)")
        vars_["trainer_run_queue_timeout_s"] = timeout_s
    if gpu_memory is not None:
        mib = memory_mib(gpu_memory)
        for host, capacity in capacities(session).items():
            if mib > capacity:
                fmt = rules().fmt_mib
                raise errors.ConfigError(
                    "gpu_memory", f"the run declares {fmt(mib)} of GPU memory ({gpu_memory}) and {host}'s "
                    f"GPU has {fmt(capacity)}: it could never start. Lower its batch or model (forja "
                    "plan CONFIG predicts its memory), or use a larger GPU"
                )
        vars_["trainer_run_gpu_memory"] = f"{mib}MiB"
    elif config is not None:
        planned = planned_mib(session, config)
        if planned is not None:
            vars_["trainer_run_gpu_memory_planned"] = f"{planned}MiB"
    return vars_


def planned_mib(session: Session, config: Path) -> int | None:
    """The peak GPU memory (MiB, CUDA context included) the trainer's kept plan of `config` predicts on
    the inventory's machine type (forja.plan.prediction, never a new plan here: that costs seconds of
    CPU, and the estimate before `forja train` has made one). None: no plan kept, or several machine
    types (then each host's own measure decides)."""
    from forja.plan import prediction

    if not config.is_file() or not session.inventory:
        return None
    kinds = {str(h.vars.get("machine_type") or h.vars.get("machineType") or "").rsplit("/", 1)[-1]
             for h in session.hosts()}
    if len(kinds) != 1 or not next(iter(kinds)):
        return None
    found = prediction(session, config, next(iter(kinds)), make=False)
    value = ((found or {}).get("peak_mib") or {}).get("value")
    return int(-(-float(value) // 1)) if isinstance(value, int | float) and value > 0 else None


def capacities(session: Session) -> dict[str, int]:
    """Each inventory host's GPU memory in MiB where the inventory says it (trainer_run_gpu_capacity_mib)."""
    if not session.inventory:
        return {}
    found: dict[str, int] = {}
    for host in session.hosts():
        value = host.vars.get(CAPACITY_VAR)
        if isinstance(value, int | str) and str(value).strip().isdigit():
            found[host.name] = int(value)
    return found


@dataclass(frozen=True)
class QueuedRun:
    """One run of a host's queue: waiting ("queued", with its position) or started from it ("running")."""

    host: str
    run: str
    state: str
    position: int
    priority: int
    waited_s: float | None
    gpu_memory_mib: int | None
    reason: str = ""
    #: Where the peak came from: declared, run spec, an earlier run of the same spec, planned (None: unknown).
    memory_source: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def queue(session: Session) -> list[QueuedRun]:
    """The hosts' queues: the runs waiting, in the order they will start (position 1 first), with
    their priority, how long they have waited and why; then the runs the queue started that still run."""
    rows: list[QueuedRun] = []
    pairs = session.read_states({"trainer_run_status_runs": []})
    for ended in session.sync_history(pairs):
        cost_report.settle(session, ended)  # the run's cost, once it has ended: what every view shows
    for host, state in pairs:
        info = state.queue or {}
        if state.status == "queued":
            rows.append(QueuedRun(host, state.run, "queued", int(info.get("position") or 0),
                                  int(info.get("priority") or 0), info.get("waited_s"),
                                  info.get("gpu_memory_mib"), str(info.get("reason") or ""),
                                  info.get("memory_source")))
        elif state.status == "running" and info.get("outcome") == "admitted":
            rows.append(QueuedRun(host, state.run, "running", 0, int(info.get("priority") or 0),
                                  info.get("waited_s"), info.get("gpu_memory_mib"),
                                  memory_source=info.get("memory_source")))
    return sorted(rows, key=lambda r: (r.host, r.state != "running", r.position, r.run))


def cancel(session: Session, name: str) -> dict[str, Any]:
    """Take a queued run out of its host's queue, or kill a running one (all its processes, its unit
    kept from resuming at boot) and free its slot. The history marks it stopped, as its host reports
    it, with the message that it was cancelled."""
    said = _change(session, name, {"trainer_run_queue_action": "cancel"})
    with contextlib.suppress(errors.RunNotFound):
        session.history.update(name, status="stopped", ended_at=now(),
                               message="cancelled (forja queue cancel)")
    return said


def move(session: Session, name: str, *, priority: object = None, first: bool = False) -> dict[str, Any]:
    """Give a queued run a new priority, or put it first among the runs of its priority."""
    if priority is None and not first:
        raise errors.ConfigError("priority", "say where the run goes: --priority N (an integer), or --first")
    vars_: dict[str, Any] = {"trainer_run_queue_action": "move", "trainer_run_queue_first": bool(first)}
    if priority is not None:
        vars_["trainer_run_queue_new_priority"] = priority_of(priority)
    return _change(session, name, vars_)


def _change(session: Session, name: str, vars_: dict[str, Any]) -> dict[str, Any]:
    """Run train_queue.yml for `name`; what the host that held it said (a RunNotFound when none did)."""
    checked_name(name)
    result = session.run("train_queue.yml", {"trainer_run_name": name, **vars_})
    said = result.artifact_data.get("forja_queue") or {}
    held = {host: data for host, data in said.items() if isinstance(data, dict) and data.get("rc") == 0}
    if not held:
        raise errors.RunNotFound(f"run {name!r} is neither queued nor running in the queue of "
                                 f"{', '.join(sorted(said)) or 'any host'}; see forja queue")
    return held


# --- the mirror, and the restore after a zone move ------------------------------------------------


def mirror_url(session: Session) -> str | None:
    """Where the hosts mirror their queues: trainer_run_checkpoint_bucket (-e, else the inventory's, as
    the role reads it); None without one, or one the inventory only templates."""
    from forja import datasets

    key = "trainer_run_checkpoint_bucket"
    found = session.extravars[key] if key in session.extravars else datasets.first_host_vars(session).get(key)
    url = str(found or "")
    return url if url.startswith("gs://") and "{{" not in url else None


def mirrored(session: Session, host: str) -> list[dict[str, Any]]:
    """The entries `host` last mirrored (running first, then waiting in admission order); [] when the
    inventory has no bucket or the host never mirrored a queue. Read before a zone move replaces the
    VM: the new VM mirrors its own queue under the same name."""
    url = mirror_url(session)
    if url is None:
        return []
    from forja import datasets

    bucket, name = rules().mirror_object(url, host)
    blob = datasets.storage_client(session, url).bucket(bucket).get_blob(name)
    if blob is None:
        return []
    document = json.loads(blob.download_as_bytes())
    if document.get("forja_queue_mirror") != rules().MIRROR_VERSION:
        raise errors.ForjaError(f"gs://{bucket}/{name} is not a run queue this forja reads "
                                f"(forja_queue_mirror {document.get('forja_queue_mirror')!r})")
    return [e for e in document.get("entries") or [] if isinstance(e, dict) and e.get("run")]


def resend(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The queue keywords of `train` that put a mirrored entry back in its place: its priority, its
    timeout and its peak as its host took it (a declared or planned one is sent; one the host read from
    the run spec or an earlier run, the new host reads again). A run that was waiting keeps when it was
    queued (`queued_at`), so the time it waited goes on counting on the new VM; one that was running
    had its wait recorded when it was admitted, and waits anew to resume."""
    how: dict[str, Any] = {"queue": True, "priority": int(entry.get("priority") or 0)}
    queued_at = entry.get("enqueued_at")
    if not entry.get("admitted_at") and type(queued_at) in (int, float):  # a bool is no time
        how["queued_at"] = float(queued_at)
    if isinstance(entry.get("timeout_s"), int):  # 0: no limit; absent: the default
        how["queue_timeout_s"] = entry["timeout_s"]
    mib = entry.get("gpu_memory_mib")
    if isinstance(mib, int) and entry.get("memory_source") == "declared":
        how["gpu_memory"] = f"{mib}MiB"
    return how


@contextlib.contextmanager
def requeued(session: Session, entry: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """`train`'s keywords that queue a mirrored entry again on the VM a zone move made: the run's
    snapshot (its config, code, script, arguments, exclusions, processes, hooks and -e variables:
    forja.snapshot.again, whose temporary worktree of the run's commit and patch, when the project
    moved on, lives while the context does), under its own name, not waited for, with the consent it
    was first sent with (`yes`), and its place in the queue (`resend`). A run with no snapshot in this
    history, or whose commit is gone, is refused there (a ForjaError) before anything is sent."""
    from forja import snapshot

    run = str(entry["run"])
    with snapshot.again(session, run) as again:
        yield {**again.keywords(), "name": run, "wait": False, "yes": True, **resend(entry)}


def restore(
    session: Session, entries: list[dict[str, Any]], send: Callable[..., Any], *, skip: str | None = None,
    say: Callable[[str], None] = print,
) -> list[str]:
    """Send each mirrored entry again, in order, as a queued run with its original options and its
    place in the queue (`requeued` decides what goes); those that were running resume from their
    checkpoints in the bucket once the new VM's queue admits them. `skip`: the run the watcher already
    sent again. A run that cannot be sent again (no snapshot, its commit gone, refused by `send`) is
    said and left out; the others still go. Returns the runs sent, each with a "queue_restored" event.
    `send` is `forja.training.train` (passed in by the watcher, a layer above both)."""
    sent: list[str] = []
    for entry in entries:
        run = str(entry["run"])
        if run == skip:
            continue
        try:
            with requeued(session, entry) as how:
                send(session, **how)
        except errors.ForjaError as exc:
            say(f"queued run {run} was not sent again: {exc.message.splitlines()[0]}")
            continue
        sent.append(run)
        with contextlib.suppress(errors.ForjaError):
            session.history.record_event(run, "queue_restored", priority=entry.get("priority"),
                                         was=("running" if entry.get("admitted_at") else "queued"))
    return sent
