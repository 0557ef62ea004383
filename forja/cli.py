"""The `forja` command: a thin typer/rich shell over `forja.api.Forja`.

Every verb is a `Forja` method, registered with `verb(Forja.method)`: the command's help is the
method's docstring (one text for the API and the CLI), and every error takes one path (`_errors`):
a `ForjaError` prints its message (or one JSON document under `--json`) and exits with its code.
The commands only parse options, call the method and print. Exit codes mean something (see
`ExitCode`): 0 ok, 1 a playbook task failed, 2 bad usage or input, 3 a host is unreachable,
4 cancelled, 5 not found, 6 the VM is stopped (the message says since when and why; `forja up`
starts it), 7 the command stopped following a run that goes on (`--timeout` expired, or Ctrl-C:
not a failure of the run).

Tables show numbers for people (`forja.format`: `0.008180`, `0.2¢`, `$0.71/h`, `2h 05m`);
`--json` prints the API's values at full precision.

Other parts add their commands in the "Commands from other parts" block at the end, one
line each, so this file stays the single entry point (`forja = forja.cli:app`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import inspect
import json
import re
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperCommand

from forja import format as fmt
from forja import trainer_config
from forja.api import Forja
from forja.errors import ConfigError, ExitCode, ForjaError
from forja.token_file import read_private
from trainer import finite
from trainer.summary import HEADLINE

EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 a playbook task failed, 2 bad usage or input, 3 a host is unreachable, "
    "4 cancelled, 5 run not found, 6 the VM is stopped (start it with `forja up`), "
    "7 stopped following a run that goes on (--timeout, Ctrl-C), "
    "8 the run diverged (NaN or Inf loss) and was stopped."
)
#: What Ctrl-C means to a command that may have started a training run.
RUN_GOES_ON = ("interrupted; a run already started keeps going on the host "
               "(forja status / forja logs -f NAME / forja stop NAME)")

app = typer.Typer(
    name="forja",
    help="Reproducible GPU training hosts: provision, configure, train, fetch, stop. " + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
cost_app = typer.Typer(name="cost", invoke_without_command=True, no_args_is_help=False)
console = Console(stderr=True)  # progress, errors


class _Out:
    """The command's result on stdout: the terminal's width, or 160 columns when piped or captured,
    so that a table in a log or a script's capture never cuts names and numbers to 80 columns."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        screen = Console()
        (screen if screen.is_terminal else Console(width=160)).print(*objects, **kwargs)


out = _Out()

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass
class Options:
    """Global options, shared by every command through typer's context."""

    inventory: str | None = None
    limit: str | None = None
    json: bool = False
    host_key_checking: bool = True
    extravars: dict[str, Any] = dataclasses.field(default_factory=dict)


#: What Ansible (and Python) accept as a variable name: a key with a space or a newline names nothing.
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _parse_extravars(pairs: list[str]) -> dict[str, Any]:
    """`-e key=value` pairs; values are parsed as JSON when they look like JSON, else kept as text."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint="--extra-var/-e")
        if not VARIABLE_NAME.match(key):  # Ansible would take it, and no role would ever read it
            raise typer.BadParameter(
                f"{key!r} is not a variable name (letters, digits and '_', not starting with a digit; "
                "e.g. trainer_run_wait_timeout_s=600)", param_hint="--extra-var/-e")
        try:
            parsed[key] = json.loads(value)
        except ValueError:
            parsed[key] = value
    return parsed


@app.callback()
def main(
    ctx: typer.Context,
    inventory: Annotated[
        str | None,
        typer.Option("--inventory", "-i",
                     help="inventory/gcp_gpu.yml (Google Cloud) or inventory/sandbox (the local sandbox); "
                          "default: $FORJA_INVENTORY."),
    ] = None,
    limit: Annotated[
        str | None, typer.Option("--limit", "-l", help="Only these hosts (Ansible pattern).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document for scripts.")] = False,
    host_key_checking: Annotated[
        bool,
        typer.Option(
            "--host-key-checking/--no-host-key-checking",
            help="Verify SSH host keys (on by default; the sandbox's throwaway hosts turn it off).",
        ),
    ] = True,
    extra_var: Annotated[
        list[str] | None, typer.Option("--extra-var", "-e", help="KEY=VALUE passed to the playbooks.")
    ] = None,
) -> None:
    """Reproducible GPU training hosts on Google Cloud (or the local sandbox)."""
    ctx.obj = Options(
        inventory=inventory,
        limit=limit,
        json=as_json,
        host_key_checking=host_key_checking,
        extravars=_parse_extravars(extra_var or []),
    )


def _opts(ctx: typer.Context) -> Options:
    obj = ctx.find_object(Options)  # set by `main` on the root context; sub-apps (cost) look up
    return obj if isinstance(obj, Options) else Options()


def _forja(
    ctx: typer.Context, on_event: Callable[[Any], None] | None = None, cluster: str | None = None
) -> Forja:
    """The API object, built from the global options. Which inventory (-i, else FORJA_INVENTORY) is
    the API's rule (`forja.inventory.chosen`); a verb that needs hosts and has none named stops
    there with the choices, before anything runs, while the history and price lookups need none."""
    o = _opts(ctx)
    return Forja(
        inventory=o.inventory,
        extravars=o.extravars,
        host_key_checking=o.host_key_checking,
        limit=o.limit,
        on_event=on_event,
        cluster=cluster,
    )


# -- the one error path and the one way to register a verb -------------------------------------
def _error_fields(exc: ForjaError) -> dict[str, Any]:
    keys = ("host", "task", "field", "status", "since", "why")
    return {k: getattr(exc, k) for k in keys if getattr(exc, k, None)}


@contextmanager
def _errors(ctx: typer.Context, on_interrupt: str) -> Iterator[None]:
    """Map what a verb raises to its exit code: a ForjaError's own code (its message, or one JSON
    document under --json), Ctrl-C that reached here 4 (cancelled). Click's usage errors pass."""
    as_json = _opts(ctx).json
    try:
        yield
    except ForjaError as exc:
        if as_json:
            _emit_json({"error": type(exc).__name__, "message": exc.message, **_error_fields(exc)})
        else:
            console.print(f"[bold red]error:[/] {exc.message}", soft_wrap=True)
        raise typer.Exit(int(exc.exit_code)) from exc
    except KeyboardInterrupt as exc:
        console.print(f"[yellow]{on_interrupt}[/]", soft_wrap=True)
        raise typer.Exit(int(ExitCode.CANCELLED)) from exc


