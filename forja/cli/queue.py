"""`forja queue`, `forja queue cancel RUN`, `forja queue move RUN`: the run queues of the VMs.

`forja queue` is a group that is itself a verb (its callback calls `Forja.queue`: the table); its two
sub-commands are `Forja.queue_cancel` and `Forja.queue_move`. Runs get into a queue with
`forja train --queue` (forja/cli/train.py).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from forja import format as fmt
from forja.cli.common import ClusterOption, Help, emit_json, forja_for, global_options, out, verb

#: `forja queue`: without a sub-command its callback is the verb (`Forja.queue`); its help is QUEUE's.
commands = typer.Typer(name="queue", invoke_without_command=True, no_args_is_help=False)

QUEUE = Help(
    "Show the VMs' run queues: the runs waiting, in the order they will start, and why each waits.",
    """forja train --queue puts a run in its VM's queue instead of starting it at once: the VM starts
    it when it fits on the GPU beside what already runs, higher --priority first, then first come
    first served, and it keeps its place across a reboot. Each row shows a run's position, priority,
    how long it has waited, its GPU memory (given, measured or planned) and why it waits; the runs
    the queue started that still run follow.""",
    examples=(
        "forja train trainer/configs/digits.yaml --queue --gpu-memory 6GiB --detach",
        "forja queue",
        "forja queue move digits-2 --first",
        "forja queue cancel digits-3",
    ),
    see_also=("forja queue move", "forja queue cancel", "forja train --queue", "forja status"),
)


@verb(QUEUE, register=commands.callback)
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


CANCEL = Help(
    "Take a queued run out of its VM's queue, or kill one the queue started and free its slot.",
    """A running one is killed with all its processes and kept from starting again at boot. The
    history marks it stopped, with the message that it was cancelled.""",
    examples=("forja queue cancel digits-3", "forja queue cancel digits-3 --cluster forja-l4 --json"),
    see_also=("forja queue", "forja stop"),
)


@verb(CANCEL, "cancel", register=commands.command)
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


MOVE = Help(
    "Give a queued run a new priority, or put it first among the runs of its priority.",
    examples=("forja queue move digits-2 --first", "forja queue move digits-2 --priority 5"),
    see_also=("forja queue", "forja queue cancel"),
)


@verb(MOVE, "move", register=commands.command)
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
