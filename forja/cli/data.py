"""`forja data push PATH`: the CLI side of `Forja.push_data` (parse, show progress, print).

It registers through forja/cli/common.py's `verb`, so its help is its own (PUSH) and errors take the
one error path; its own progress display shows bytes and files, as a push is measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from forja import format as fmt
from forja.cli.common import (
    Help,
    YesOption,
    asker,
    console,
    emit_json,
    forja_for,
    global_options,
    group,
    out,
    result_table,
    verb,
)
from forja.defaults import PUSH_THREADS

commands = group("data", Help(
    "Datasets: push a folder to the project's bucket, for your runs to read.",
    examples=("forja data push ~/datasets/flowers",),
    see_also=("forja train --delete-data-after",),
), no_args_is_help=True)

_PHASES = {"hash": "hashing", "upload": "uploading", "manifest": "writing the manifest"}


def _table(result: Any) -> Table:
    took = fmt.duration(result.seconds) if result.seconds >= 1 else f"{result.seconds:.1f} s"
    table = Table(title=f"{result.url} ({took})")
    for column in ("files", "size", "sent", "already there", "left out", "secrets left out"):
        table.add_column(column)
    table.add_row(str(result.files), _bytes(result.total_size),
                  f"{result.uploaded_files} ({_bytes(result.uploaded_bytes)})", str(result.skipped_files),
                  str(len(result.excluded)), str(len(result.secrets_excluded)))
    return table


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _say(text: str) -> None:
    """What will be sent, for people (stderr, before the progress bar)."""
    console.print(text, soft_wrap=True, highlight=False, markup=False)


PUSH = Help(
    "Push a dataset folder to the project's bucket, as gs://BUCKET/datasets/NAME, for your runs to read.",
    """Each distinct file is stored once, by its content, so a second push sends only what changed and
    an interrupted push resumes where it stopped: push again. Uploads run in parallel (--threads),
    each checked against its checksum; the manifest is written last, so a partial push never looks
    complete. Files that look like keys or secrets are left out, as for forja train. The bucket is
    --bucket, else the inventory's dataset_bucket or gcp_bucket_name. Without a bucket (or with
    --to-host) the folder goes straight to the VM's disk (rsync over SSH, each file checked there).
    What will be sent is shown first, and you are asked at a terminal unless --yes.

    A run reads it as gs://BUCKET/datasets/NAME (its config's data_args.source), or staged on the VM's
    disk.""",
    examples=(
        "forja data push ~/datasets/flowers",
        "forja data push ./data --name flowers-v2 --exclude '*.tmp' --yes",
        "forja data push ./data --to-host",
    ),
    see_also=("forja train --delete-data-after", "forja train"),
)


@verb(PUSH, "push", register=commands.command)
def push(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="The dataset folder.")],
    name: Annotated[
        str | None, typer.Option("--name", help="Dataset name (default: the folder's name).")
    ] = None,
    bucket: Annotated[
        str | None, typer.Option("--bucket", help="gs://BUCKET (default: the inventory's dataset_bucket).")
    ] = None,
    threads: Annotated[
        int, typer.Option("--threads", help="Parallel uploads.", min=1, max=64)
    ] = PUSH_THREADS,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="Another glob to leave out (repeatable).")
    ] = None,
    to_host: Annotated[
        bool, typer.Option("--to-host", help="Straight to the VM's disk (rsync), even if there is a bucket.")
    ] = False,
    yes: YesOption = False,
) -> None:
    forja = forja_for(ctx)
    asking = {"yes": yes, "ask": asker(ctx), "say": _say}
    if global_options(ctx).json or to_host:
        result = forja.push_data(path, name, bucket, threads=threads, excludes=exclude or [], to_host=to_host,
                                 **asking)
        if global_options(ctx).json:
            emit_json(result.as_dict() if hasattr(result, "as_dict") else result)
        else:
            out.print(result_table(result))
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TextColumn("{task.fields[files]}"), TimeElapsedColumn(), console=console,
    ) as progress:  # fmt: skip
        task = progress.add_task("hashing", total=None, files="")

        def on_progress(p: Any) -> None:
            progress.update(task, description=_PHASES.get(p.phase, p.phase), completed=p.bytes_done,
                            total=p.bytes_total or None, files=f"{p.files_done}/{p.files_total} files")

        result = forja.push_data(path, name, bucket, threads=threads, excludes=exclude or [],
                                 on_progress=on_progress, **asking)
    if not hasattr(result, "uploaded_files"):  # no bucket anywhere: the playbook sent it straight to the VMs
        out.print(result_table(result))
        return
    out.print(_table(result))
    if result.secrets_excluded:
        out.print(f"left out as secrets: {', '.join(result.secrets_excluded[:10])}")