_SECTION = re.compile(r"^(Args|Arguments|Returns|Raises|Yields):\s*$")


def _doc(method: Callable[..., Any]) -> str:
    """The method's docstring without its Python-only sections (Args, Returns, ...), each paragraph
    on one line so that the help reflows it to the terminal's width."""
    lines = (inspect.getdoc(method) or "").splitlines()
    for i, line in enumerate(lines):
        if _SECTION.match(line):
            lines = lines[:i]
            break
    paragraphs = "\n".join(lines).strip().split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def verb(
    method: Callable[..., Any],
    name: str | None = None,
    *,
    on_interrupt: str = "cancelled",
    register: Callable[..., Callable[[F], F]] | None = None,
    **settings: Any,
) -> Callable[[F], F]:
    """Register a command for a `Forja` method: its help is the method's docstring, its errors go
    through `_errors`. `settings` go to typer (e.g. `epilog` for what only the command does)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def command(ctx: typer.Context, *args: Any, **kwargs: Any) -> Any:
            with _errors(ctx, on_interrupt):
                return fn(ctx, *args, **kwargs)

        command.__doc__ = None
        add = register or app.command
        options = {"help": _doc(method), **settings}
        decorator = add(name, **options) if name is not None else add(**options)
        return decorator(command)  # type: ignore[no-any-return]

    return decorate


# -- printing -----------------------------------------------------------------------------------
def _emit_json(obj: Any) -> None:
    """What --json prints: full precision, and a NaN or Inf figure (a diverged run's loss, a live
    fp16 overflow) as null plus a ``nonfinite`` flag, as in the run's own files (trainer.finite),
    never the bare ``NaN`` that jq and most JSON readers refuse."""
    sys.stdout.write(finite.dumps(fmt.plain(obj, drop=("events",)), indent=2, default=str) + "\n")


def _steps(step: int | None, total: int | None) -> str:
    if step is None:
        return ""
    return f"{fmt.count(step)}/{fmt.count(total)}" if total else fmt.count(step)


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[Any], None] | None]:
    """A live progress display fed by the API's typed events; silent under --json."""
    if not enabled:
        yield None
        return
    from forja import events as ev

    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[host]}[/]"),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bars: dict[str, Any] = {}

        def bar(host: str) -> Any:
            if host not in bars:
                bars[host] = progress.add_task("starting", total=None, host=host)
            return bars[host]

        def on_event(event: Any) -> None:
            if isinstance(event, ev.TaskStarted):
                progress.update(bar("play"), description=event.task)
            elif isinstance(event, ev.Announcement):
                # escaped: a log line's own brackets ("[rank 0]") are text, not rich markup
                progress.console.print(f"[cyan]{escape(event.host)}[/]: {escape(event.text)}")
            elif isinstance(event, ev.HostStarting):
                progress.console.print(
                    f"{event.host} is {event.status}: starting it (playbooks/{event.playbook})"
                )
            elif isinstance(event, ev.TaskFailed) and not event.ignored:
                progress.console.print(f"[red]failed[/] {event.host}: {event.task}: {event.message}")
            elif isinstance(event, ev.HostUnreachable):
                progress.console.print(f"[red]unreachable[/] {event.host}: {event.message}")
            elif isinstance(event, ev.TrainProgress):
                loss = f" loss {fmt.loss(event.loss)}" if event.loss is not None else ""
                text = f"step {_steps(event.step, event.total_steps)}{loss}"
                progress.update(bar(event.host), completed=event.step, total=event.total_steps or None,
                                description=text)
            elif isinstance(event, ev.PlaybookFinished):
                progress.update(bar("play"), description=f"done ({event.playbook})", total=1, completed=1)

        yield on_event


