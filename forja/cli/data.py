"""`forja data push PATH`: the CLI side of `Forja.push_data` (parse, show progress, print).

It registers through forja/cli/common.py's `verb`, so the help is the API's docstring and errors
take the one error path; its own progress display shows bytes and files, as a push is measured.
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
from forja.api import Forja
from forja.cli.common import (
    YesOption,
    asker,
    console,
    emit_json,
    forja_for,
    global_options,
    out,
    result_table,
    verb,
)
from forja.datasets import PUSH_THREADS

commands = typer.Typer(name="data", help="Datasets: push a folder to the project's bucket.",
                       no_args_is_help=True)

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


@verb(Forja.push_data, "push", register=commands.command)
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
