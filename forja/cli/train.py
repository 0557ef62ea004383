"""`forja train | watch | follow`: start a run and follow it to its end, or keep a Spot VM's run going.

`train` and `follow` share the follow-and-print path of forja/cli/common.py (`follow_command`) with
`forja vertex follow`; a Vertex job (`--backend vertex`) takes the same path with the job's own
options, which this module turns into the API's `VertexOptions`. The managed options' defaults
(`--max-recoveries`, `--max-down`, `--poll`) are the watcher's own (forja/defaults.py, which
forja.managed reads too); the modules that send and watch load when a command runs, not for help.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand

from forja.cli.common import (
    RUN_GOES_ON,
    ClusterOption,
    Help,
    NotifyOption,
    YesOption,
    asker,
    console,
    exit_on_error,
    follow_command,
    forja_for,
    global_options,
    out,
    verb,
)
from forja.defaults import BACKENDS, MANAGED_POLL_S, MAX_DOWN, MAX_RECOVERIES
from forja.errors import ConfigError, ForjaError
from forja.vertex_job import DEFAULT_REGION, VertexOptions

if TYPE_CHECKING:
    from forja.managed import RecoveryBudget

#: No name: its verbs are the root's own (`forja train`), registered in forja/cli/__init__.py.
commands = typer.Typer()

FOLLOWING = ("Following has no time limit: it lasts as long as the run, hours or days. Ctrl-C stops "
             "following and leaves the run going (exit 7); so does an expired --timeout. forja follow NAME "
             "picks it up again, forja stop NAME ends it.")


class _ScriptArgsCommand(TyperCommand):
    """Keeps everything after the first `--` for the user's script (`--script train.py -- --lr 3e-4`)
    instead of letting it fill the command's own positional arguments."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["forja_script_args"] = args[cut + 1:]
            args = args[:cut]
        return super().parse_args(ctx, args)


# The watcher's options (`train --managed`, `watch`), then the Vertex job's (`train --backend vertex`).
FallbackZones = Annotated[
    list[str] | None,
    typer.Option("--fallback-zone", help="A zone to move the run's VM to when its own has no capacity "
                 "left (repeat it; tried in order, the zone that just failed last)."),
]
MaxRecoveries = Annotated[
    int, typer.Option("--max-recoveries", help="Most restarts and zone moves, all together.")
]
MaxDown = Annotated[str, typer.Option("--max-down", help="Most time down, all outages together (e.g. 6h).")]
MaxDownUsd = Annotated[
    float | None, typer.Option("--max-down-usd", help="Most dollars spent while down (the disk bills).")
]
Poll = Annotated[float, typer.Option("--poll", help="Seconds between looks at the VM (the watcher).")]
Backend = Annotated[str, typer.Option("--backend", help=(
    "vm: the inventory's VM; vertex: a Vertex AI custom job: the built-in trainer on CONFIG, or your "
    "--script with --project (torchrun, --procs per replica: one per GPU), or your --image; e.g. "
    "forja train --script train.py --backend vertex --bucket gs://B --machine-type g2-standard-24 "
    "--accelerator-count 2 -- --lr 3e-4 (`forja vertex --help`)."))]
VertexBucket = Annotated[str | None, typer.Option(
    "--bucket", help="vertex: gs://BUCKET for the package and the results (default: the inventory's "
    "gcp_bucket_name).")]
VertexRegion = Annotated[str | None, typer.Option("--region", help="vertex: the region (us-central1).")]
VertexMachine = Annotated[str | None, typer.Option("--machine-type", help="vertex: the machine of each "
                                                   "replica (default: the VM's, g2-standard-8).")]
VertexAccelerator = Annotated[str | None, typer.Option("--accelerator", help="vertex: e.g. NVIDIA_L4 "
                                                       "(default: what the machine type carries).")]
VertexAcceleratorCount = Annotated[int | None, typer.Option("--accelerator-count", help="vertex: GPUs per "
                                                            "replica (default: the machine type's).")]
VertexReplicas = Annotated[int, typer.Option("--replicas", help="vertex: machines in all (DDP across them).")]
VertexImage = Annotated[str | None, typer.Option(
    "--image", help="vertex: run your own container image (Artifact Registry or Container Registry, e.g. "
    "us-central1-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG) with forja's run variables (FORJA_RUN, "
    "FORJA_CHECKPOINT_DIR, ...) in its environment; the arguments after -- go to its entrypoint. forja "
    "builds no images.")]