def _result_table(result: Any) -> Table:
    took = fmt.duration(result.duration_s)
    table = Table(title=f"{result.playbook}: {result.status} (rc {result.rc}, {took})")
    for col in ("host", "ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(col, justify="right" if col != "host" else "left")
    for host, s in sorted(result.stats.items()):
        table.add_row(host, str(s.ok), str(s.changed), str(s.failures), str(s.unreachable), str(s.skipped))
    return table


def _playbooks(ctx: typer.Context, action: Callable[[Forja], Any]) -> None:
    """Run a verb that runs playbooks, with progress; print its recap table(s) or its JSON."""
    o = _opts(ctx)
    with _progress(not o.json) as on_event:
        result = action(_forja(ctx, on_event))
    if o.json:
        _emit_json(result)
    else:
        for one in result if isinstance(result, list) else [result]:
            out.print(_result_table(one))


# -- the host's lifecycle -----------------------------------------------------------------------
@verb(Forja.up)
def up(ctx: typer.Context) -> None:
    _playbooks(ctx, lambda f: f.up())


@verb(Forja.configure)
def configure(ctx: typer.Context) -> None:
    _playbooks(ctx, lambda f: f.configure())


@verb(Forja.down)
def down(
    ctx: typer.Context,
    delete: Annotated[bool, typer.Option("--delete", help="Delete the VM instead of stopping it.")] = False,
) -> None:
    _playbooks(ctx, lambda f: f.down(delete=delete))


# -- training -----------------------------------------------------------------------------------
class _ScriptArgsCommand(TyperCommand):
    """Keeps everything after the first `--` for the user's script (`--script train.py -- --lr 3e-4`)
    instead of letting it fill the command's own positional arguments."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["forja_script_args"] = args[cut + 1:]
            args = args[:cut]
        return super().parse_args(ctx, args)


@contextmanager
def _ctrl_c_sets(event: threading.Event) -> Iterator[None]:
    """The first Ctrl-C sets `event` (stop following, the run goes on; before the run has started it
    cancels the play); a second one interrupts at once."""

    def handler(signum: int, frame: Any) -> None:
        if event.is_set():
            signal.default_int_handler(signum, frame)
        event.set()
        console.print("[yellow]Ctrl-C: stopping (press it again to quit at once)[/]")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


#: The summary fields `forja train` and `forja follow` show, in this order (forja.format shows each):
#: the trainer's headline (trainer.summary), the same as `python -m trainer train` prints.
SUMMARY_SHOWN = HEADLINE
FOLLOWING = ("Following has no time limit. Ctrl-C stops following and leaves the run going (exit 7); "
             "so does an expired --timeout. `forja follow NAME` picks it up again, "
             "`forja stop NAME` ends it.")


def _follow_command(
    ctx: typer.Context, action: Callable[[Forja, threading.Event], Any], timeout: float | None,
    cluster: str | None = None,
) -> None:
    """Run `train` or `follow` with progress; report a run that ended, or one that goes on (exit 7)."""
    o = _opts(ctx)
    interrupted = threading.Event()
    with _ctrl_c_sets(interrupted), _progress(not o.json) as on_event:
        result = action(_forja(ctx, on_event, cluster), interrupted)
    if result.detached is not None:
        _report_detached(result, timeout, o.json)
        return
    if o.json:
        _emit_json(result)
        return
    if result.playbook_result is not None:
        out.print(_result_table(result.playbook_result))
    table = Table(title=f"run {result.run_id}")
    table.add_column("field")
    table.add_column("value")
    for key in SUMMARY_SHOWN:
        table.add_row(key, fmt.field(key, result.summary.get(key)))
    table.add_row("artifacts", str(result.artifact_dir or ""))
    out.print(table)


def _report_detached(result: Any, timeout: float | None, as_json: bool) -> None:
    """A run that goes on: its id on stdout (or JSON), how to follow and stop it on stderr.
    `--detach` exits 0; a `--timeout` that expired or a Ctrl-C exits 7 (the run is not failed)."""
    from forja.api import how_to_follow
    from forja.cli_vertex import is_vertex_job
    from forja.vertex import how_to_follow as how_to_follow_vertex

    if is_vertex_job(result.hosts):
        how_to_follow = how_to_follow_vertex
    limit = f" after the {fmt.duration(timeout)} --timeout" if timeout else ""
    why = {
        "detach": "started",
        "timeout": f"still running{limit}",
        "interrupted": "still running (Ctrl-C stopped following it, not the run)",
    }.get(result.detached, "still running")
    where = f" on {', '.join(result.hosts)}" if result.hosts else ""
    console.print(f"[yellow]run {result.run_id} {why}{where}; it goes on.[/] {how_to_follow(result.run_id)}",
                  soft_wrap=True)  # commands to copy stay on one line
    if as_json:
        _emit_json(result)
    else:
        out.print(result.run_id)
    if result.detached != "detach":
        raise typer.Exit(int(ExitCode.STILL_RUNNING))


@verb(Forja.train, cls=_ScriptArgsCommand, on_interrupt=RUN_GOES_ON, epilog=FOLLOWING)
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
        typer.Option("--procs", help="Processes per host (DDP under torchrun). Default: one per GPU, "
                     "or trainer_run_cpu_procs on a host without a GPU."),
    ] = None,
    checkpoints: Annotated[bool, typer.Option("--checkpoints", help="Also fetch checkpoints.")] = False,
    cluster: ClusterOption = None,
    managed: Annotated[
        bool, typer.Option("--managed", help="Send the run, then watch it (as `forja watch`): a preempted "
                           "VM is started again, one out of capacity moved to a --fallback-zone.")
    ] = False,
    fallback_zone: FallbackZones = None,
    max_recoveries: MaxRecoveries = 10,
    max_down: MaxDown = "6h",
    max_down_usd: MaxDownUsd = None,
    poll: Poll = 30.0,
    backend: Backend = "vm",
    bucket: VertexBucket = None,
    region: VertexRegion = None,
    machine_type: VertexMachine = None,
    accelerator: VertexAccelerator = None,
    accelerator_count: VertexAcceleratorCount = None,
    replicas: VertexReplicas = 1,
) -> None:
    args = list(ctx.meta.get("forja_script_args", []))
    judged = _judge(ctx, config, script)
    if backend != "vm":  # forja/cli_vertex.py: the same follow and printing, the job's own options
        from forja import cli_vertex

        options = cli_vertex.options(bucket, region, machine_type, accelerator, accelerator_count, replicas)
        _follow_command(ctx, lambda f, interrupted: f.train(
            config, script=script, args=args, project=project, name=name, excludes=exclude or [],
            wait=not detach, checkpoints=checkpoints, timeout_s=timeout, procs=procs, cancel=interrupted,
            backend=backend, vertex=options, replace=replace), timeout, cluster)  # fmt: skip
        return
    if judged is not None:
        _show_estimate(ctx, judged, cluster)
    if managed:
        with _errors(ctx, RUN_GOES_ON):
            budget = _budget(max_recoveries, max_down, max_down_usd)
            why = _forja(ctx, cluster=cluster).train_managed(
                config, fallback_zones=fallback_zone or [], budget=budget, poll_s=poll, say=_say,
                script=str(script) if script else None, args=args, project=str(project) if project else None,
                name=name, excludes=exclude or [], procs=procs, replace=replace)
            out.print(why)
        return
    _follow_command(
        ctx,
        lambda f, interrupted: f.train(
            config, script=script, args=args, project=project, name=name, excludes=exclude or [],
            wait=not detach, checkpoints=checkpoints, timeout_s=timeout, procs=procs, cancel=interrupted,
            replace=replace,
        ),
        timeout,
        cluster,
    )


def _judge(ctx: typer.Context, config: Path | None, script: Path | None) -> Path | None:
    """The trainer's check of CONFIG, first: a config it refuses gets its error (and no estimate).
    A valid one (returned) gets the line saying what only the run's start can check (under --json,
    the result's `unchecked`). None when there is no config to judge: train's own error says why."""
    if config is None or script is not None or not config.is_file():
        return None
    with _errors(ctx, "cancelled"):
        judged = trainer_config.judge(config.resolve())
    if not _opts(ctx).json:
        console.print(judged.said, soft_wrap=True, highlight=False)
    return config


ClusterOption = Annotated[
    str | None,
    typer.Option("--cluster", help="A cluster of the inventory, named as its VMs are (gcp_instance_name "
                 "of a `gcp_instance_count: N` cluster, e.g. forja-l4): act on its members only. A run there "
                 "is on every member (elastic torchrun), followed and fetched on rank 0, and recorded with "
                 "every member as its hosts."),
]
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
Poll = Annotated[float, typer.Option("--poll", help="Seconds between looks at the VM.")]
Backend = Annotated[str, typer.Option("--backend", help="vm: the inventory's VM; vertex: a Vertex AI "
                                      "custom job (the built-in trainer on CONFIG; `forja vertex --help`).")]
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


def _budget(recoveries: int, down: str, down_usd: float | None) -> Any:
    """The watcher's budget from the options (the API checks it, with the zones, before anything runs)."""
    from forja import managed

    return managed.RecoveryBudget(recoveries, managed.seconds(down, "--max-down"), down_usd)


def _say(line: str) -> None:
    """A watcher's line for people (stderr, as progress is)."""
    console.print(line, soft_wrap=True, highlight=False)


@verb(Forja.watch, on_interrupt=RUN_GOES_ON)
def watch(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    fallback_zone: FallbackZones = None,
    max_recoveries: MaxRecoveries = 10,
    max_down: MaxDown = "6h",
    max_down_usd: MaxDownUsd = None,
    poll: Poll = 30.0,
) -> None:
    budget = _budget(max_recoveries, max_down, max_down_usd)
    why = _forja(ctx).watch(name, fallback_zones=fallback_zone or [], budget=budget, poll_s=poll, say=_say)
    out.print(f"run {name}: {why}")


@verb(Forja.follow, on_interrupt=RUN_GOES_ON, epilog=FOLLOWING)
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
    _follow_command(
        ctx,
        lambda f, interrupted: f.follow(
            name, fetch=fetch_results, checkpoints=checkpoints, timeout_s=timeout, cancel=interrupted
        ),
        timeout,
        cluster,
    )


@verb(Forja.status)
def status(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="Run name (default: every run on the hosts).")] = None,
    cluster: ClusterOption = None,
) -> None:
    states = _forja(ctx, cluster=cluster).status(name)
    if _opts(ctx).json:
        _emit_json(states)
        return
    table = Table(title="training runs")
    for col in ("host", "run", "rank", "unit", "status", "step", "loss", "elastic restarts"):
        table.add_column(col, justify="right" if col in ("step", "loss", "elastic restarts") else "left")
    for s in states:  # rank and restarts of a run on several nodes (a cluster's members)
        table.add_row(s.host, s.run, f"{s.node_rank} of {s.nnodes}" if s.nnodes > 1 else "", s.unit_state,
                      s.status, _steps(s.step, s.total_steps), fmt.loss(s.loss),
                      "" if s.elastic_restarts is None else str(s.elastic_restarts))
    out.print(table)


