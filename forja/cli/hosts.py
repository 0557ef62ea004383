"""`forja up | configure | down`: the host's lifecycle, each verb one `Forja` method that runs playbooks.

Each prints the playbooks' recap table (or the result's JSON) through forja/cli/common.py.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from forja import errors
from forja.api import Forja
from forja.cli.common import (
    emit_json,
    forja_for,
    global_options,
    out,
    run_playbooks,
    show_progress,
    verb,
)
from forja.contract import PreflightReport
from forja.preflight import STATUS_WORDS

#: No name: its verbs are the root's own (`forja up`), registered in forja/cli/__init__.py.
commands = typer.Typer()


#: Each status's colour in the check's table.
_STATUS_STYLE = {"fail": "bold red", "warn": "yellow", "ok": "green", "skip": "dim"}


def check_table(report: PreflightReport) -> Table:
    """The preflight as people read it: one row per finding, what to do beside each problem."""
    failed = len(report.failed)
    verdict = (f"{failed} problem{'s' if failed != 1 else ''} to fix before forja up" if failed
               else "ready for forja up")
    table = Table(title=f"forja check {report.project}: {verdict} ({report.elapsed_s:.1f} s)")
    for column in ("check", "subject", "status", "found", "what to do"):
        table.add_column(column, overflow="fold")
    for f in report.findings:
        style = _STATUS_STYLE.get(f.status, "")
        fix = " ".join(part for part in (f.fix, f.link if f.link not in f.fix else "") if part)
        status = f"[{style}]{STATUS_WORDS.get(f.status, f.status)}[/]"
        table.add_row(f.check, f.subject, status, f.detail, fix)
    return table


@verb(
    Forja.check,
    register=commands.command,
    epilog="Examples:\n\n  forja -i ~/.config/forja/inventory check\n\n  forja check --vertex --json | jq "
           "'.findings[] | select(.status == \"fail\")'\n\nExit code 9 when something blocks forja up.",
)
def check(
    ctx: typer.Context,
    vertex: Annotated[bool, typer.Option("--vertex", help="Also check what Vertex AI jobs need "
                                         "(forja train --backend vertex): its API and permission.")] = False,
) -> None:
    o = global_options(ctx)
    with show_progress(not o.json) as on_event:
        report = forja_for(ctx, on_event).check(vertex=vertex)
    if o.json:
        emit_json(report.model_dump())
    else:
        out.print(check_table(report))
    if report.blocking:  # the table (or the JSON) said what and why: only the exit code is left
        raise typer.Exit(int(errors.ExitCode.CHECK_FAILED))


@verb(Forja.up, register=commands.command)
def up(
    ctx: typer.Context,
    no_check: Annotated[bool, typer.Option(
        "--no-check", help="Skip the check of the project (quota, APIs, permissions, ...) that runs before "
        "anything is created.")] = False,
) -> None:
    run_playbooks(ctx, lambda f: f.up(check=not no_check))


@verb(Forja.configure, register=commands.command)
def configure(ctx: typer.Context) -> None:
    run_playbooks(ctx, lambda f: f.configure())


@verb(Forja.down, register=commands.command)
def down(
    ctx: typer.Context,
    delete: Annotated[bool, typer.Option("--delete", help="Delete the VM instead of stopping it.")] = False,
) -> None:
    run_playbooks(ctx, lambda f: f.down(delete=delete))