TRAIN = Help(
    "Send the trainer (or your own script) and your project to the VM, start the run, follow it "
    "to its end and fetch its results.",
    f"""What runs: the built-in trainer on CONFIG (a trainer YAML), or your own --script from your
    --project with its arguments after --. Both are checked before anything is sent. The project sent
    is --project, else the config's or script's own folder (its git root); what goes, its size and
    what is left out (and why) is shown first, and you are asked at a terminal unless --yes.

    The run is a systemd unit on the VM: it goes on when this command stops following. It is
    recorded in the history (forja runs) before it starts, with a snapshot of its code (forja runs
    --show NAME; forja train --again NAME sends it again). A completed run's --name is refused;
    --replace reuses the name of one that ended. At its end it shows the run's cost as forja runs does
    (its VMs' time for the run and their disks; cost_usd under --json) and, of which, the trainer's
    own count (training_usd).

    {FOLLOWING}

    Elsewhere: --backend vertex sends it as a Vertex AI custom job (its own --bucket, --region,
    --machine-type, ...); --managed watches a Spot VM's run and recovers it (as forja watch); --queue
    puts it in the VM's run queue; --cluster runs it on every member of a cluster.""",
    examples=(
        "forja train trainer/configs/digits.yaml --name lr3",
        "forja train --script train.py --project ~/my-project -- --lr 3e-4",
        "forja train trainer/configs/gpt.yaml --managed --fallback-zone us-east1-b --detach",
        "forja train --again lr3 --name lr3-again",
    ),
    see_also=("forja follow", "forja logs", "forja runs", "forja stop", "forja plan", "forja queue"),
)


