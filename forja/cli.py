"""The `forja` command: a thin typer/rich shell over `forja.api.Forja`.

Every command prints a human table by default and one JSON document with `--json`, so
scripts never scrape text. Exit codes mean something (see `ExitCode`): 0 ok, 1 a playbook
task failed, 2 bad usage or input, 3 a host is unreachable, 4 cancelled, 5 not found,
6 the VM is stopped (the message says since when and why; `forja up` starts it), 7 the command
stopped following a run that goes on (`--timeout` expired, or Ctrl-C: not a failure of the run).

Other parts add their commands in the "Commands from other parts" block at the end, one
line each, so this file stays the single entry point (`forja = forja.cli:app`).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperCommand

from forja.errors import ConfigError, ExitCode, ForjaError

EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 a playbook task failed, 2 bad usage or input, 3 a host is unreachable, "
    "4 cancelled, 5 run not found, 6 the VM is stopped (start it with `forja up`), "
    "7 stopped following a run that goes on (--timeout, Ctrl-C)."
)

app = typer.Typer(
    name="forja",
    help="Reproducible GPU training hosts: provision, configure, train, fetch, stop. " + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)  # progress, errors
out = Console()  # tables: the command's result


@dataclasses.dataclass
class Options:
    """Global options, shared by every command through typer's context."""

    inventory: str | None = None
    limit: str | None = None
    json: bool = False
    host_key_checking: bool = True
    extravars: dict[str, Any] = dataclasses.field(default_factory=dict)


