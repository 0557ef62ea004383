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
    result_table,
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


@verb(Forja.up, register=commands.command,
      on_interrupt="stopped waiting; what was made stays, and a queued Flex-start request stays queued at "
                   "Google: forja up again goes on (and waits for it), forja down --delete withdraws it")
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
    delete: Annotated[bool, typer.Option(
        "--delete", help="Delete the VM and its boot disk instead of stopping it; what goes and what stays "
        "(the buckets) is said first.")] = False,
) -> None:
    if not delete:
        run_playbooks(ctx, lambda f: f.down(delete=False))
        return
    from forja import deletion
    from forja import format as fmt

    o = global_options(ctx)
    with show_progress(not o.json) as on_event:
        forja = forja_for(ctx, on_event)
        plan = deletion.plan(forja)  # said by down itself (an announcement), before the play runs
        result = forja.down(delete=True, plan=plan)
    if o.json:
        emit_json({**fmt.plain(result, drop=("events",)), "deletion_plan": plan.as_dict()})
    else:
        out.print(result_table(result))


#: What each prune decision reads as in the table (a dry run's "delete" is "would delete").
_PRUNE_WORDS = {"delete": "[bold red]deleted[/]", "keep": "[yellow]kept (in doubt)[/]", "wait": "waits",
                "not-stopped": "[dim]not stopped[/]", "off": "[dim]off[/]", "absent": "[dim]gone[/]"}


@verb(
    Forja.prune,
    register=commands.command,
    epilog="Examples:\n\n  forja prune --dry-run\n\n  forja -i inventory/gcp_gpu.yml prune --notify\n\n"
           "Automatic, every hour (crontab -e):\n\n  17 * * * *  cd ~/forja && .venv/bin/forja -i "
           "inventory/gcp_gpu.yml prune --notify >> ~/.cache/forja/prune.log 2>&1",
)
def prune(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Say what would be deleted and why (or why not); delete nothing.")] = False,
    notify: Annotated[bool, typer.Option(
        "--notify", help="Post a disk_deleted event for each VM deleted, as JSON, to the webhook in "
        "FORJA_NOTIFY_WEBHOOK, else the inventory's notify_webhook.")] = False,
) -> None:
    from forja import format as fmt

    o = global_options(ctx)
    with show_progress(not o.json) as on_event:
        report = forja_for(ctx, on_event).prune(dry_run=dry_run, notify=notify)
    if o.json:
        emit_json(report.as_dict())
        return
    title = "forja prune --dry-run: nothing is deleted" if dry_run else "forja prune"
    table = Table(title=title)
    for column in ("VM", "status", "stopped for", "disk / month", "decision", "why"):
        table.add_column(column, overflow="fold")
    for v in report.verdicts.values():
        would = v.action == "delete" and not v.deleted
        word = "[bold]would delete[/]" if would else _PRUNE_WORDS.get(v.action, v.action)
        stopped = fmt.duration(v.stopped_for_s) if v.stopped_for_s is not None else ""
        table.add_row(v.vm, v.status, stopped, fmt.money(v.disk_usd_per_month), word, v.reason)
    out.print(table if report.verdicts else "No GPU VM in the inventory (group forja_gpu): nothing to prune.")
    for v in report.kept:
        out.print(f"[yellow]warning:[/] {v.warning}")
    if report.deleted:
        saved = fmt.money(report.saved_usd_per_month)
        out.print(f"Deleted {len(report.deleted)} VM(s): {saved}/month of disk no longer billed.")