@verb(TRAIN, register=commands.command, cls=_ScriptArgsCommand, on_interrupt=RUN_GOES_ON)
def train(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Argument(help="Trainer config YAML (e.g. trainer/configs/digits.yaml); optional with --script"),
    ] = None,
    script: Annotated[
        Path | None,
        typer.Option("--script", "-s", help="Your own script in the project, run instead of the built-in "
                     "trainer; its arguments go after --, e.g. --script train.py -- --lr 3e-4."),
    ] = None,
    project: Annotated[
        Path | None, typer.Option("--project", "-p", help="Your project folder to send with the trainer.")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Run name (default: config or script name + time).")
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Reuse the --name of an ended run: the old run is kept as "
                           "NAME-replaced-<time> (history, results, its folder on the VM, its checkpoints "
                           "in the bucket) and the new one starts afresh.")
    ] = False,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", "-x", help="Extra glob to keep out of the upload.")
    ] = None,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Start the run, print its id and return at once.")
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", help="Stop following after S seconds; the run goes on (exit 7). "
                     "Default: follow the run until it ends, however long."),
    ] = None,
    procs: Annotated[
        int | None,
        typer.Option("--procs", help="Processes per host (DDP under torchrun; with --backend vertex, per "
                     "replica). Default: one per GPU, or trainer_run_cpu_procs on a host without a GPU."),
    ] = None,
    checkpoints: Annotated[bool, typer.Option("--checkpoints", help="Also fetch checkpoints.")] = False,
    cluster: ClusterOption = None,
    managed: Annotated[
        bool, typer.Option("--managed", help="Send the run, then watch it (as `forja watch`): a preempted "
                           "VM is started again, one out of capacity moved to a --fallback-zone.")
    ] = False,
    fallback_zone: FallbackZones = None,
    max_recoveries: MaxRecoveries = MAX_RECOVERIES,
    max_down: MaxDown = MAX_DOWN,
    max_down_usd: MaxDownUsd = None,
    poll: Poll = MANAGED_POLL_S,
    backend: Backend = BACKENDS[0],
    bucket: VertexBucket = None,
    region: VertexRegion = None,
    machine_type: VertexMachine = None,
    accelerator: VertexAccelerator = None,
    accelerator_count: VertexAcceleratorCount = None,
    replicas: VertexReplicas = VertexOptions.replica_count,
    image: VertexImage = None,
    notify: NotifyOption = False,
    hook: Annotated[
        list[str] | None,
        typer.Option("--hook", help="EVENT=SCRIPT: run an executable script of the project on the host when "
                     "the run is stopped (stop: forja stop), preempted (preemption) or its VM taken down "
                     "(down: forja down), after the checkpoint; repeat it per event, e.g. "
                     "--hook stop=hooks/push.sh --hook preemption=hooks/push.sh. Its output: forja logs.")
    ] = None,
    hook_timeout: Annotated[
        int | None, typer.Option("--hook-timeout", help="Seconds a hook may run before it is killed (default "
                                 "10; after a stop, at most what the checkpoint left of the stop grace).")
    ] = None,
    queue: Annotated[
        bool, typer.Option("--queue", help="Put the run in its VM's queue instead of starting it now: the VM "
                           "starts it when it fits on the GPU, and it keeps its place across a reboot. "
                           "`forja queue` lists, moves and cancels. E.g. forja train digits.yaml --queue "
                           "--gpu-memory 6GiB --detach")
    ] = False,
    priority: Annotated[
        str | None, typer.Option("--priority", help="With --queue: an integer, higher starts first "
                                 "(default 0; the same priority goes first come first served).")
    ] = None,
    gpu_memory: Annotated[
        str | None, typer.Option("--gpu-memory", help="With --queue: the run's peak GPU memory, e.g. "
                                 "10GiB, so it may share the GPU. Default: the run spec's gpu_memory, else "
                                 "an earlier run of the same config's peak, else unknown (it takes the GPU "
                                 "alone).")
    ] = None,
    queue_timeout: Annotated[
        int | None, typer.Option("--queue-timeout", help="With --queue: seconds it may wait before it is "
                                 "failed with what it waited for (default 600; 0: no limit).")
    ] = None,
    yes: YesOption = False,
    again: Annotated[
        str | None, typer.Option("--again", help="Send run RUN again from its snapshot: the same config, "
                                 "script, arguments and options, and the same code (its commit and "
                                 "uncommitted changes, checked out in a temporary worktree when your tree "
                                 "differs). forja runs --show RUN shows the snapshot; e.g. forja train "
                                 "--again digits-1.")
    ] = None,
    delete_data_after: Annotated[
        bool, typer.Option("--delete-data-after", help="Remove the run's dataset (its config's "
                           "data_args.source, pushed with forja data push) from the VM's disk once the run "
                           "completed and exported its model; never after a failed or stopped run.")
    ] = False,
    delete_bucket_copy: Annotated[
        bool, typer.Option("--delete-bucket-copy", help="With --delete-data-after: remove its bucket copy "
                           "too (gs://BUCKET/datasets/NAME; files another dataset shares are kept).")
    ] = False,
) -> None:
    from forja import consent  # what sends and asks loads when a run is sent, never for --help

    args = list(ctx.meta.get("forja_script_args", []))
    hooks = _hooks(hook or [])
    # Asked here, before the progress display starts (and once: a managed run is sent again unattended).
    sending = {"yes": True, "delete_data_after": delete_data_after, "delete_bucket_copy": delete_bucket_copy}
    consenting = {"yes": yes, "ask": asker(ctx), "say": _said}
    if again is not None:
        if config is not None or script is not None:
            raise ConfigError("--again", "takes the run's own config and script: leave CONFIG and --script "
                              "out")
        vertex = None if backend == BACKENDS[0] else _vertex_options(
            bucket, region, machine_type, accelerator, accelerator_count, replicas, image)
        watched = {"fallback_zones": fallback_zone or [], "poll_s": poll,
                   "budget": _budget(max_recoveries, max_down, max_down_usd)} if managed else None
        _train_again(ctx, again, name, sending, consenting, detach=detach, timeout=timeout, cluster=cluster,
                     checkpoints=checkpoints, notify=notify, backend=backend, vertex=vertex, managed=watched)
        return
    judged = _judge(ctx, config, script)
    if image and backend == BACKENDS[0]:
        raise ConfigError("--image", f"{image} would run on Vertex AI only: add --backend vertex")
    if backend != BACKENDS[0]:  # the same follow and printing, the job's own options
        options = _vertex_options(bucket, region, machine_type, accelerator, accelerator_count, replicas,
                                  image)
        follow_command(ctx, lambda f, interrupted: f.train(
            config, script=script, args=args, project=project, name=name, excludes=exclude or [],
            wait=not detach, checkpoints=checkpoints, timeout_s=timeout, procs=procs, cancel=interrupted,
            backend=backend, vertex=options, replace=replace, notify=notify, hooks=hooks,
            hook_timeout_s=hook_timeout, queue=queue), timeout, cluster)  # fmt: skip
        return
    if judged is not None:
        _show_estimate(ctx, judged, cluster)
    if managed and queue:
        raise ConfigError("--queue", "a --managed run starts at once and is watched; queue it without "
                          "--managed (a queued run resumes after a reboot as any other)")
    if managed:
        with exit_on_error(ctx, RUN_GOES_ON):
            budget = _budget(max_recoveries, max_down, max_down_usd)
            consent.ask_once(forja_for(ctx, cluster=cluster), project, config, script, exclude or [],
                             **consenting)
            why = forja_for(ctx, cluster=cluster).train_managed(
                config, fallback_zones=fallback_zone or [], budget=budget, poll_s=poll, say=_say,
                script=str(script) if script else None, args=args, project=str(project) if project else None,
                name=name, excludes=exclude or [], procs=procs, replace=replace, notify=notify, hooks=hooks,
                hook_timeout_s=hook_timeout, **sending)
            out.print(why)
        return
    with exit_on_error(ctx, "cancelled"):  # a Ctrl-C at the question: nothing was sent
        consent.ask_once(forja_for(ctx, cluster=cluster), project, config, script, exclude or [],
                         **consenting)
    follow_command(
        ctx,
        lambda f, interrupted: f.train(
            config, script=script, args=args, project=project, name=name, excludes=exclude or [],
            wait=not detach, checkpoints=checkpoints, timeout_s=timeout, procs=procs, cancel=interrupted,
            replace=replace, notify=notify, hooks=hooks, hook_timeout_s=hook_timeout,
            queue=queue, priority=priority, gpu_memory=gpu_memory, queue_timeout_s=queue_timeout, **sending,
        ),
        timeout,
        cluster,
    )