@verb(Forja.logs, epilog="With -f, new lines as the run writes them, until it ends (Forja.follow_logs).")
def logs(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    lines: Annotated[int, typer.Option("--lines", "-n", help="How many journal lines per host.")] = 50,
    follow_journal: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the run ends (or Ctrl-C).")
    ] = False,
) -> None:
    if follow_journal:
        _follow_logs(ctx, name, lines)
        return
    per_host = _forja(ctx).logs(name, lines=lines)
    if _opts(ctx).json:
        _emit_json(per_host)
        return
    for host, text in sorted(per_host.items()):
        console.rule(host)
        sys.stdout.write(text.rstrip("\n") + "\n")


def _follow_logs(ctx: typer.Context, name: str, lines: int) -> None:
    """`logs -f`: new journal lines as they come (JSON lines {host, text} under --json); ends with the run."""
    o = _opts(ctx)
    interrupted = threading.Event()
    shown = ""
    with _ctrl_c_sets(interrupted):
        for host, text in _forja(ctx).follow_logs(name, lines=lines, cancel=interrupted):
            if o.json:
                sys.stdout.write(json.dumps({"host": host, "text": text}) + "\n")
            else:
                if host != shown:
                    console.rule(host)
                    shown = host
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
            sys.stdout.flush()
    if interrupted.is_set():
        console.print(f"[yellow]stopped following the journal; run {name} goes on[/]")


