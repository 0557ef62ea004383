"""The `forja` command: a thin typer/rich shell over `forja.api.Forja`.

Every command prints a human table by default and one JSON document with `--json`, so
scripts never scrape text. Exit codes mean something (see `ExitCode`): 0 ok, 1 a playbook
task failed, 2 bad usage or input, 3 a host is unreachable, 4 cancelled, 5 not found.

Other parts add their commands in the "Commands from other parts" block at the end, one
line each, so this file stays the single entry point (`forja = forja.cli:app`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from forja.errors import ConfigError, ExitCode, ForjaError

EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 a playbook task failed, 2 bad usage or input, 3 a host is unreachable, "
    "4 cancelled, 5 run not found."
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
    return {k: getattr(exc, k) for k in ("host", "task", "field") if getattr(exc, k, None)}


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


@app.command()
def train(
    ctx: typer.Context,
    config: Annotated[Path, typer.Argument(help="Trainer config YAML (e.g. trainer/configs/digits.yaml).")],
    project: Annotated[
        Path | None, typer.Option("--project", "-p", help="Your project folder to send with the trainer.")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Run name (default: config name + time).")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", "-x", help="Extra glob to keep out of the upload.")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Follow the run until it ends.")] = True,
    checkpoints: Annotated[bool, typer.Option("--checkpoints", help="Also fetch checkpoints.")] = False,
) -> None:
    """Send the trainer and your project, run training as a systemd unit, stream progress, fetch results."""
    o = _opts(ctx)
    try:
        with _progress(not o.json) as on_event:
            result = _forja(ctx, on_event).train(
                config, project=project, name=name, excludes=exclude or [], wait=wait, checkpoints=checkpoints
            )
    except ForjaError as exc:
        raise _fail(exc, o.json) from exc
    except KeyboardInterrupt as exc:
        console.print("[yellow]cancelled; the run keeps going on the host (forja status / forja logs)[/]")
        raise typer.Exit(int(ExitCode.CANCELLED)) from exc
    if o.json:
        _emit_json(result)
        return
    out.print(_result_table(result.playbook_result))
    table = Table(title=f"run {result.run_id}")
    table.add_column("field")
    table.add_column("value")
    for key in ("status", "steps", "final_loss", "accuracy", "samples_per_s", "wall_s", "cost_usd"):
        table.add_row(key, str(result.summary.get(key, "")))
    table.add_row("artifacts", str(result.artifact_dir or ""))
    out.print(table)


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
) -> None:
    """Print the training unit's journal from each host."""
    o = _opts(ctx)
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
) -> None:
    """List the run history (every run, including preempted and failed ones)."""
    from forja.history import History

    o = _opts(ctx)
    records = History().list(limit=limit, status=status_filter)
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


def tunnel_plan(host: Any, local_port: int, iap: bool | None, show_token: bool) -> TunnelPlan:
    """Plain ssh to the inventory address, or gcloud's IAP tunnel when asked (or no address is known).

    Colab's http_over_ws path only works when the local and remote ports are equal, so the remote
    port is the host's `jupyter_colab_port` and the local one must match it.
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
        command = ssh_command(host.address, host.user or "ansible", host.key_file, local_port, remote_port,
                              port=host.port)
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
) -> None:
    """Open the SSH tunnel to the host's Jupyter and print the URL to paste into Colab."""
    import subprocess

    o = _opts(ctx)
    try:
        hosts = _forja(ctx).hosts()
        chosen = [h for h in hosts if host in (None, h.name)]
        if not chosen:
            wanted = host or "forja_gpu"
            raise ConfigError("--host", f"{wanted} is not in the inventory ({len(hosts)} GPU hosts)")
        plan = tunnel_plan(chosen[0], local_port, iap, show_token)
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
from forja.sandbox.cli import app as _sandbox_app  # noqa: E402

app.add_typer(_sandbox_app, name="sandbox")
