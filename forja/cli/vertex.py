"""`forja vertex follow|cancel RUN`: a run sent with `forja train --backend vertex` (forja/cli/train.py).

The commands register through forja/cli/common.py's `verb` (their own help, errors through the one
error path) and print with its printers; `follow` takes the same follow-and-print
path as `forja follow` (`follow_command`). Cancelling is its own verb, not a flag of `train`:
`forja train` starts runs and `forja stop` ends a VM run by name; a Vertex job is ended by Vertex's
own cancel, which needs only the run's name, the region and the project, never a config.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Annotated, Any

import typer

from forja.cli.common import Help, emit_json, follow_command, forja_for, global_options, group, out, verb
from forja.defaults import VERTEX_POLL_S
from forja.vertex_job import DEFAULT_REGION, VertexOptions

if TYPE_CHECKING:
    from forja.api import Forja

commands = group("vertex", Help(
    "Runs sent to Vertex AI with forja train --backend vertex: follow one, cancel one.",
    examples=("forja train trainer/configs/digits.yaml --backend vertex --bucket gs://my-bucket --detach",
              "forja vertex follow digits-1130-1244"),
    see_also=("forja train --backend vertex",),
), no_args_is_help=True)

Region = Annotated[str, typer.Option("--region", help="The job's region (as `forja train --region`).")]


FOLLOW = Help(
    "Follow a run sent to Vertex AI until its job ends, then fetch its logs, summary and model.",
    """Each replica's new log lines (from Cloud Logging) are shown as they come. The job is found by
    the run's name in the project (FORJA_GCP_PROJECT) and --region. Ctrl-C or an expired --timeout
    stops watching (exit 7), never the job: forja vertex follow NAME picks it up again.""",
    examples=("forja vertex follow digits-1130-1244",
              "forja vertex follow lr3 --region europe-west4 --timeout 3600"),
    see_also=("forja vertex cancel", "forja train --backend vertex", "forja runs"),
)


@verb(FOLLOW, "follow", register=commands.command)
def follow(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Run name.")],
    region: Region = DEFAULT_REGION,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Stop following after S s; the job goes on (exit 7).")
    ] = None,
    poll: Annotated[
        float, typer.Option("--poll", help="Seconds between two looks at the job's state and new log lines.")
    ] = VERTEX_POLL_S,
) -> None:
    def action(f: Forja, interrupted: threading.Event) -> Any:
        return f.vertex_follow(
            name, VertexOptions(region=region), timeout_s=timeout, poll_s=poll, cancel=interrupted
        )

    follow_command(ctx, action, timeout)


CANCEL = Help(
    "Cancel the Vertex AI job of a run sent with forja train --backend vertex.",
    """The job is found by the run's name in the project (FORJA_GCP_PROJECT) and --region. It prints
    the job once Vertex says it is cancelled (or after a minute, as it is then). A job that already
    ended is left alone.""",
    examples=("forja vertex cancel digits-1130-1244", "forja vertex cancel lr3 --region europe-west4 --json"),
    see_also=("forja vertex follow", "forja stop"),
)


@verb(CANCEL, "cancel", register=commands.command)
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
