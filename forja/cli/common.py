"""What every `forja` command shares: the global options, the one error path, printing, `verb`.

The lower layer of the CLI package: the verb modules (forja/cli/hosts.py, train.py, ...) import
these names and never each other, and this module imports none of them, so any part can be read,
changed or left out alone. What they use is public; what only this module uses keeps its underscore.

One error path (`exit_on_error`): a `ForjaError` prints its message (or one JSON document under
`--json`) and exits with its code; Ctrl-C exits 4. One way to register a command (`verb`): its help
is the `Forja` method's docstring, one text for the API and the CLI. One factory of the API object
(`forja_for`), built from the global options. The printers: `out` (stdout, the result), `console`
(stderr, progress and errors), `emit_json` (what --json prints), the progress display and the tables
that more than one command shows.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from forja import format as fmt
from forja.api import Forja
from forja.errors import ExitCode, ForjaError
from trainer import finite
from trainer.summary import HEADLINE

EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 a playbook task failed, 2 bad usage or input, 3 a host is unreachable, "
    "4 cancelled, 5 run not found, 6 the VM is stopped (start it with `forja up`), "
    "7 stopped following a run that goes on (--timeout, Ctrl-C), "
    "8 the run diverged (NaN or Inf loss) and was stopped, "
    "9 `forja check` found a problem that blocks creating the VM (nothing was created)."
)
#: What Ctrl-C means to a command that may have started a training run.
RUN_GOES_ON = ("interrupted; a run already started keeps going on the host "
               "(forja status / forja logs -f NAME / forja stop NAME)")

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


def global_options(ctx: typer.Context) -> Options:
    """The global options of this invocation (the defaults when none were parsed)."""
    obj = ctx.find_object(Options)  # set by `main` on the root context; sub-apps (cost) look up
    return obj if isinstance(obj, Options) else Options()


def forja_for(
    ctx: typer.Context, on_event: Callable[[Any], None] | None = None, cluster: str | None = None
) -> Forja:
    """The API object, built from the global options. Which inventory (-i, else FORJA_INVENTORY) is
    the API's rule (`forja.inventory.chosen`); a verb that needs hosts and has none named stops
    there with the choices, before anything runs, while the history and price lookups need none."""
    o = global_options(ctx)
    return Forja(
        inventory=o.inventory,
        extravars=o.extravars,
        host_key_checking=o.host_key_checking,
        limit=o.limit,
        on_event=on_event,
        cluster=cluster,
    )


#: `--cluster`, of the verbs that act on a run (train, follow, status).
#: `--notify`: a flag, never a URL (a secret on a command line is seen by every user of the machine
#: in `ps` and kept in shell history); the URL comes from the environment or the inventory.
NotifyOption = Annotated[
    bool,
    typer.Option("--notify", help="Post the run's events (started, finished, failed, stopped, preempted, "
                 "restarted, moved) as JSON to the webhook in FORJA_NOTIFY_WEBHOOK, else the inventory's "
                 "notify_webhook (a Slack or Discord incoming webhook works as it is). Never blocks the run.",
                 ),
]
#: `--yes` of the verbs that upload (train, data push): send without asking (forja/consent.py).
YesOption = Annotated[
    bool,
    typer.Option("--yes", "-y", help="Send without asking. Without it forja shows what will be sent (files, "
                 "size, what is left out and why) and asks when you are at a terminal; in a script or CI it "
                 "shows it and goes on. The inventory's forja_upload_consent: ask (default), always, or "
                 "never (refuse every upload, even with --yes)."),
]


def asker(ctx: typer.Context) -> Callable[[str], bool] | None:
    """The consent question for a person at a terminal (stdin and stderr), else None: nobody to ask."""
    if global_options(ctx).json or not (sys.stdin.isatty() and console.is_terminal):
        return None
    return lambda question: typer.confirm(question, default=False, err=True)


ClusterOption = Annotated[
    str | None,
    typer.Option("--cluster", help="A cluster of the inventory, named as its VMs are (gcp_instance_name "
                 "of a `gcp_instance_count: N` cluster, e.g. forja-l4): act on its members only. A run there "
                 "is on every member (elastic torchrun), followed and fetched on rank 0, and recorded with "
                 "every member as its hosts."),
]


# -- the one error path and the one way to register a verb -------------------------------------
def _error_fields(exc: ForjaError) -> dict[str, Any]:
    keys = ("host", "task", "field", "source", "status", "since", "why")
    return {k: getattr(exc, k) for k in keys if getattr(exc, k, None)}


@contextmanager
def exit_on_error(ctx: typer.Context, on_interrupt: str) -> Iterator[None]:
    """Map what a verb raises to its exit code: a ForjaError's own code (its message, or one JSON
    document under --json), Ctrl-C that reached here 4 (cancelled). Click's usage errors pass."""
    as_json = global_options(ctx).json
    try:
        yield
    except ForjaError as exc:
        if as_json:
            emit_json({"error": type(exc).__name__, "message": exc.message, **_error_fields(exc)})
        else:
            # escaped: Ansible's own words ("[ERROR]", a group "[forja_gpu]") are text, not rich markup
            console.print(f"[bold red]error:[/] {escape(exc.message)}", soft_wrap=True)
        raise typer.Exit(int(exc.exit_code)) from exc
    except KeyboardInterrupt as exc:
        console.print(f"[yellow]{on_interrupt}[/]", soft_wrap=True)
        raise typer.Exit(int(ExitCode.CANCELLED)) from exc