def _train_again(ctx: typer.Context, run: str, name: str | None, sending: dict[str, Any],
                 consenting: dict[str, Any], *, detach: bool, timeout: float | None, cluster: str | None,
                 checkpoints: bool, notify: bool, backend: str = BACKENDS[0],
                 vertex: VertexOptions | None = None, managed: dict[str, Any] | None = None) -> None:
    """`forja train --again RUN`: the run's snapshot sent as a new run (forja/snapshot.py says how the
    code is put back), on the VM, as a Vertex AI job, or managed (`managed`: the watcher's zones, budget
    and poll; forja/again.py says how a zone move puts the code back); the temporary worktree, if one
    was needed, is removed when this returns."""
    from forja import consent, snapshot
    from forja.runs import new_run_id

    with snapshot.again(forja_for(ctx), run) as plan:
        _say(plan.said)
        how = {**plan.keywords(backend), "name": name or new_run_id(plan.name_source)}
        if "extravars" in how:
            how["extravars"] = {**how["extravars"], **global_options(ctx).extravars}
        script = (plan.project / how["script"]) if plan.project and how["script"] else None
        consent.ask_once(forja_for(ctx, cluster=cluster), plan.project, plan.config, script, how["excludes"],
                         **consenting)
        if managed is not None:
            with exit_on_error(ctx, RUN_GOES_ON):
                out.print(forja_for(ctx, cluster=cluster).train_managed(
                    how.pop("config"), say=_say, notify=notify, again=run, **managed, **how, **sending))
            return
        follow_command(ctx, lambda f, interrupted: f.train(
            wait=not detach, checkpoints=checkpoints, timeout_s=timeout, cancel=interrupted, notify=notify,
            backend=backend, vertex=vertex, **how, **sending), timeout, cluster)  # fmt: skip


def _hooks(given: list[str]) -> dict[str, str]:
    """`--hook EVENT=SCRIPT` (repeated) as the API's `hooks`; the API checks the events and the scripts."""
    hooks: dict[str, str] = {}
    for item in given:
        event, sep, script = item.partition("=")
        if not sep or not event.strip() or not script.strip():
            raise ConfigError("--hook", f"{item!r} must be EVENT=SCRIPT, e.g. --hook stop=hooks/push.sh")
        if event.strip() in hooks:
            raise ConfigError("--hook", f"{event.strip()} is given twice ({hooks[event.strip()]}, {script}); "
                              "give one script per event")
        hooks[event.strip()] = script.strip()
    return hooks


def _judge(ctx: typer.Context, config: Path | None, script: Path | None) -> Path | None:
    """The trainer's check of CONFIG, first: a config it refuses gets its error (and no estimate).
    A valid one (returned) gets the line saying what only the run's start can check (under --json,
    the result's `unchecked`). None when there is no config to judge: train's own error says why."""
    if config is None or script is not None or not config.is_file():
        return None
    from forja import trainer_config
    with exit_on_error(ctx, "cancelled"):
        judged = trainer_config.judge(config.resolve())
    if not global_options(ctx).json:
        console.print(judged.said, soft_wrap=True, highlight=False)
    return config


