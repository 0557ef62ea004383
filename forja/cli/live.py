"""`forja top | tunnel | ui`: the runs as they go, seen from this machine.

`top` reads the runs' live metrics in the terminal; `tunnel` opens the SSH tunnel that brings them
here (with the host's Jupyter, for Colab); `ui` serves the web dashboard of the runs, their metrics
and their cost. Each is one `Forja` method; none of them changes a run, and Ctrl-C only stops looking.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from forja.cli.common import Help, console, emit_json, forja_for, global_options, out, show_progress, verb
from forja.errors import ConfigError, ExitCode
from forja.token_file import read_private
from forja.ui import DEFAULT_PORT

#: No name: its verbs are the root's own (`forja top`), registered in forja/cli/__init__.py.
commands = typer.Typer()


# -- live metrics -------------------------------------------------------------------------------
TOP = Help(
    "Watch the runs' live metrics in the terminal: step, loss, throughput, time left, cost, GPU, CPU.",
    """Reads each run's metrics endpoint straight from the run, through the tunnel that forja tunnel
    opens (or at each --url); no playbook runs, so it is cheap to leave open. It refreshes in place
    every --interval seconds; Ctrl-C stops watching and leaves the runs alone (exit 0). With --once
    or --json: one reading, exit 3 when no run answers.""",
    examples=(
        "forja top",
        "forja top lr3 --interval 5",
        "forja top --once --json",
    ),
    see_also=("forja tunnel", "forja logs", "forja ui"),
)


@verb(TOP, "top", register=commands.command)
def top(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Argument(help="Only this run (default: every run answering).")] = None,
    url: Annotated[
        list[str] | None,
        typer.Option("--url", help="A run's metrics URL, repeatable (default: 127.0.0.1 at the metrics "
                     "ports that forja tunnel forwards)."),
    ] = None,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between refreshes.")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Show one reading and exit.")] = False,
) -> None:
    from forja import live
    from forja import top as view

    api = forja_for(ctx)
    urls = list(url) if url else [live.live_url(port) for port in live.metrics_ports()]
    if not (once or global_options(ctx).json):
        view.watch(lambda: api.live(run, urls), urls, interval)
        return
    samples = api.live(run, urls)
    if global_options(ctx).json:
        emit_json([sample.to_dict() for sample in samples])
    else:
        out.print(view.render(samples, urls))
    if not samples:
        raise typer.Exit(int(ExitCode.UNREACHABLE))


# -- Colab --------------------------------------------------------------------------------------
TUNNEL = Help(
    "Open the SSH tunnel to the VM's Jupyter and print the URL to paste into Colab.",
    """In Colab: Connect, then "Connect to a local runtime", and paste the URL. The tunnel uses the
    same port at both ends (Colab needs them equal) and brings the runs' live metrics along for forja
    top. It stays open until Ctrl-C, and opens again by itself (same port, same token) when the VM
    comes back after a stop, a preemption or a zone move; --once exits when ssh ends instead. The
    printed URL hides the token unless --show-token; --print prints the command and URL and opens
    nothing. A stopped VM exits 6 saying since when and why; --start starts it first.""",
    examples=(
        "forja tunnel",
        "forja tunnel --start --show-token",
        "forja tunnel --print --gcloud",
    ),
    see_also=("forja configure", "forja top", "forja up"),
)


@verb(TUNNEL, register=commands.command)
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
    o = global_options(ctx)
    with show_progress(start and not o.json) as on_event:
        plan = forja_for(ctx, on_event).tunnel(host, local_port, gcloud=gcloud, show_token=show_token,
                                            start=start)
    if o.json:
        emit_json(plan)
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
        forja_for(ctx).keep_tunnel(host, plan.local_port, gcloud=gcloud, plan=plan,
                                say=lambda line: console.print(line, soft_wrap=True, highlight=False))
    except KeyboardInterrupt:
        console.print("tunnel closed")



# -- the web dashboard --------------------------------------------------------------------------
UI = Help(
    "Serve a web dashboard of your runs on this machine, until Ctrl-C.",
    """It shows the runs of the history with their status, cost, preemptions and zone moves; each
    running run's live metrics as charts (through forja tunnel, as forja top reads them); each run's
    cost part by part and its final plots; the VMs' state and spend. It listens on 127.0.0.1 only and
    asks for a token, as Jupyter does: a new random one each start, in the URL it prints once (or
    yours, from --token-file or FORJA_UI_TOKEN). Ctrl-C stops the dashboard, never a run.""",
    examples=(
        "forja ui",
        "forja ui --port 0 --token-file ~/.config/forja/ui-token",
    ),
    see_also=("forja runs", "forja top", "forja cost"),
)


@verb(UI, register=commands.command)
def ui(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", min=0, max=65535,
                                      help="Port on 127.0.0.1 (0: any free one).")] = DEFAULT_PORT,
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
        forja_for(ctx).ui(port=port, token=given, metrics_urls=metrics_url or None,
                       say=lambda line: (sys.stdout.write(line + "\n"), sys.stdout.flush()))
    except KeyboardInterrupt:
        console.print("forja ui stopped")

