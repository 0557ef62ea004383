"""`forja vertex follow|cancel RUN`: a run sent with `forja train --backend vertex` (forja/cli/train.py).

The commands register through forja/cli/common.py's `verb` (help = the API's docstring, errors
through the one error path) and print with its printers; `follow` takes the same follow-and-print
path as `forja follow` (`follow_command`). Cancelling is its own verb, not a flag of `train`:
`forja train` starts runs and `forja stop` ends a VM run by name; a Vertex job is ended by Vertex's
own cancel, which needs only the run's name, the region and the project, never a config.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

import typer

from forja.api import Forja
from forja.cli.common import emit_json, follow_command, forja_for, global_options, out, verb
from forja.vertex import POLL_S
from forja.vertex_job import DEFAULT_REGION, VertexOptions

commands = typer.Typer(name="vertex", help="Runs sent with `forja train --backend vertex`.",
                       no_args_is_help=True)

Region = Annotated[str, typer.Option("--region", help="The job's region (as `forja train --region`).")]


@verb(Forja.vertex_follow, "follow", register=commands.command)
def follow(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    region: Region = DEFAULT_REGION,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Stop following after S s; the job goes on (exit 7).")
    ] = None,
    poll: Annotated[
        float, typer.Option("--poll", help="Seconds between two looks at the job's state and new log lines.")
    ] = POLL_S,
) -> None:
    def action(f: Forja, interrupted: threading.Event) -> Any:
        return f.vertex_follow(
            name, VertexOptions(region=region), timeout_s=timeout, poll_s=poll, cancel=interrupted
        )

    follow_command(ctx, action, timeout)


@verb(Forja.vertex_cancel, "cancel", register=commands.command)
def cancel(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    region: Region = DEFAULT_REGION,
) -> None:
    job = forja_for(ctx).vertex_cancel(name, VertexOptions(region=region))
    if global_options(ctx).json:
        emit_json(job)
    else:
        out.print(f"run {name}: job {job.get('name')} is {job.get('state')}")
