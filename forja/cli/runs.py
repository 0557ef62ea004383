"""`forja status | logs | fetch | stop | runs`: a run once started, on its hosts and in the history.

Each verb is one `Forja` method; its table is here, the shared printers in forja/cli/common.py.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from forja import format as fmt
from forja.cli.common import (
    ClusterOption,
    Help,
    NotifyOption,
    console,
    ctrl_c_sets,
    emit_json,
    forja_for,
    global_options,
    out,
    result_table,
    run_playbooks,
    steps,
    verb,
)
from forja.defaults import LOG_LINES

#: No name: its verbs are the root's own (`forja status`), registered in forja/cli/__init__.py.
commands = typer.Typer()


STATUS = Help(
    "Show the state of one run, or of every run, as its VM reports it now.",
    """For each host: the run's unit and status, its step and loss, and for a run on a cluster its
    rank and elastic restarts; a queued run shows how long it has waited. It also brings the history
    (forja runs) up to date: runs that ended take their final status, and runs started elsewhere
    (another machine, site.yml) are added.""",
    examples=(
        "forja status",
        "forja status lr3 --json",
        "forja status --cluster forja-l4",
    ),
    see_also=("forja runs", "forja logs", "forja follow", "forja top"),
)


@verb(STATUS, register=commands.command)
def status(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="Run name (default: every run on the hosts).")] = None,
    cluster: ClusterOption = None,
) -> None:
    states = forja_for(ctx, cluster=cluster).status(name)
    if global_options(ctx).json:
        emit_json(states)
        return
    table = Table(title="training runs")
    for col in ("host", "run", "rank", "unit", "status", "step", "loss", "elastic restarts", "waited"):
        right = col in ("step", "loss", "elastic restarts", "waited")
        table.add_column(col, justify="right" if right else "left")
    for s in states:  # rank and restarts of a run on several nodes (a cluster's members); time in a queue
        table.add_row(s.host, s.run, f"{s.node_rank} of {s.nnodes}" if s.nnodes > 1 else "", s.unit_state,
                      s.status, steps(s.step, s.total_steps), fmt.loss(s.loss),
                      "" if s.elastic_restarts is None else str(s.elastic_restarts),
                      "" if s.waited_s is None else fmt.duration(s.waited_s))
    out.print(table)


LOGS = Help(
    "Print a run's log from each of its hosts, or follow it as it is written with -f.",
    """The training unit's journal on each host (the last --lines lines), then the last lines of the
    run's hook log (the output of its --hook scripts and how each ended), each prefixed "hook| ".
    With -f new lines follow as the run writes them, until it ends; Ctrl-C stops following, never
    the run. Under --json: one document per host, or with -f one JSON line per log line.""",
    examples=(
        "forja logs lr3",
        "forja logs lr3 -f",
        "forja logs lr3 -n 200 --json",
    ),
    see_also=("forja status", "forja follow", "forja top"),
)


@verb(LOGS, register=commands.command)
def logs(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    lines: Annotated[int, typer.Option("--lines", "-n", help="How many journal lines per host.")] = LOG_LINES,
    follow_journal: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the run ends (or Ctrl-C).")
    ] = False,
) -> None:
    if follow_journal:
        _follow_logs(ctx, name, lines)
        return
    per_host = forja_for(ctx).logs(name, lines=lines)
    if global_options(ctx).json:
        emit_json(per_host)
        return
    for host, text in sorted(per_host.items()):
        console.rule(host)
        sys.stdout.write(text.rstrip("\n") + "\n")


def _follow_logs(ctx: typer.Context, name: str, lines: int) -> None:
    """`logs -f`: new journal lines as they come (JSON lines {host, text} under --json); ends with the run."""
    o = global_options(ctx)
    interrupted = threading.Event()
    shown = ""
    with ctrl_c_sets(interrupted):
        for host, text in forja_for(ctx).follow_logs(name, lines=lines, cancel=interrupted):
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


FETCH = Help(
    "Copy a run's results (metrics, plots, summary, model) from its VM to this machine.",
    """They go to --dest, else the project's forja-runs/NAME folder; --checkpoints brings the
    checkpoints too. forja train and forja follow fetch by themselves when a run completes: this is
    for a run followed elsewhere, or to fetch again.""",
    examples=(
        "forja fetch lr3",
        "forja fetch lr3 --dest ~/results/lr3 --checkpoints",
    ),
    see_also=("forja follow", "forja runs", "forja model push"),
)


@verb(FETCH, register=commands.command)
def fetch(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    dest: Annotated[Path | None, typer.Option("--dest", help="Where to put the results.")] = None,
    checkpoints: Annotated[bool, typer.Option("--checkpoints", help="Also fetch checkpoints.")] = False,
) -> None:
    result = forja_for(ctx).fetch(name, dest=dest, checkpoints=checkpoints)
    if global_options(ctx).json:
        emit_json(result)
    else:
        out.print(result_table(result))
        out.print(f"results in {result.artifact_dir}")


STOP = Help(
    "Stop a run: it saves a checkpoint and ends, and does not start again when the VM boots.",
    """The run's stop hook (forja train --hook stop=SCRIPT) runs after the checkpoint. --notify posts
    a "run stopped" event to your webhook, as forja train --notify does. The VM keeps running: forja
    down stops it.""",
    examples=(
        "forja stop lr3",
        "forja stop lr3 --notify",
    ),
    see_also=("forja status", "forja down", "forja queue cancel"),
)


@verb(STOP, register=commands.command)
def stop(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    notify: NotifyOption = False,
) -> None:
    run_playbooks(ctx, lambda f: f.stop(name, notify=notify))


RUNS = Help(
    "List the runs of the history, newest first: status, hosts, steps, loss, cost.",
    """The history is this machine's record of every run sent from it (in forja's home folder), kept
    whether the run completed, failed, was stopped or preempted. --sync first asks the VMs (as forja
    status does), so runs started elsewhere are added and ended ones take their final status. --show
    NAME prints one run's snapshot instead: its code's git commit and uncommitted changes, its config
    and options, the VM's Python packages.""",
    examples=(
        "forja runs",
        "forja runs --status completed -n 5 --json",
        "forja runs --show lr3",
    ),
    see_also=("forja status", "forja cost --run", "forja train --again", "forja ui"),
)


@verb(RUNS, register=commands.command)
def runs(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Newest N runs.")] = 20,
    status_filter: Annotated[str | None, typer.Option("--status", help="Only runs with this status.")] = None,
    sync: Annotated[
        bool, typer.Option("--sync", help="First read every run on the hosts (adds runs started elsewhere).")
    ] = False,
    show: Annotated[
        str | None, typer.Option("--show", help="Show run RUN's snapshot instead: its project's git commit "
                                 "and uncommitted changes (the patch is kept), its config and options, the "
                                 "host's Python packages; forja train --again RUN sends it again. E.g. "
                                 "forja runs --show digits-1.")
    ] = None,
) -> None:
    if show is not None:
        _show(ctx, show)
        return
    records = forja_for(ctx).runs(limit=limit, status=status_filter, sync=sync)
    if global_options(ctx).json:
        emit_json(records)
        return
    table = Table(title="runs", caption="cost: the run's VMs while up for it and their disks (so far, while "
                  "it runs); forja cost --run RUN shows its parts")
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




def _show(ctx: typer.Context, name: str) -> None:
    """`forja runs --show RUN`: the run's snapshot (all of it under --json, packages included)."""
    snap = forja_for(ctx).run_snapshot(name)
    if global_options(ctx).json:
        emit_json(snap.as_dict())
        return
    out.print(f"run {snap.run_id}")
    for line in snap.lines():
        out.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