def _parse_extravars(pairs: list[str]) -> dict[str, Any]:
    """`-e key=value` pairs; values are parsed as JSON when they look like JSON, else kept as text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint="--extra-var/-e")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


@app.callback()
def main(
    ctx: typer.Context,
    inventory: Annotated[
        str | None, typer.Option("--inventory", "-i", help="Inventory path (default: ansible.cfg's).")
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
    return ctx.obj if isinstance(ctx.obj, Options) else Options()


def _forja(ctx: typer.Context, on_event: Callable[[Any], None] | None = None) -> Any:
    """Build the API object from the global options (imported late: `forja --help` stays fast)."""
    from forja.api import Forja

    o = _opts(ctx)
    return Forja(
        inventory=o.inventory,
        extravars=o.extravars,
        host_key_checking=o.host_key_checking,
        limit=o.limit,
        on_event=on_event,
    )


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # A RunResult's raw event list is for callers in Python, not for --json output.
        fields = [f.name for f in dataclasses.fields(obj) if f.name != "events"]
        return {name: _jsonable(getattr(obj, name)) for name in fields}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(_jsonable(obj), indent=2, default=str) + "\n")


def _fail(exc: ForjaError, as_json: bool) -> typer.Exit:
    if as_json:
        _emit_json({"error": type(exc).__name__, "message": exc.message, **_error_fields(exc)})
    else:
        console.print(f"[bold red]error:[/] {exc.message}")
    return typer.Exit(int(exc.exit_code))


def _error_fields(exc: ForjaError) -> dict[str, Any]:
    keys = ("host", "task", "field", "status", "since", "why")
    return {k: getattr(exc, k) for k in keys if getattr(exc, k, None)}


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
            elif isinstance(event, ev.TaskOk) and event.task in ev.ANNOUNCE_TASKS:
                progress.console.print(f"[cyan]{event.host}[/]: {event.result.get('msg', '')}")
            elif isinstance(event, ev.TaskFailed) and not event.ignored:
                progress.console.print(f"[red]failed[/] {event.host}: {event.task}: {event.message}")
            elif isinstance(event, ev.HostUnreachable):
                progress.console.print(f"[red]unreachable[/] {event.host}: {event.message}")
            elif isinstance(event, ev.TrainProgress):
                total = event.total_steps or None
                loss = f" loss {event.loss:.4f}" if event.loss is not None else ""
                text = f"step {event.step}{loss}"
                progress.update(bar(event.host), completed=event.step, total=total, description=text)
            elif isinstance(event, ev.PlaybookFinished):
                progress.update(bar("play"), description=f"done ({event.playbook})", total=1, completed=1)

        yield on_event


def _result_table(result: Any) -> Table:
    table = Table(title=f"{result.playbook}: {result.status} (rc {result.rc}, {result.duration_s:.1f} s)")
    for col in ("host", "ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(col, justify="right" if col != "host" else "left")
    for host, s in sorted(result.stats.items()):
        table.add_row(host, str(s.ok), str(s.changed), str(s.failures), str(s.unreachable), str(s.skipped))
    return table


def _run_playbook_command(ctx: typer.Context, action: Callable[[Any], Any]) -> None:
    o = _opts(ctx)
    try:
        with _progress(not o.json) as on_event:
            result = action(_forja(ctx, on_event))
    except ForjaError as exc:
        raise _fail(exc, o.json) from exc
    except KeyboardInterrupt as exc:
        console.print("[yellow]cancelled[/]")
        raise typer.Exit(int(ExitCode.CANCELLED)) from exc
    if o.json:
        _emit_json(result)
    else:
        for one in result if isinstance(result, list) else [result]:
            out.print(_result_table(one))


@app.command()
def up(ctx: typer.Context) -> None:
    """Create (or start) the GPU host: playbooks/provision.yml."""
    _run_playbook_command(ctx, lambda f: f.up())


@app.command()
def configure(ctx: typer.Context) -> None:
    """Install the GPU stack and the Colab-ready Jupyter: playbooks/gpu.yml then jupyter.yml."""
    _run_playbook_command(ctx, lambda f: f.configure())


@app.command()
def down(
    ctx: typer.Context,
    delete: Annotated[bool, typer.Option("--delete", help="Delete the VM instead of stopping it.")] = False,
) -> None:
    """Stop (or delete) the GPU host: playbooks/teardown.yml."""
    _run_playbook_command(ctx, lambda f: f.down(delete=delete))


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


def _follow_command(
    ctx: typer.Context, action: Callable[[Any, threading.Event], Any], timeout: float | None
) -> None:
    """Run `train` or `follow` with progress; report a run that ended, or one that goes on (exit 7)."""
    o = _opts(ctx)
    interrupted = threading.Event()
    try:
        with _ctrl_c_sets(interrupted), _progress(not o.json) as on_event:
            result = action(_forja(ctx, on_event), interrupted)
    except ForjaError as exc:
        raise _fail(exc, o.json) from exc
    except KeyboardInterrupt as exc:
        console.print("[yellow]interrupted; a run already started keeps going on the host "
                      "(forja status / forja logs -f NAME / forja stop NAME)[/]", soft_wrap=True)
        raise typer.Exit(int(ExitCode.CANCELLED)) from exc
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
    for key in ("status", "steps", "final_loss", "accuracy", "samples_per_s", "wall_s", "cost_usd"):
        table.add_row(key, str(result.summary.get(key, "")))
    table.add_row("artifacts", str(result.artifact_dir or ""))
    out.print(table)


def _report_detached(result: Any, timeout: float | None, as_json: bool) -> None:
    """A run that goes on: its id on stdout (or JSON), how to follow and stop it on stderr.
    `--detach` exits 0; a `--timeout` that expired or a Ctrl-C exits 7 (the run is not failed)."""
    from forja.api import how_to_follow

    why = {
        "detach": "started",
        "timeout": f"still running after the {timeout:g} s --timeout" if timeout else "still running",
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


@app.command(cls=_ScriptArgsCommand)
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
) -> None:
    """Send the trainer and your project, run training as a systemd unit, follow it to its end, fetch results.

    Following has no time limit. Ctrl-C stops following and leaves the run going (exit 7); so does
    an expired --timeout. `forja follow NAME` picks it up again, `forja stop NAME` ends it.
    """
    args = list(ctx.meta.get("forja_script_args", []))
    _follow_command(
        ctx,
        lambda f, interrupted: f.train(
            config, script=script, args=args, project=project, name=name, excludes=exclude or [],
            wait=not detach, checkpoints=checkpoints, timeout_s=timeout, procs=procs, cancel=interrupted,
        ),
        timeout,
    )


@app.command()
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
) -> None:
    """Follow a started run (after --detach or Ctrl-C) to its end with progress, then fetch its results."""
    _follow_command(
        ctx,
        lambda f, interrupted: f.follow(
            name, fetch=fetch_results, checkpoints=checkpoints, timeout_s=timeout, cancel=interrupted
        ),
        timeout,
    )


@app.command()
def status(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="Run name (default: every run on the hosts).")] = None,
) -> None:
    """Show each host's training units: state, step, loss."""
    o = _opts(ctx)
    try:
        states = _forja(ctx).status(name)
    except ForjaError as exc:
        raise _fail(exc, o.json) from exc
    if o.json:
        _emit_json(states)
        return
    table = Table(title="training runs")
    for col in ("host", "run", "unit", "status", "step", "loss"):
        table.add_column(col)
    for s in states:
        loss = f"{s.loss:.4f}" if s.loss is not None else ""
        table.add_row(s.host, s.run, s.unit_state, s.status, str(s.step or ""), loss)
    out.print(table)


