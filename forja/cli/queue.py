"""`forja queue`, `forja queue cancel RUN`, `forja queue move RUN`: the run queues of the VMs.

`forja queue` is a group that is itself a verb (`Forja.queue`, its callback: the table); its two
sub-commands are `Forja.queue_cancel` and `Forja.queue_move`. Runs get into a queue with
`forja train --queue` (forja/cli/train.py).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from forja import format as fmt
from forja.api import Forja
from forja.cli.common import ClusterOption, doc, emit_json, forja_for, global_options, out, verb

#: `forja queue`: without a sub-command its callback is the verb (`Forja.queue`).
commands = typer.Typer(name="queue", help=doc(Forja.queue), invoke_without_command=True,
                       no_args_is_help=False,
                       epilog="E.g. forja train digits.yaml --queue --gpu-memory 6GiB --detach; forja queue; "
                       "forja queue move digits-2 --first; forja queue cancel digits-3.")


@verb(Forja.queue, register=commands.callback)
def queue(ctx: typer.Context, cluster: ClusterOption = None) -> None:
    if ctx.invoked_subcommand:
        return
    rows = forja_for(ctx, cluster=cluster).queue()
    if global_options(ctx).json:
        emit_json([row.as_dict() for row in rows])
        return
    table = Table(title="run queue")
    for col in ("host", "#", "run", "state", "priority", "waited", "GPU memory", "why it waits"):
        table.add_column(col, justify="right" if col in ("#", "priority", "waited", "GPU memory") else "left")
    for r in rows:
        memory = "unknown" if r.gpu_memory_mib is None else f"{r.gpu_memory_mib / 1024:.1f} GiB"
        if r.gpu_memory_mib is not None and r.memory_source == "planned":  # the trainer's plan, not a measure
            memory += " (planned)"
        table.add_row(r.host, str(r.position or ""), r.run, r.state, str(r.priority),
                      fmt.duration(r.waited_s) if r.waited_s is not None else "", memory, r.reason)
    out.print(table)
    if not rows:
        out.print("no run is queued; forja train CONFIG --queue puts one in")


@verb(Forja.queue_cancel, "cancel", register=commands.command)
def cancel(ctx: typer.Context, name: Annotated[str, typer.Argument(help="The run to cancel.")],
           cluster: ClusterOption = None) -> None:
    said = forja_for(ctx, cluster=cluster).queue_cancel(name)
    if global_options(ctx).json:
        emit_json(said)
        return
    for host, data in sorted(said.items()):
        queued = data.get("cancelled") == "queued"
        what = "was taken out of the queue" if queued else "was killed; its slot is free"
        out.print(f"{host}: run {name} {what}")


@verb(Forja.queue_move, "move", register=commands.command)
def move(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The queued run to move.")],
    priority: Annotated[
        str | None, typer.Option("--priority", help="Its new priority, an integer (higher starts first).")
    ] = None,
    first: Annotated[bool, typer.Option("--first", help="First among the runs of its priority.")] = False,
    cluster: ClusterOption = None,
) -> None:
    said = forja_for(ctx, cluster=cluster).queue_move(name, priority=priority, first=first)
    if global_options(ctx).json:
        emit_json(said)
        return
    for host, data in sorted(said.items()):
        out.print(f"{host}: run {name} now has priority {data.get('priority')}")