@verb(Forja.fetch)
def fetch(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    dest: Annotated[Path | None, typer.Option("--dest", help="Where to put the results.")] = None,
    checkpoints: Annotated[bool, typer.Option("--checkpoints", help="Also fetch checkpoints.")] = False,
) -> None:
    result = _forja(ctx).fetch(name, dest=dest, checkpoints=checkpoints)
    if _opts(ctx).json:
        _emit_json(result)
    else:
        out.print(_result_table(result))
        out.print(f"results in {result.artifact_dir}")


@verb(Forja.stop)
def stop(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
) -> None:
    _playbooks(ctx, lambda f: f.stop(name))


@verb(Forja.runs)
def runs(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Newest N runs.")] = 20,
    status_filter: Annotated[str | None, typer.Option("--status", help="Only runs with this status.")] = None,
    sync: Annotated[
        bool, typer.Option("--sync", help="First read every run on the hosts (adds runs started elsewhere).")
    ] = False,
) -> None:
    records = _forja(ctx).runs(limit=limit, status=status_filter, sync=sync)
    if _opts(ctx).json:
        _emit_json(records)
        return
    table = Table(title="runs")
    for col in ("run", "status", "hosts", "started", "steps", "loss", "cost", "preempt", "artifacts"):
        justify = "right" if col in ("steps", "loss", "cost", "preempt") else "left"
        table.add_column(col, no_wrap=col in ("run", "status", "started"), justify=justify)
    for r in records:
        table.add_row(
            r.run_id,
            r.status,
            ",".join(r.hosts),
            fmt.timestamp(r.started_at),
            fmt.count(r.steps),
            fmt.loss(r.last_loss),
            fmt.money(r.cost_usd),
            str(r.preemptions),
            r.artifact_dir or "",
        )
    out.print(table)