@app.command()
def logs(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    lines: Annotated[int, typer.Option("--lines", "-n", help="How many journal lines per host.")] = 50,
    follow_journal: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the run ends (or Ctrl-C).")
    ] = False,
) -> None:
    """Print the training unit's journal from each host (-f: follow it until the run ends)."""
    o = _opts(ctx)
    if follow_journal:
        _follow_logs(ctx, name, lines)
        return
    try:
        per_host = _forja(ctx).logs(name, lines=lines)
    except ForjaError as exc:
        raise _fail(exc, o.json) from exc
    if o.json:
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
    try:
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
    except ForjaError as exc:
        raise _fail(exc, o.json) from exc
    if interrupted.is_set():
        console.print(f"[yellow]stopped following the journal; run {name} goes on[/]")


@app.command()
def fetch(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    dest: Annotated[Path | None, typer.Option("--dest", help="Where to put the results.")] = None,
    checkpoints: Annotated[bool, typer.Option("--checkpoints", help="Also fetch checkpoints.")] = False,
) -> None:
    """Copy a run's metrics, plots, summary (and checkpoints) to this machine."""
    o = _opts(ctx)
    try:
        result = _forja(ctx).fetch(name, dest=dest, checkpoints=checkpoints)
    except ForjaError as exc:
        raise _fail(exc, o.json) from exc
    if o.json:
        _emit_json(result)
    else:
        out.print(_result_table(result))
        out.print(f"results in {result.artifact_dir}")


@app.command()
def stop(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
) -> None:
    """Stop a training run (it checkpoints on SIGTERM) and keep it from resuming at boot."""
    _run_playbook_command(ctx, lambda f: f.stop(name))


@app.command()
def runs(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Newest N runs.")] = 20,
    status_filter: Annotated[str | None, typer.Option("--status", help="Only runs with this status.")] = None,
    sync: Annotated[
        bool, typer.Option("--sync", help="First read every run on the hosts (adds runs started elsewhere).")
    ] = False,
) -> None:
    """List the run history (every run, including preempted and failed ones, and runs that site.yml
    started). The history holds what the hosts last reported; --sync asks them first."""
    o = _opts(ctx)
    try:
        records = _forja(ctx).runs(limit=limit, status=status_filter, sync=sync)
    except ForjaError as exc:
        raise _fail(exc, o.json) from exc
    if o.json:
        _emit_json(records)
        return
    table = Table(title="runs")
    for col in ("run", "status", "hosts", "started", "steps", "loss", "cost $", "preempt", "artifacts"):
        table.add_column(col, no_wrap=col in ("run", "status"))
    for r in records:
        table.add_row(
            r.run_id,
            r.status,
            ",".join(r.hosts),
            r.started_at[:19],
            str(r.steps if r.steps is not None else ""),
            f"{r.last_loss:.4f}" if r.last_loss is not None else "",
            f"{r.cost_usd:.4f}" if r.cost_usd is not None else "",
            str(r.preemptions),
            r.artifact_dir or "",
        )
    out.print(table)


TOKEN_FILE = "~/.config/forja/tokens/{host}.jupyter-token"


@dataclasses.dataclass(frozen=True)
class TunnelPlan:
    """The tunnel command for one host and the URL Colab needs (token shown only on request)."""

    host: str
    command: list[str]
    local_port: int
    remote_port: int
    colab_url: str
    token_file: str