def _vertex_options(
    bucket: str | None,
    region: str | None,
    machine_type: str | None,
    accelerator: str | None,
    accelerator_count: int | None,
    replicas: int,
    image: str | None = None,
) -> VertexOptions:
    """`forja train --backend vertex`'s options as the API's VertexOptions (None: its default)."""
    return VertexOptions(bucket=bucket, region=region or DEFAULT_REGION, machine_type=machine_type,
                         accelerator_type=accelerator, accelerator_count=accelerator_count,
                         replica_count=replicas, image=image)  # fmt: skip


def _show_estimate(ctx: typer.Context, config: Path, cluster: str | None = None) -> None:
    """`forja train`'s estimate before sending (stderr): a run not priced says why and goes on; a
    cluster the inventory does not have is the command's error, said once, before anything is sent. An
    inventory file that cannot be read is too, said once: by the command, when it needs the hosts."""
    try:
        found = forja_for(ctx, cluster=cluster).estimate(config)
    except ForjaError as exc:
        if getattr(exc, "field", None) == "--cluster":
            raise
        if not getattr(exc, "source", ""):
            console.print(f"no cost estimate: {exc.message}", soft_wrap=True, highlight=False, markup=False)
        return
    console.print(found.describe(), soft_wrap=True, highlight=False)


def _budget(recoveries: int, down: str, down_usd: float | None) -> RecoveryBudget:
    """The watcher's budget from the options (the API checks it, with the zones, before anything runs)."""
    from forja.managed import RecoveryBudget, seconds

    return RecoveryBudget(recoveries, seconds(down, "--max-down"), down_usd)


def _said(text: str) -> None:
    """What will be sent (stderr); paths are text, never rich markup."""
    console.print(text, soft_wrap=True, highlight=False, markup=False)


def _say(line: str) -> None:
    """A watcher's line for people (stderr, as progress is)."""
    console.print(line, soft_wrap=True, highlight=False)


WATCH = Help(
    "Keep a run going on a Spot VM with nobody at the keyboard, until it ends or the budget is spent.",
    """A preempted VM is started again in its zone; one whose zone has no capacity left (or that is
    gone) is made again in the next --fallback-zone, set up with the same playbooks, and the run is
    sent again, resuming from its newest checkpoint in the bucket. --max-recoveries, --max-down and
    --max-down-usd say when to stop trying. One watcher per run: a second one is refused, naming the
    first. Every step goes into the run's history; it prints why watching ended. forja train
    --managed sends a run and watches it in one command.""",
    examples=(
        "forja watch lr3 --fallback-zone us-east1-b --fallback-zone us-central1-a",
        "forja watch lr3 --max-down 2h --max-down-usd 1.50 --notify",
    ),
    see_also=("forja train --managed", "forja zones", "forja runs"),
)


@verb(WATCH, register=commands.command, on_interrupt=RUN_GOES_ON)
def watch(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    fallback_zone: FallbackZones = None,
    max_recoveries: MaxRecoveries = MAX_RECOVERIES,
    max_down: MaxDown = MAX_DOWN,
    max_down_usd: MaxDownUsd = None,
    poll: Poll = MANAGED_POLL_S,
    notify: NotifyOption = False,
) -> None:
    budget = _budget(max_recoveries, max_down, max_down_usd)
    why = forja_for(ctx).watch(name, fallback_zones=fallback_zone or [], budget=budget, poll_s=poll, say=_say,
                               notify=notify)
    out.print(f"run {name}: {why}")


FOLLOW = Help(
    "Follow a run that was started until it ends, however long, then fetch its results.",
    f"""Shows its progress (step, loss) as it goes and writes it into the history. A run that ends
    other than completed (failed, preempted, stopped) exits 1 with what its host reported; a run
    that diverged (NaN or Inf loss) exits 8.

    {FOLLOWING}""",
    examples=(
        "forja follow lr3",
        "forja follow lr3 --timeout 600 --no-fetch",
        "forja follow lr3 --checkpoints --json",
    ),
    see_also=("forja train", "forja logs", "forja status", "forja fetch"),
)


@verb(FOLLOW, register=commands.command, on_interrupt=RUN_GOES_ON)
def follow(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", help="Stop following after S seconds; the run goes on (exit 7)."),
    ] = None,
    fetch_results: Annotated[
        bool, typer.Option("--fetch/--no-fetch", help="Fetch the results when the run completes.")
    ] = True,
    checkpoints: Annotated[bool, typer.Option("--checkpoints", help="Also fetch checkpoints.")] = False,
    cluster: ClusterOption = None,
) -> None:
    follow_command(
        ctx,
        lambda f, interrupted: f.follow(
            name, fetch=fetch_results, checkpoints=checkpoints, timeout_s=timeout, cancel=interrupted
        ),
        timeout,
        cluster,
    )