# -- live metrics -------------------------------------------------------------------------------
@verb(Forja.live, "top", epilog="Refreshes in place; Ctrl-C stops watching and leaves the runs alone "
      "(exit 0). With --once or --json: one reading, exit 3 when no run answers.")
def top(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Argument(help="Only this run (default: every run answering).")] = None,
    url: Annotated[
        list[str] | None,
        typer.Option("--url", help="A run's metrics URL, repeatable (default: 127.0.0.1 at the host "
                     "contract's metrics ports, where `forja tunnel` forwards them)."),
    ] = None,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between refreshes.")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Show one reading and exit.")] = False,
) -> None:
    from forja import live
    from forja import top as view

    api = _forja(ctx)
    urls = list(url) if url else [live.live_url(port) for port in live.metrics_ports()]
    if not (once or _opts(ctx).json):
        view.watch(lambda: api.live(run, urls), urls, interval)
        return
    samples = api.live(run, urls)
    if _opts(ctx).json:
        _emit_json([sample.to_dict() for sample in samples])
    else:
        out.print(view.render(samples, urls))
    if not samples:
        raise typer.Exit(int(ExitCode.UNREACHABLE))


# -- Colab --------------------------------------------------------------------------------------
@verb(Forja.tunnel, epilog="Without --print the tunnel stays open until Ctrl-C.")
def tunnel(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option("--host", help="Inventory host (default: the first).")] = None,
    local_port: Annotated[
        int | None, typer.Option("--local-port", help="Port on this machine (default: the Jupyter port).")
    ] = None,
    gcloud: Annotated[
        bool,
        typer.Option("--gcloud", help="Print gcloud compute ssh (through IAP in iap mode) instead of "
                     "ssh along Ansible's own path."),
    ] = False,
    show_token: Annotated[
        bool, typer.Option("--show-token", help="Put the real token in the printed URL.")
    ] = False,
    print_only: Annotated[
        bool, typer.Option("--print", help="Print the command and URL, open nothing.")
    ] = False,
    start: Annotated[
        bool, typer.Option("--start", help="Start the VM first if it is stopped (as `forja up` does).")
    ] = False,
    once: Annotated[
        bool, typer.Option("--once", help="Exit when ssh ends, instead of opening the tunnel again (same "
                           "port, same token) when the VM is back after a stop, a preemption or a zone move.")
    ] = False,
) -> None:
    o = _opts(ctx)
    with _progress(start and not o.json) as on_event:
        plan = _forja(ctx, on_event).tunnel(host, local_port, gcloud=gcloud, show_token=show_token,
                                            start=start)
    if o.json:
        _emit_json(plan)
    else:
        # Shell-quoted: a ProxyCommand (IAP) holds spaces, and people paste this line into a shell.
        console.print(f"tunnel: [bold]{escape(shlex.join(plan.command))}[/]", soft_wrap=True)
        console.print(f"paste into Colab (Connect to a local runtime): [bold green]{plan.colab_url}[/]",
                      soft_wrap=True)
        if "<token>" in plan.colab_url:
            console.print(f"the token is in {plan.token_file} (or run with --show-token)", soft_wrap=True)
        if plan.metrics_ports:
            console.print(f"the runs' live metrics come along (ports {plan.metrics_ports[0]}-"
                          f"{plan.metrics_ports[-1]}): watch them with `forja top`", soft_wrap=True)
    if print_only:
        return
    try:
        if once:
            rc = plan.open()
            raise typer.Exit(0 if rc == 0 else int(ExitCode.UNREACHABLE))
        _forja(ctx).keep_tunnel(host, plan.local_port, gcloud=gcloud, plan=plan,
                                say=lambda line: console.print(line, soft_wrap=True, highlight=False))
    except KeyboardInterrupt:
        console.print("tunnel closed")


