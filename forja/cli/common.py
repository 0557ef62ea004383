"""What every `forja` command shares: the global options, the one error path, printing, `verb`.

The lower layer of the CLI package: the verb modules (forja/cli/hosts.py, train.py, ...) import
these names and never each other, and this module imports none of them, so any part can be read,
changed or left out alone. What they use is public; what only this module uses keeps its underscore.

One error path (`exit_on_error`): a `ForjaError` prints its message (or one JSON document under
`--json`) and exits with its code; Ctrl-C exits 4. One way to register a command (`verb`): its help
is its own `Help` for people, kept beside the command (what it does in flags, examples, related
verbs), never the API's docstring, which speaks Python; and `--json` is taken after the verb as well
as before it. One factory of the API object (`forja_for`), built from the global options. The
printers: `out` (stdout, the result), `console` (stderr, progress and errors), `emit_json` (what
--json prints), the progress display and the tables that more than one command shows.

Nothing here imports the API (`forja.api`, and with it pydantic, requests, prometheus_client) at
module level: `forja --help` and every verb's `--help` only build the command tree, so the API loads
in `forja_for`, when a command runs (tests/cli/test_cli_help.py holds this).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import signal
import sys
import threading
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperGroup

from forja import format as fmt
from forja.errors import ExitCode, ForjaError
from trainer import finite
from trainer.summary import HEADLINE

if TYPE_CHECKING:
    from forja.api import Forja

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
    from forja.api import Forja  # here, not at the top: help never loads the API

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


@dataclasses.dataclass(frozen=True)
class Help:
    """A command's help for people, in the CLI's own terms: flags and files, never the Python API's
    parameters (the API's docstrings speak to Python callers and stay theirs).

    `summary` is the one line `forja --help` lists; `text` says what the command does, how and what
    to watch for, in paragraphs (each reflowed to the terminal); `examples` are command lines to copy
    (a `  # why` after one is shown as it is); `see_also` names the related verbs. `render` makes
    the one text that `--help` prints and the docs' command reference shows: plain text, which
    click's formatter wraps to the terminal (the `forja` app has no rich markup: see its module)."""

    summary: str
    text: str = ""
    examples: tuple[str, ...] = ()
    see_also: tuple[str, ...] = ()

    def render(self) -> str:
        paragraphs = [" ".join(self.summary.split())]
        paragraphs += [" ".join(p.split()) for p in self.text.strip().split("\n\n") if p.strip()]
        if self.examples:  # "\b": click prints the paragraph as it is, one command line a line
            title = "Examples:" if len(self.examples) > 1 else "Example:"
            paragraphs.append("\n".join(["\b", title, *(f"  {line}" for line in self.examples)]))
        if self.see_also:
            paragraphs.append(f"See also: {', '.join(self.see_also)}.")
        return "\n\n".join(paragraphs)


#: `--json` after the verb (`forja runs --json`), the same switch as the root's `forja --json runs`.
JSON_AFTER_VERB = inspect.Parameter(
    "json_after_verb", inspect.Parameter.KEYWORD_ONLY, default=False,
    annotation=Annotated[bool, typer.Option("--json", help="Print one JSON document for scripts (the same as "
                                            "forja --json before the command).")],
)


def with_json_option(fn: F) -> F:
    """`fn`, a command body, with `--json` among its options: given after the verb, it sets the global
    option (`Options.json`) before the body runs, so the body and its errors print JSON as they do for
    `forja --json VERB`. One mechanism for every verb that prints, applied by `verb`."""

    @functools.wraps(fn)
    def command(ctx: typer.Context, *args: Any, json_after_verb: bool = False, **kwargs: Any) -> Any:
        if json_after_verb:
            global_options(ctx).json = True
        return fn(ctx, *args, **kwargs)

    signature = inspect.signature(fn, eval_str=True)
    command.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), JSON_AFTER_VERB])
    return command  # type: ignore[return-value]


