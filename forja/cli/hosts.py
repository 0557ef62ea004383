"""`forja up | configure | down`: the host's lifecycle, each verb one `Forja` method that runs playbooks.

Each prints the playbooks' recap table (or the result's JSON) through forja/cli/common.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from forja import errors
from forja.cli.common import (
    Help,
    emit_json,
    forja_for,
    global_options,
    out,
    result_table,
    run_playbooks,
    show_progress,
    verb,
)

if TYPE_CHECKING:
    from forja.contract import PreflightReport

#: No name: its verbs are the root's own (`forja up`), registered in forja/cli/__init__.py.
commands = typer.Typer()


#: Each status's colour in the check's table.
_STATUS_STYLE = {"fail": "bold red", "warn": "yellow", "ok": "green", "skip": "dim"}


def check_table(report: PreflightReport) -> Table:
    """The preflight as people read it: one row per finding, what to do beside each problem."""
    from forja.preflight import STATUS_WORDS

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


CHECK = Help(
    "Check your Google Cloud project for the VM that forja up would make, creating nothing.",
    """Asks Google, read-only: your credentials, the project and its billing, the APIs forja needs
    (Compute Engine; IAP for the iap SSH path; Cloud Storage when there is a bucket; Vertex AI with
    --vertex), your permissions, the machine type in each zone, the image, the GPU, CPU and disk
    quota, this machine's SSH key and IAP command, and the price. For a Spot VM it also reads Google's
    capacity advice and warns (never blocks) when even the best zone is unlikely to have one,
    suggesting a Flex-start VM instead.

    Every problem comes with its fix. forja up runs the same check first and stops when something
    blocks; this command exits 9 then.""",
    examples=(
        "forja check",
        "forja -i ~/.config/forja/inventory check --vertex",
        "forja check --json | jq '.findings[] | select(.status == \"fail\")'",
    ),
    see_also=("forja init", "forja up", "forja zones"),
)


@verb(CHECK, register=commands.command)
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


UP = Help(
    "Create the GPU VM(s) of the inventory, or start them if they are stopped.",
    """Checks the project first (as forja check does) and creates nothing when something blocks: no
    quota, an API off, a missing permission or tool; --no-check skips that. Runs
    playbooks/provision.yml; -e changes what it makes, e.g. another zone.

    A Flex-start VM (gcp_instance_provisioning_model: flex_start in the inventory) waits at Google for
    capacity, up to gcp_instance_flex_start_wait, with a progress line at each look. Ctrl-C stops
    waiting and leaves the request queued: forja up again waits for it once more, forja down --delete
    withdraws it.""",
    examples=(
        "forja up",
        "forja -i inventory/sandbox up",
        "forja -e gcp_instance_zone=us-central1-a up --no-check",
    ),
    see_also=("forja configure", "forja check", "forja down", "forja zones"),
)


@verb(UP, register=commands.command,
      on_interrupt="stopped waiting; what was made stays, and a queued Flex-start request stays queued at "
                   "Google: forja up again goes on (and waits for it), forja down --delete withdraws it")
def up(
    ctx: typer.Context,
    no_check: Annotated[bool, typer.Option(
        "--no-check", help="Skip the check of the project (quota, APIs, permissions, ...) that runs before "
        "anything is created.")] = False,
) -> None:
    run_playbooks(ctx, lambda f: f.up(check=not no_check))


CONFIGURE = Help(
    "Set up the VM: the NVIDIA stack, Jupyter for Colab, and the guard that stops it when idle.",
    """Runs playbooks/gpu.yml, jupyter.yml and autostop.yml on the inventory's VMs; run it again at
    any time: what is in place stays, what went missing is put back. The idle guard watches Jupyter's
    kernels, so a Jupyter port moved with -e host_contract_jupyter_port=N moves it too.""",
    examples=(
        "forja configure",
        "forja -l forja-l4 configure   # one VM of the inventory",
    ),
    see_also=("forja up", "forja tunnel", "forja train"),
)


@verb(CONFIGURE, register=commands.command)
def configure(ctx: typer.Context) -> None:
    run_playbooks(ctx, lambda f: f.configure())


DOWN = Help(
    "Stop the GPU VM(s), or delete them with --delete.",
    """Stopping keeps the boot disk (it is still billed, by the month) and the buckets. With --delete
    the VM and its boot disk go; what goes and what stays (each disk with its monthly cost, the
    buckets) is said first, and under --json it is the result's deletion_plan. Nothing asks to
    confirm, so scripts and cron run it as they are. Runs playbooks/teardown.yml.""",
    examples=(
        "forja down",
        "forja down --delete",
        "forja --json down --delete | jq .deletion_plan",
    ),
    see_also=("forja up", "forja prune", "forja cost"),
)


@verb(DOWN, register=commands.command)
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


PRUNE = Help(
    "Delete the VMs that stayed stopped too long, once their checkpoints are safe in the bucket.",
    """A VM goes when it has been stopped longer than the inventory's autostop_delete_after (e.g. 7d;
    off by default) and its runs' newest checkpoints and results are all in the checkpoint bucket
    (the idle guard records them on the VM just before it powers it off). A VM that is due but in
    doubt (no bucket, something missing, stopped by forja down) is kept, with a warning naming how long it has
    been stopped, what its disk costs a month and the fix. --dry-run says what would go and why, and
    deletes nothing. Runs playbooks/prune.yml; run it from cron to make it automatic, e.g. every hour
    (crontab -e): 17 * * * * cd ~/forja && .venv/bin/forja -i inventory/gcp_gpu.yml prune --notify""",
    examples=(
        "forja prune --dry-run",
        "forja -i inventory/gcp_gpu.yml prune --notify",
    ),
    see_also=("forja down", "forja cost"),
)


@verb(PRUNE, register=commands.command)
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