# -- money --------------------------------------------------------------------------------------
def _cost_table(report: Any) -> Table:
    table = Table(
        title=f"forja cost (prices of {report.prices_date}; * = estimate)",
        caption="spent: since the last start (or the last run when stopped); total: over the known history; "
        "month: if left running 730 h, disk included; disk/mo: what it costs while stopped",
    )
    columns = ("instance", "zone", "type", "status", "rate", "up", "spent", "total", "month", "disk/mo",
               "budget")
    for column in columns:
        table.add_column(column, justify="left" if column in columns[:4] else "right")
    for line, chk in zip(report.lines, report.checks, strict=True):
        star = "*" if "estimate" in line.basis else ""
        table.add_row(
            line.name,
            line.zone,
            line.machine_type + (" spot" if line.spot else ""),
            line.status,
            fmt.hourly(line.usd_per_hour) + star,
            fmt.duration(line.uptime_s) if line.uptime_s else "-",
            fmt.money(line.session_usd),
            fmt.money(line.total_usd) or "-",
            fmt.money(line.monthly_if_running_usd),
            fmt.money(line.disk_usd_per_month) or "-",
            "-" if chk is None else chk.level.value,
        )
    if report.clusters:
        table.add_section()
    for unit in report.clusters:  # each cluster's members added up: what it costs as one
        chk = report.checks[[line.name for line in report.lines].index(unit.members[0])]
        table.add_row(
            f"cluster {unit.name}", "", unit.machine, f"{unit.running}/{unit.count} running",
            fmt.hourly(unit.usd_per_hour) + ("*" if "estimate" in unit.basis else ""), "",
            fmt.money(unit.session_usd), fmt.money(unit.total_usd) or "-",
            fmt.money(unit.monthly_if_running_usd), fmt.money(unit.disk_usd_per_month) or "-",
            "-" if chk is None else chk.level.value, style="bold",
        )
    return table