_SECTION = re.compile(r"^(Args|Arguments|Returns|Raises|Yields):\s*$")


def doc(method: Callable[..., Any]) -> str:
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
    register: Callable[..., Callable[[F], F]],
    **settings: Any,
) -> Callable[[F], F]:
    """Register a command for a `Forja` method: its help is the method's docstring, its errors go
    through `exit_on_error`. `register` is the part's Typer's `command` (or `callback`, for a group
    that is itself a verb: `forja cost`). `settings` go to typer (e.g. `epilog` for what only the
    command does)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def command(ctx: typer.Context, *args: Any, **kwargs: Any) -> Any:
            with exit_on_error(ctx, on_interrupt):
                return fn(ctx, *args, **kwargs)

        command.__doc__ = None
        options = {"help": doc(method), **settings}
        decorator = register(name, **options) if name is not None else register(**options)
        return decorator(command)  # type: ignore[no-any-return]

    return decorate


# -- printing -----------------------------------------------------------------------------------
def emit_json(obj: Any) -> None:
    """What --json prints: full precision, and a NaN or Inf figure (a diverged run's loss, a live
    fp16 overflow) as null plus a ``nonfinite`` flag, as in the run's own files (trainer.finite),
    never the bare ``NaN`` that jq and most JSON readers refuse."""
    sys.stdout.write(finite.dumps(fmt.plain(obj, drop=("events",)), indent=2, default=str) + "\n")


def steps(step: int | None, total: int | None) -> str:
    if step is None:
        return ""
    return f"{fmt.count(step)}/{fmt.count(total)}" if total else fmt.count(step)


@contextmanager
def show_progress(enabled: bool) -> Iterator[Callable[[Any], None] | None]:
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
                text = f"step {steps(event.step, event.total_steps)}{loss}"
                progress.update(bar(event.host), completed=event.step, total=event.total_steps or None,
                                description=text)
            elif isinstance(event, ev.PlaybookFinished):
                progress.update(bar("play"), description=f"done ({event.playbook})", total=1, completed=1)

        yield on_event


def result_table(result: Any) -> Table:
    """A playbook run's recap: one row per host (ok, changed, failed, unreachable, skipped)."""
    took = fmt.duration(result.duration_s)
    table = Table(title=f"{result.playbook}: {result.status} (rc {result.rc}, {took})")
    for col in ("host", "ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(col, justify="right" if col != "host" else "left")
    for host, s in sorted(result.stats.items()):
        table.add_row(host, str(s.ok), str(s.changed), str(s.failures), str(s.unreachable), str(s.skipped))
    return table


def run_playbooks(ctx: typer.Context, action: Callable[[Forja], Any]) -> None:
    """Run a verb that runs playbooks, with progress; print its recap table(s) or its JSON."""
    o = global_options(ctx)
    with show_progress(not o.json) as on_event:
        result = action(forja_for(ctx, on_event))
    if o.json:
        emit_json(result)
    else:
        for one in result if isinstance(result, list) else [result]:
            out.print(result_table(one))


# -- following a run ----------------------------------------------------------------------------
@contextmanager
def ctrl_c_sets(event: threading.Event) -> Iterator[None]:
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


def follow_command(
    ctx: typer.Context, action: Callable[[Forja, threading.Event], Any], timeout: float | None,
    cluster: str | None = None,
) -> None:
    """Run `train` or `follow` with progress; report a run that ended, or one that goes on (exit 7)."""
    o = global_options(ctx)
    interrupted = threading.Event()
    with ctrl_c_sets(interrupted), show_progress(not o.json) as on_event:
        result = action(forja_for(ctx, on_event, cluster), interrupted)
    if result.detached is not None:
        _report_detached(result, timeout, o.json)
        return
    if o.json:
        emit_json(result)
        return
    if result.playbook_result is not None:
        out.print(result_table(result.playbook_result))
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
    from forja.vertex import how_to_follow as how_to_follow_vertex

    if _is_vertex_job(result.hosts):
        how_to_follow = how_to_follow_vertex
    limit = f" after the {fmt.duration(timeout)} --timeout" if timeout else ""
    why = {
        "detach": "queued" if result.status == "queued" else "started",  # forja train --queue --detach
        "timeout": f"still running{limit}",
        "interrupted": "still running (Ctrl-C stopped following it, not the run)",
    }.get(result.detached, "still running")
    where = f" on {', '.join(result.hosts)}" if result.hosts else ""
    console.print(f"[yellow]run {result.run_id} {why}{where}; it goes on.[/] {how_to_follow(result.run_id)}",
                  soft_wrap=True)  # commands to copy stay on one line
    if as_json:
        emit_json(result)
    else:
        out.print(result.run_id)
    if result.detached != "detach":
        raise typer.Exit(int(ExitCode.STILL_RUNNING))


def _is_vertex_job(hosts: Sequence[str]) -> bool:
    """Whether a TrainResult's `hosts` name a Vertex job (its resource name) rather than VMs."""
    return bool(hosts) and "/customJobs/" in hosts[0]
