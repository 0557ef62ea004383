"""`forja train`: check what is run, record it, send it to the inventory's hosts and start it there.

Why apart from following: sending decides everything once (the config and script are checked, the
name is refused or set aside, the history records the run) and then hands the run to
`forja.following`, which looks at it on its hosts for as long as it lasts. A run sent elsewhere (a
Vertex AI job, `forja.vertex`) or watched through preemptions (`forja.managed`) reuses the same two
halves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forja import (
    consent,
    contract,
    cost_report,
    datasets,
    errors,
    following,
    host_contract,
    inventory,
    snapshot,
    trainer_config,
)
from forja import events as ev
from forja import replace as replacement
from forja.defaults import BACKENDS
from forja.runs import RUN_NAME, TrainResult, config_hash, new_run_id, now
from forja.session import Session

if TYPE_CHECKING:
    from forja.vertex_job import VertexOptions

#: The name a play's events give the controller (require_hosts.yml's check runs there): never a VM of the run.
CONTROLLER = "localhost"
#: The rate's source of a run whose send reached no VM: it costs 0, and `forja cost --run` says why.
NO_VM = "no VM was up for it: its send reached none (no host answered), so nothing was billed"

#: The role's refusal of a name whose run completed on the host (roles/trainer_run/tasks/validate.yml):
#: this history may not know that run (another machine sent it), so the host is asked too.
COMPLETED_TASK = "Refuse to send a run under the name of one that completed on this host"


@dataclass(frozen=True)
class RunPlan:
    """What `train` sends: the role variables that say what to run, and what the history records."""

    extravars: dict[str, Any]
    record_path: Path
    name_source: Path
    #: What of the config only the run's start can check (forja.trainer_config.Judged.unchecked).
    unchecked: tuple[str, ...] = ()


def plan_run(
    config: str | Path | None, script: str | Path | None, args: Sequence[str], project_dir: Path | None
) -> RunPlan:
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
        return RunPlan(extravars, config_path, config_path, judged.unchecked)
    if project_dir is None:
        raise errors.ConfigError(
            "script", f"{script} is sent with your project; give the project folder (--project)"
        )
    path, relative = project_file("script", str(script), script, project_dir, "your script")
    extravars["trainer_run_command"] = [relative, *map(str, args)]
    return RunPlan(extravars, config_path or path, path)


def project_file(field: str, named: str, given: str | Path, project_dir: Path, what: str) -> tuple[Path, str]:
    """A file the run needs from the project (sent to the host with it): its path here and its path
    relative to the project. A ConfigError naming `field` when it is outside the project or not a
    file; `named` is how the error names it, `what` what the fix asks for."""
    given = Path(given).expanduser()
    path = (given if given.is_absolute() else project_dir / given).resolve()
    try:
        relative = path.relative_to(project_dir).as_posix()
    except ValueError:
        raise errors.ConfigError(
            field, f"{named} is not inside the project {project_dir}; put it there (the project is what "
            "is sent to the host) or give --project"
        ) from None
    if not path.is_file():
        raise errors.ConfigError(
            field, f"{named} is not a file in the project {project_dir} (looked for {path}); give the path "
            f"of {what} relative to the project folder (--project)"
        )
    return path, relative


def plan_hooks(hooks: Mapping[str, str | Path] | None, project_dir: Path | None) -> dict[str, str]:
    """Check the user's hooks before anything is sent; return them as the role takes them
    (trainer_run_hooks: event -> the script's path relative to the project).

    A hook runs on the host from the project that is sent with the run, so each must be an
    executable file inside it; the events are the host contract's (host_contract_hook_events).
    """
    if not hooks:
        return {}
    events = list(host_contract.value("hook_events"))
    example = "e.g. hooks={'stop': 'hooks/push.sh'} (forja train --hook stop=hooks/push.sh)"
    if not isinstance(hooks, Mapping):
        raise errors.ConfigError("hooks", f"{hooks!r} must map events ({', '.join(events)}) to scripts; "
                                 f"{example}")
    if project_dir is None:
        raise errors.ConfigError(
            "hooks", "a hook is a script in your project, sent with the run; give the project folder "
            "(--project)"
        )
    planned: dict[str, str] = {}
    for event, script in hooks.items():
        if event not in events:
            raise errors.ConfigError(
                "hooks", f"{event!r} is not a hook event; the events are {', '.join(events)}; {example}"
            )
        if not isinstance(script, str | Path) or not str(script).strip():
            raise errors.ConfigError("hooks", f"{event}: {script!r} must be the path of a script in the "
                                     "project")
        path, relative = project_file("hooks", f"{event}={script}", script, project_dir, "your hook script")
        if not os.access(path, os.X_OK):
            raise errors.ConfigError(
                "hooks", f"{event}={script} is not executable, and a hook runs as a program (with its #! "
                f"line); make it so: chmod +x {relative} (in {project_dir})"
            )
        planned[event] = relative
    return planned


def train(
    session: Session,
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
    backend: str = BACKENDS[0],
    vertex: VertexOptions | None = None,
    replace: bool = False,
    notify: str | bool | None = None,
    hooks: Mapping[str, str | Path] | None = None,
    hook_timeout_s: int | None = None,
    queue: bool = False,
    priority: int | None = None,
    gpu_memory: str | None = None,
    queue_timeout_s: int | None = None,
    queued_at: float | None = None,
    yes: bool = False,
    ask: Callable[[str], bool] | None = None,
    say: Callable[[str], None] | None = None,
    delete_data_after: bool = False,
    delete_bucket_copy: bool = False,
) -> TrainResult:
    """Send the trainer (and the project), start the run as a systemd unit, follow it, fetch results.

    `backend="vertex"` runs it as a Vertex AI custom job instead (`vertex`: a
    `forja.vertex.VertexOptions`; default g2-standard-8 + NVIDIA_L4 x 1, one replica,
    us-central1): the built-in trainer and `config`, or your `script` with the `project` (its
    requirements.txt, the same exclusions and key checks as for a VM), go as a Python package to
    gs://BUCKET/vertex/packages/<hash>/ (once per content) for Vertex's PyTorch image; your script
    runs under torchrun, `procs` per replica (default one per GPU), with the same run contract as
    on a VM, so trainer.runlib checkpoints to and resumes from the bucket. `vertex.image` runs your
    own container image instead (Artifact Registry or Container Registry), `args` to its entrypoint.
    The job's state changes and its replicas' lines are announced, and the checkpoints, logs,
    summary and model land in gs://BUCKET/vertex/runs/<run>/. Ctrl-C, `wait=False` or `timeout_s`
    stop watching, never the job (`vertex_follow`, `vertex_cancel`).

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

    `notify` posts the run's events (started, finished, failed, stopped) as JSON to a webhook, in
    the background, never failing the run: True reads the URL from the environment variable
    FORJA_NOTIFY_WEBHOOK, else the inventory variable `notify_webhook`; a string is the URL. The
    URL is a secret: it is never logged nor taken from a command line. See forja/notify.py.

    `hooks` maps events to scripts in the project (executable, paths relative to it), e.g.
    `hooks={"stop": "hooks/push.sh", "preemption": "hooks/push.sh", "down": "hooks/sync.sh"}`. Each runs
    on the host once, from the project folder, as the run's user, with FORJA_HOOK_EVENT and the run
    contract (FORJA_RUN, FORJA_RUN_DIR, FORJA_CHECKPOINT_DIR, ...) in its environment: `stop` after
    `forja stop` and `preemption` after any other SIGTERM (Spot's notice), both once the run has
    checkpointed; `down` when `forja down` is about to stop or delete the VM while the run goes on.
    `hook_timeout_s` (None: the role's trainer_run_hook_timeout_s, 10) bounds each; after a stop or a
    preemption a hook gets at most what the checkpoint left of the stop grace. A hook that fails or
    hangs never blocks the stop; its output is in `forja logs`.

    `queue=True` puts the run in its VM's queue instead of starting it (forja/queue.py): the VM starts
    it when it fits on the GPU beside what runs, higher `priority` (an integer) first, then first come
    first served; it keeps its place across a reboot. `gpu_memory` (e.g. "10GiB") is its peak; without
    it the run spec's `gpu_memory:` or an earlier run of the same config says, else it takes the GPU
    alone. A run still waiting after `queue_timeout_s` (default 600; 0: no limit) fails with what it
    waited for. `queued_at` (Unix time) keeps when a run was first queued, on a VM a zone move replaced
    (the managed watcher's restore of the old VM's queue), so its wait goes on counting.
    With `wait=False` it returns at once with status "queued"; `forja queue` lists, moves and cancels.

    The project sent is `project`, else the session's project_dir when it was given, else the
    config's or script's own (its git root; none for a built-in config): forja/project.py. Before
    anything is sent, what will go is said (`say`: files, size, what is left out and why) and the
    inventory's `forja_upload_consent` applies (forja/consent.py): `never` refuses; `ask` asks
    `ask(question)` when given (a person at a terminal) unless `yes`. The run's snapshot (the
    project's git commit and uncommitted changes, the config, these options) is recorded
    (forja/snapshot.py). `delete_data_after` removes the dataset the config reads
    (data_args.source) from the VM once the run completed and exported its model, never after a
    failure; with `delete_bucket_copy`, its bucket copy too (forja.datasets.deletion_after_run).
    """
    if backend != BACKENDS[0]:
        unsupported = {"extravars": dict(extravars or {}), "cluster": session.cluster, "replace": replace,
                       "notify": notify, "hooks": dict(hooks or {}), "hook_timeout_s": hook_timeout_s,
                       "queue": queue}
        own = {"script": script, "args": list(args), "project": project, "excludes": list(excludes),
               "procs": procs, "plan": plan_run}  # the VM's check of a script, handed down to forja.vertex
        return _train_vertex(session, config, backend, vertex, unsupported, own=own, name=name, wait=wait,
                             fetch=fetch, checkpoints=checkpoints, timeout_s=timeout_s, poll_s=poll_s,
                             on_event=on_event, cancel=cancel)
    project_dir = session.project_folder(project, config, script)
    if script is not None and not project and not session.project_named:
        script = Path(script).expanduser().resolve()  # named from here; sent from its own project
    plan = plan_run(config, script, args, project_dir)
    planned_hooks = plan_hooks(hooks, project_dir)
    if hook_timeout_s is not None and (
        isinstance(hook_timeout_s, bool) or not isinstance(hook_timeout_s, int) or hook_timeout_s < 1
    ):
        raise errors.ConfigError("hook_timeout_s", f"{hook_timeout_s!r} is not a number of seconds >= 1 "
                                 "(omit it: 10)")
    run_id = name or new_run_id(plan.name_source)
    if not RUN_NAME.match(run_id):
        raise errors.ConfigError(
            "name", f"{run_id!r} must be 1-63 letters, digits, '-' or '_' (first a letter or digit)"
        )
    limit, poll = session.follow_limit(timeout_s), session.poll(poll_s)
    if procs is not None and (isinstance(procs, bool) or not isinstance(procs, int) or procs < 1):
        raise errors.ConfigError("procs", f"{procs!r} is not a number >= 1 (omit it: one per GPU)")
    inventory.required(session.inventory)  # no hosts named: stop before the history records a run
    given_config = plan.extravars.get("trainer_run_config")
    config_path = Path(given_config) if given_config else None
    queued = _queue_vars(session, queue, priority, gpu_memory, queue_timeout_s, config_path, queued_at)
    deletion = datasets.deletion_after_run(session, config_path, bucket_copy=delete_bucket_copy,
                                           asked=delete_data_after)
    following.notifications_for(session, notify)  # a missing or non-http(s) webhook: before anything
    session.chosen_cluster()  # nor a cluster the inventory does not have
    given = {**session.extravars, **(extravars or {})}
    _refuse_several_runs(session, given)
    # the last word before sending; surveyed here unless the caller asked already (consent.obtain)
    consent.obtain(session, lambda: consent.for_run(project_dir, excludes, plan.record_path),
                   yes=yes, ask=ask, say=say)
    replaced: replacement.SetAside | None = None
    if name is not None and replace:
        replaced = replacement.set_aside(session, name, plan.record_path, given)
    elif name is not None:
        _refuse_a_completed_name(session, name)
    session.history.start(
        run_id, name=run_id, config_path=str(plan.record_path), config_hash=config_hash(plan.record_path)
    )
    command = plan.extravars.get("trainer_run_command") or [None]
    snapshot.record(session, run_id, project=project_dir, config=config_path, options={
        "script": command[0], "args": command[1:], "excludes": list(excludes), "procs": procs,
        "hooks": planned_hooks, "extravars": given})
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
        **deletion,
        **({"trainer_run_hooks": planned_hooks} if planned_hooks else {}),
        **({"trainer_run_hook_timeout_s": hook_timeout_s} if hook_timeout_s is not None else {}),
        **queued,
        **({"trainer_run_replaced_as": replaced.aside,
            "trainer_run_replaced_bucket_moved": replaced.bucket is not None} if replaced else {}),
        **(extravars or {}),
    }
    history = session.history
    answered: set[str] = set()  # the VMs that ran a task of the send: what a send that ends here cost

    def heard(event: ev.Event) -> None:
        if isinstance(event, ev.TaskOk | ev.TaskFailed) and event.host != CONTROLLER:
            answered.add(event.host)
        if on_event is not None:
            on_event(event)

    try:
        result = session.run("train.yml", vars_, on_event=heard, cancel=cancel, check=False)
    except KeyboardInterrupt:
        _ended_at_send(session, run_id, answered, status="cancelled",
                       message="interrupted while being set up; the unit may have started (forja status)")
        raise
    except errors.ConfigError:  # the inventory did not parse (read first unless --limit): nothing sent
        if replaced:
            replacement.put_back(session, replaced, run_id)
        else:
            history.drop(run_id)
        raise
    except BaseException as exc:
        _ended_at_send(session, run_id, answered, status="failed", message=f"controller error: {exc}")
        following.announce(session, "run_failed", run_id,
                           f"run {run_id} failed to start: {type(exc).__name__}")
        raise
    hosts = sorted(result.stats)
    if result.status in ("canceled", "timeout"):
        _ended_at_send(session, run_id, answered, status="cancelled", hosts=hosts,
                       message="the playbook was cancelled; the unit may still run (forja status)")
        result.raise_for_status()
    if not result.ok:
        first = (result.unreachable or result.failed_tasks or [None])[0]
        why = f"{first.host}: {first.task}: {first.message}" if first else f"rc {result.rc}"
        if first is not None and first.task == COMPLETED_TASK:  # refused before anything changed
            history.drop(run_id)
            raise errors.ConfigError("name", f"{first.message} Nothing was sent.")
        if replaced and not any(t.task == replacement.SET_ASIDE_TASK for t in result.changed_tasks):
            replacement.put_back(session, replaced, run_id)  # the host still holds the old run as it was
        else:
            _ended_at_send(session, run_id, answered, status="failed", hosts=hosts, message=why)
            following.announce(session, "run_failed", run_id, f"run {run_id} failed to start: {why[:300]}")
        result.raise_for_status()
    if queued:
        history.update(run_id, hosts=hosts, status="queued")
        history.record_event(run_id, "queued", hosts=hosts)
    else:
        history.update(run_id, hosts=hosts)
        following.announce(session, "run_started", run_id, f"run {run_id} started on {', '.join(hosts)}")
    published = contract.read_stats(result.artifact_data).price_records  # its VMs, as the play read them
    if published:  # its rate now: settling its cost at its end then reads no inventory
        cost_report.price_run(session, history.get(run_id), published)
    if not wait:
        history.record_event(run_id, "detached", reason="detach")
        return TrainResult(run_id, "queued" if queued else "running", hosts, {}, None, result,
                           detached="detach", unchecked=plan.unchecked)
    followed = following.follow(session, run_id, fetch=fetch, checkpoints=checkpoints, timeout_s=limit or 0,
                                poll_s=poll, on_event=on_event, cancel=cancel)
    return dataclasses.replace(followed, playbook_result=result, unchecked=plan.unchecked)


def _ended_at_send(session: Session, run_id: str, answered: Collection[str], **fields: Any) -> None:
    """Record a run that ended while it was being sent (cancelled, failed on its hosts or before any,
    a controller error) and settle its cost there, once, as every end is (forja.cost_report.settle).

    Its VMs were up for it when one of them ran a task of the send (`answered`): it cost their time from
    its record to now, failed or not, priced from the inventory's record of them (read once; the play
    published none). When none did (unreachable, stopped, no host to act on), it never reached a VM: it
    costs 0, and its rate says why (NO_VM) rather than no figure. A run priced before keeps its rate (a
    zone move's send of a run that already trained)."""
    if answered and "hosts" not in fields:  # an interrupt or a controller error: the VMs that answered
        fields["hosts"] = sorted(answered)
    record = session.history.update(run_id, ended_at=now(), **fields)
    with contextlib.suppress(errors.ForjaError):  # pricing never hides why the send ended
        if not answered:
            cost_report.price_run(session, record, [], no_vm=NO_VM)
        cost_report.settle(session, run_id)


def _queue_vars(
    session: Session, queue: bool, priority: object, gpu_memory: object, timeout_s: object,
    config: Path | None = None, queued_at: object = None,
) -> dict[str, Any]:
    """The role variables of a queued run (forja.queue.plan checks them; `config`, the built-in trainer's,
    for its planned peak); {} for a run that starts now.
    A priority, GPU memory or queue timeout without `queue` is refused: it would be ignored."""
    if not queue:
        given = [n for n, v in (("priority", priority), ("gpu_memory", gpu_memory),
                                ("queue_timeout_s", timeout_s), ("queued_at", queued_at)) if v is not None]
        if given:
            raise errors.ConfigError(given[0], f"{' and '.join(given)}: only for a queued run, ignored "
                                     "otherwise; add --queue (queue=True), or leave it out")
        return {}
    from forja import queue as run_queue  # the queue's checks load the host's rules only when asked

    return run_queue.plan(session, priority=priority, gpu_memory=gpu_memory, timeout_s=timeout_s,
                          config=config, queued_at=queued_at)


def _train_vertex(
    session: Session, config: str | Path | None, backend: str, options: VertexOptions | None,
    unsupported: dict[str, Any], *, on_event: Callable[[ev.Event], None] | None = None, **how: Any,
) -> TrainResult:
    """`train(backend="vertex")`: forja/vertex.py does the work (its docstring says why so)."""
    from forja import vertex

    if backend not in BACKENDS:
        raise errors.ConfigError("backend", f"{backend!r} is not vm (the inventory's VM) or vertex")
    return vertex.train(session, config, options=options, unsupported=unsupported,
                        emit=session.fan_out(on_event), **how)


def _refuse_several_runs(session: Session, extravars: Mapping[str, Any]) -> None:
    """`forja train` follows one run; a play over a VM and a cluster (or two VMs) starts one run on
    each (trainer_run groups nodes by cluster). Refused before anything is sent, naming what the
    inventory holds and how to choose. A cluster named (--cluster), a --limit or -e forja_hosts
    is the user's choice and is not second-guessed.
    """
    if session.cluster is not None or session.limit or "forja_hosts" in extravars:
        return
    targets = inventory.run_targets(inventory.read(inventory.required(session.inventory)))
    if len(targets) > 1:
        raise errors.ConfigError(
            "--cluster", f"the inventory holds {len(targets)} runs' hosts: {'; '.join(targets)}. forja "
            "train follows one run: choose a cluster with --cluster NAME, or a VM with --limit HOST. To "
            "train several hosts as one run, give them the same forja_cluster and each its "
            "forja_node_rank in the inventory (the gcp_gpu inventory does it for gcp_instance_count > 1)",
        )


def _refuse_a_completed_name(session: Session, name: str) -> None:
    """A name is a run's identity on its host (its folder, unit and checkpoints): sending a new
    run under a completed run's name started nothing (a completed run is never re-run) and
    reported the old run's results as the new one's, with its events. Refused, naming the run.

    A run that ended otherwise (preempted, stopped, failed, diverged) may be sent again under
    its name: that resumes it from its newest checkpoint, as the trainer always does.
    """
    try:
        old = session.history.get(name)
    except errors.RunNotFound:
        return
    if old.status == "completed":
        where = f" on {', '.join(old.hosts)}" if old.hosts else ""
        when = old.ended_at or old.started_at
        raise errors.ConfigError(
            "name", f"run {name!r} already completed ({when}{where}); a new run needs a new --name "
            f"(e.g. {name}-2), or --replace to keep the old one as {name}-replaced-<time> and start "
            f"afresh. Its results stay under its name: forja runs, forja cost --run {name}, "
            f"forja fetch {name}",
        )