@verb(Forja.cost, register=cost_app.callback)
def cost(
    ctx: typer.Context,
    instances: Annotated[
        Path | None,
        typer.Option("--instances", help="JSON/YAML list of instance dicts instead of the inventory."),
    ] = None,
    prices: Annotated[
        Path | None,
        typer.Option("--prices", help="YAML merged over the built-in price table (or $FORJA_PRICES)."),
    ] = None,
    cap: Annotated[float | None, typer.Option("--cap", help="Spend cap in USD to check against.")] = None,
    warn: Annotated[float, typer.Option("--warn", help="Warn at this fraction of the cap.")] = 0.8,
    scope: Annotated[
        str, typer.Option("--scope", help="Apply the cap per 'instance' or to the 'project'.")
    ] = "instance",
    now: Annotated[
        str | None, typer.Option("--now", help="Compute as of this RFC 3339 time (default: now).")
    ] = None,
    run: Annotated[
        str | None, typer.Option("--run", help="One run's cost (its id or name): setup, waiting for data, "
                                 "evaluation and the rest, time down, the disk.")
    ] = None,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from forja.cost.instances import instances_from_file

    given = instances_from_file(instances) if instances is not None else None
    if run is not None:
        _show_run_cost(ctx, _forja(ctx).run_cost(run, given, prices=prices, now=now))
        return
    report = _forja(ctx).cost(
        given, prices=prices, cap=cap, warn=warn, scope=scope, now=now
    )
    if _opts(ctx).json:
        _emit_json(report.as_dict())
        return
    out.print(_cost_table(report))
    from forja.cost.budget import Level

    told: set[int] = set()  # a cluster's members share one check: said once, for the cluster
    named = {member: f"cluster {c.name} ({c.machine})" for c in report.clusters for member in c.members}
    for chk, line in zip(report.checks, report.lines, strict=True):
        if chk is not None and chk.level is not Level.OK and id(chk) not in told:
            told.add(id(chk))
            out.print(f"[bold]{named.get(line.name, line.name)}[/]: {chk.message}")
    if report.project is not None:
        out.print(f"project: {report.project.message}")
    if report.skipped:
        out.print(f"not priced (no machine_type/zone in hostvars): {', '.join(report.skipped)}")
    if report.own_machines:
        out.print(f"own machine, no cloud price: {', '.join(report.own_machines)}")


def _show_run_cost(ctx: typer.Context, found: Any) -> None:
    """`forja cost --run ID`: what the run cost, part by part (or its JSON, every digit)."""
    if _opts(ctx).json:
        _emit_json(found.as_dict())
        return
    ended = fmt.timestamp(found.ended_at) if found.ended_at else "still running"
    table = Table(title=f"run {found.run_id}: {found.status}, {fmt.timestamp(found.started_at)} to {ended}",
                  caption=f"rate {fmt.hourly(found.usd_per_hour)}: {found.rate_source}")
    for column in ("part", "time", "cost", "share"):
        table.add_column(column, justify="left" if column == "part" else "right")
    known = [part for part in found.parts if part.seconds is not None]
    for part in known:  # the split comes from the fetched results; without them there is none
        share = part.seconds / found.up_s if found.up_s else None
        table.add_row(part.name.replace("_", " "), fmt.duration(part.seconds), fmt.money(part.usd),
                      fmt.percent(share))
    table.add_row("VM up for the run", fmt.duration(found.up_s), fmt.money(found.vm_usd), "",
                  end_section=True)
    table.add_row(f"down, VM not billed ({found.preemptions} preempted, {found.zone_moves} zone moves)",
                  fmt.duration(found.down_s), "", "")
    table.add_row("disk, the whole time", fmt.duration(found.span_s), fmt.money(found.disk_usd) or "?", "")
    table.add_row("[bold]total[/]", "", f"[bold]{fmt.money(found.total_usd)}[/]", "")
    out.print(table)
    if not known:
        out.print(f"no split into setup, compute, data wait and evaluation: the run's results are not on "
                  f"this machine (fetch them with `forja fetch {found.run_id}`)")
    if found.disk_usd is None:
        out.print("the disk is not counted: no record of the run's VM (name the inventory or --instances)")
    if found.trainer_usd is not None:
        out.print(f"the trainer's own figure (its processes only): {fmt.money(found.trainer_usd)}")


def _show_estimate(ctx: typer.Context, config: Path, cluster: str | None = None) -> None:
    """`forja train`'s estimate before sending (stderr): a run not priced says why and goes on; a
    cluster the inventory does not have is the command's error, said once, before anything is sent."""
    try:
        found = _forja(ctx, cluster=cluster).estimate(config)
    except ForjaError as exc:
        if getattr(exc, "field", None) == "--cluster":
            raise
        console.print(f"no cost estimate: {exc.message}", soft_wrap=True, highlight=False)
        return
    console.print(found.describe(), soft_wrap=True, highlight=False)


@verb(Forja.rate, "rate", register=cost_app.command)
def rate(
    ctx: typer.Context,
    machine_type: Annotated[str, typer.Option("--machine-type", help="e.g. g2-standard-8")],
    zone: Annotated[str, typer.Option("--zone", help="e.g. us-east1-d")],
    spot: Annotated[bool, typer.Option("--spot", help="Spot price instead of on-demand.")] = False,
    prices: Annotated[
        Path | None,
        typer.Option("--prices", help="YAML merged over the built-in price table (or $FORJA_PRICES)."),
    ] = None,
) -> None:
    found = _forja(ctx).rate(machine_type, zone, spot=spot, prices=prices)
    if _opts(ctx).json:
        _emit_json({"usd_per_hour": found.usd_per_hour, "basis": found.basis, "what": found.what})
    else:
        out.print(f"{fmt.hourly(found.usd_per_hour)} ({found.what}; {found.basis})")


app.add_typer(cost_app, name="cost", help=_doc(Forja.cost))
from forja import cli_data  # noqa: E402  - `forja data`, after `verb` and the printers it uses

app.add_typer(cli_data.data_app, name="data", help="Datasets: push a folder to the project's bucket.")
from forja import cli_model  # noqa: E402  - `forja model`, after `verb` and the printers it uses

app.add_typer(cli_model.model_app, name="model", help="Trained models: push one to the Hugging Face Hub.")
from forja import cli_vertex  # noqa: E402  - `forja vertex`, after `verb` and the printers it uses

app.add_typer(cli_vertex.vertex_app, name="vertex", help="Runs sent with `forja train --backend vertex`.")


# -- the web dashboard --------------------------------------------------------------------------
@verb(Forja.ui, epilog="Ctrl-C stops the dashboard (never a run).")
def ui(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", min=0, max=65535,
                                      help="Port on 127.0.0.1 (0: any free one).")] = 8877,
    token_file: Annotated[
        Path | None, typer.Option("--token-file", show_default=False,
                                  help="A file (mode 600) whose first line is the token to ask for; or set "
                                       "FORJA_UI_TOKEN. Default: a new random one each start.")
    ] = None,
    token: Annotated[str | None, typer.Option("--token", hidden=True)] = None,
    metrics_url: Annotated[
        list[str] | None, typer.Option("--metrics-url", help="A run's metrics endpoint to read instead "
                                       "of the tunnel's metrics ports (repeat it).")
    ] = None,
) -> None:
    if token is not None:
        raise ConfigError("--token", "a token on the command line is visible to every user (ps); "
                                 "give --token-file PATH (mode 600) or set FORJA_UI_TOKEN")
    given = read_private(token_file, "--token-file", "the token") if token_file is not None else None
    try:
        _forja(ctx).ui(port=port, token=given, metrics_urls=metrics_url or None,
                       say=lambda line: (sys.stdout.write(line + "\n"), sys.stdout.flush()))
    except KeyboardInterrupt:
        console.print("forja ui stopped")


# --- Commands from other parts: register yours here, one line each ---------------------------
# e.g.  app.add_typer(sandbox_cli.app, name="sandbox")
# Commands that installed packages add through the `forja.cli` entry points: `forja sandbox` comes
# from the sandbox (pyproject.toml), which forja itself never imports. One that cannot be imported
# (the sandbox without its `sandbox` extra) is left out: the product runs without it.
for _entry in importlib.metadata.entry_points(group="forja.cli"):
    try:
        app.add_typer(_entry.load(), name=_entry.name)
    except ImportError:
        continue