def tunnel_plan(
    host: Any, local_port: int, iap: bool | None, show_token: bool, host_key_checking: bool = True
) -> TunnelPlan:
    """Plain ssh to the inventory address, or gcloud's IAP tunnel when asked (or no address is known).

    Colab's http_over_ws path only works when the local and remote ports are equal, so the remote
    port is the host's `jupyter_colab_port` and the local one must match it. Host keys are checked
    (accept-new) unless `--no-host-key-checking` or the inventory (`ansible_host_key_checking`,
    the sandbox's throwaway hosts) turns that off.
    """
    from forja.tunnel import ssh_command

    remote_port = int(host.vars.get("jupyter_colab_port") or 8888)
    if local_port != remote_port:
        raise ConfigError(
            "--local-port", f"{local_port} is not the Jupyter port {remote_port}; Colab needs them equal"
        )
    use_iap = iap if iap is not None else host.address == host.name
    if use_iap:
        zone = host.vars.get("zone") or host.vars.get("gcp_zone")
        command = ["gcloud", "compute", "ssh", host.name, "--tunnel-through-iap"]
        command += [f"--zone={zone}"] if zone else []
        command += ["--", "-N", "-L", f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}"]
    else:
        checking = host_key_checking and host.host_key_checking
        command = ssh_command(host.address, host.user or "ansible", host.key_file, local_port, remote_port,
                              port=host.port, strict_host_key_checking="accept-new" if checking else "no",
                              known_hosts_file=None if checking else "/dev/null")
    token_file = Path(TOKEN_FILE.format(host=host.name)).expanduser()
    token = "<token>"
    if show_token and token_file.is_file():
        token = token_file.read_text().strip()
    url = f"http://localhost:{local_port}/?token={token}"
    return TunnelPlan(host.name, command, local_port, remote_port, url, str(token_file))


@app.command()
def tunnel(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option("--host", help="Inventory host (default: the first).")] = None,
    local_port: Annotated[int, typer.Option("--local-port", help="Port on this machine.")] = 8888,
    iap: Annotated[
        bool | None,
        typer.Option("--iap/--no-iap", help="Use gcloud's IAP tunnel (default: host has no address)."),
    ] = None,
    show_token: Annotated[
        bool, typer.Option("--show-token", help="Put the real token in the printed URL.")
    ] = False,
    print_only: Annotated[
        bool, typer.Option("--print", help="Print the command and URL, open nothing.")
    ] = False,
    start: Annotated[
        bool, typer.Option("--start", help="Start the VM first if it is stopped (as `forja up` does).")
    ] = False,
) -> None:
    """Open the SSH tunnel to the host's Jupyter and print the URL to paste into Colab.

    A stopped VM is an error (exit 6) that says since when and why; `--start` starts it first.
    """
    import subprocess

    from forja.inventory import stopped_error

    o = _opts(ctx)

    def choose(hosts: list[Any]) -> Any:
        chosen = [h for h in hosts if host in (None, h.name)]
        if not chosen:
            wanted = host or "forja_gpu"
            raise ConfigError("--host", f"{wanted} is not in the inventory ({len(hosts)} GPU hosts)")
        return chosen[0]

    try:
        chosen = choose(_forja(ctx).hosts())
        if chosen.stopped and start:
            console.print(f"{chosen.name} is {chosen.status}: starting it (playbooks/provision.yml)")
            with _progress(not o.json) as on_event:
                _forja(ctx, on_event).up()
            chosen = choose(_forja(ctx).hosts())
        if chosen.stopped:
            raise stopped_error(chosen)
        plan = tunnel_plan(chosen, local_port, iap, show_token, o.host_key_checking)
    except ForjaError as exc:
        raise _fail(exc, o.json) from exc
    if o.json:
        _emit_json(plan)
    else:
        console.print(f"tunnel: [bold]{' '.join(plan.command)}[/]")
        console.print(f"paste into Colab (Connect to a local runtime): [bold green]{plan.colab_url}[/]")
        if "<token>" in plan.colab_url:
            console.print(f"the token is in {plan.token_file} (or run with --show-token)")
    if print_only:
        return
    try:
        proc = subprocess.run(plan.command, check=False)
    except KeyboardInterrupt:
        console.print("tunnel closed")
        return
    raise typer.Exit(0 if proc.returncode == 0 else int(ExitCode.UNREACHABLE))


# --- Commands from other parts: register yours here, one line each ---------------------------
# e.g.  app.add_typer(cost_cli.app, name="cost")   (forja/cost/cli.py)
#       app.add_typer(sandbox_cli.app, name="sandbox")
from forja.cost.cli import app as _cost_app  # noqa: E402

app.add_typer(_cost_app, name="cost")
from forja_sandbox.cli import app as _sandbox_app  # noqa: E402

app.add_typer(_sandbox_app, name="sandbox")
