"""`forja vertex follow|cancel RUN` and the options of `forja train --backend vertex`.

In its own file so forja/cli.py, which many parts edit, gains a few lines; the commands register
through forja.cli's `verb` (help = the API's docstring, errors through the one error path) and
print with its printers. Cancelling is its own verb, not a flag of `train`: `forja train` starts
runs and `forja stop` ends a VM run by name; a Vertex job is ended by Vertex's own cancel, which
needs only the run's name, the region and the project, never a config.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from forja.api import Forja
from forja.cli import _emit_json, _follow_command, _forja, _opts, out, verb
from forja.vertex import DEFAULT_REGION, POLL_S, VertexOptions

vertex_app = typer.Typer(name="vertex", no_args_is_help=True)

Region = Annotated[str, typer.Option("--region", help="The job's region (as `forja train --region`).")]


def options(
    bucket: str | None,
    region: str | None,
    machine_type: str | None,
    accelerator: str | None,
    accelerator_count: int | None,
    replicas: int,
) -> VertexOptions:
    """`forja train --backend vertex`'s options as the API's VertexOptions (None: its default)."""
    return VertexOptions(bucket=bucket, region=region or DEFAULT_REGION, machine_type=machine_type,
                         accelerator_type=accelerator, accelerator_count=accelerator_count,
                         replica_count=replicas)  # fmt: skip


def is_vertex_job(hosts: Sequence[str]) -> bool:
    """Whether a TrainResult's `hosts` name a Vertex job (its resource name) rather than VMs."""
    return bool(hosts) and "/customJobs/" in hosts[0]


@verb(Forja.vertex_follow, "follow", register=vertex_app.command)
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

    _follow_command(ctx, action, timeout)


@verb(Forja.vertex_cancel, "cancel", register=vertex_app.command)
def cancel(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    region: Region = DEFAULT_REGION,
) -> None:
    job = _forja(ctx).vertex_cancel(name, VertexOptions(region=region))
    if _opts(ctx).json:
        _emit_json(job)
    else:
        out.print(f"run {name}: job {job.get('name')} is {job.get('state')}")