def verb(
    about: Help,
    name: str | None = None,
    *,
    on_interrupt: str = "cancelled",
    register: Callable[..., Callable[[F], F]],
    **settings: Any,
) -> Callable[[F], F]:
    """Register a command: its help is `about` (its own text for people), its errors go through
    `exit_on_error`, and it takes `--json` after the verb too (`with_json_option`). `register` is the
    part's Typer's `command` (or `callback`, for a group that is itself a verb: `forja cost`).
    `settings` go to typer (e.g. `cls`)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def command(ctx: typer.Context, *args: Any, **kwargs: Any) -> Any:
            with exit_on_error(ctx, on_interrupt):
                return fn(ctx, *args, **kwargs)

        command.__doc__ = None
        options = {"help": about.render(), "short_help": about.summary, **settings}
        decorator = register(name, **options) if name is not None else register(**options)
        return decorator(with_json_option(command))  # type: ignore[no-any-return]

    return decorate


class _CoerceWhenGiven:
    """Stands in for typer's conversion of one option's value until the user gives one.

    typer (0.2x) converts every value through a pydantic TypeAdapter that it builds, loading pydantic
    (0.1 s), the first time it processes the option, given or not; and `forja VERB --help` processes
    the root's options (and a group's, `forja cost rate --help`) before the verb's help. A value
    nobody typed is forja's own default, already of its type: it passes as it is (None as typer
    makes it, () for a repeatable option), so help never loads pydantic and a typed value is still
    converted and checked by typer's own code."""

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        source = ctx.get_parameter_source(param.name)
        if source is None or source.name in ("DEFAULT", "DEFAULT_MAP"):
            return () if value is None and (param.multiple or param.nargs == -1) else value
        param._runtime_param = None  # typer's own conversion, built now and kept
        return param.get_runtime_param().coerce(value, param=param, ctx=ctx)


#: What a value is called in help, by its type: typer (0.2x) shows Python's own (`<list[str]>`).
VALUE_WORDS: dict[Any, str] = {str: "TEXT", int: "INTEGER", float: "NUMBER", Path: "PATH"}


def name_the_value(param: Any) -> None:
    """Say a parameter's value in help in the CLI's words, not Python's: an argument by its own name
    (NAME, CONFIG; typer would add `<str>` after it), an option by its kind (TEXT, INTEGER, NUMBER,
    PATH; the same for a repeatable one). A flag has no value; a kind not listed keeps typer's label."""
    described = getattr(param, "type_descriptor", None)
    if described is None or getattr(param, "is_flag", False) or param.metavar is not None:
        return
    if param.param_type_name == "argument":
        param.metavar = str(param.name).upper()
        param.display_type_rich = lambda ctx: None  # the name says it; typer's type label would follow
        return
    kind = typing.get_args(described.annotation)[0] if described.is_list else described.annotation
    param.metavar = VALUE_WORDS.get(kind)


class RootGroup(TyperGroup):
    """The root command, which sets two things on every parameter of the tree that typer built: its
    value's name in help (`name_the_value`), as it is made; and, as the root's arguments are parsed (typer
    has added its completion options by then), value conversion that waits for a value the user
    gave (`_CoerceWhenGiven`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        todo: list[Any] = [self]
        while todo:
            command = todo.pop()
            todo.extend(getattr(command, "commands", {}).values())
            for param in command.params:
                name_the_value(param)

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        todo: list[Any] = [self]
        while todo:
            command = todo.pop()
            todo.extend(getattr(command, "commands", {}).values())
            for param in command.get_params(ctx):  # with the --help option that typer adds
                if hasattr(param, "get_runtime_param") and getattr(param, "_runtime_param", 0) is None:
                    param._runtime_param = _CoerceWhenGiven()
        return super().parse_args(ctx, args)


def group(name: str, about: Help, **settings: Any) -> typer.Typer:
    """A part whose commands sit under one word (`forja data push`): its help is `about`."""
    return typer.Typer(name=name, help=about.render(), short_help=about.summary, **settings)


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
        forja = forja_for(ctx, on_event, cluster)
        result = action(forja, interrupted)
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
        if key == "cost_usd":  # the trainer's count is a part of the run's cost (docs/cost-definition.md)
            table.add_row("cost", fmt.money(result.cost_usd))
            table.add_row("of which training", fmt.money(result.training_usd))
            continue
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
