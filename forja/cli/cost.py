"""`forja cost` and `forja cost rate`: what the VMs and the runs cost, and a machine's hourly rate.

`forja cost` is a group that is itself a verb (its callback calls `Forja.cost`) with one sub-command,
`rate` (`Forja.rate`); `python -m forja.cost` runs the same command (forja/cost/__main__.py).
`forja train` shows its own estimate before sending (forja/cli/train.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from forja import format as fmt
from forja.cli.common import Help, emit_json, forja_for, global_options, out, verb
from forja.defaults import SCOPES, WARN_AT

#: `forja cost`: without a sub-command its callback is the verb (`Forja.cost`); its help is COST's.
commands = typer.Typer(name="cost", invoke_without_command=True, no_args_is_help=False)


def _cost_table(report: Any) -> Table:
    table = Table(
        title=f"forja cost (prices of {report.prices_date}; * = estimate)",
        caption="spent: since the last start (or the last run when stopped); total: over the known history; "
        "month: if left running 730 h, disk included; disk/mo: what it costs while stopped",
    )
    columns = ("instance", "zone", "type", "status", "rate", "up", "spent", "total", "month", "disk/mo",
               "budget")
    for column in columns:
        table.add_column(column, justify="left" if column in columns[:4] else "right")
    for line, chk in zip(report.lines, report.checks, strict=True):
        star = "*" if "estimate" in line.basis else ""
        table.add_row(
            line.name,
            line.zone,
            line.machine_type + (" spot" if line.spot else ""),
            line.status,
            fmt.hourly(line.usd_per_hour) + star,
            fmt.duration(line.uptime_s) if line.uptime_s else "-",
            fmt.money(line.session_usd),
            fmt.money(line.total_usd) or "-",
            fmt.money(line.monthly_if_running_usd),
            fmt.money(line.disk_usd_per_month) or "-",
            "-" if chk is None else chk.level.value,
        )
    if report.clusters:
        table.add_section()
    for unit in report.clusters:  # each cluster's members added up: what it costs as one
        chk = report.checks[[line.name for line in report.lines].index(unit.members[0])]
        table.add_row(
            f"cluster {unit.name}", "", unit.machine, f"{unit.running}/{unit.count} running",
            fmt.hourly(unit.usd_per_hour) + ("*" if "estimate" in unit.basis else ""), "",
            fmt.money(unit.session_usd), fmt.money(unit.total_usd) or "-",
            fmt.money(unit.monthly_if_running_usd), fmt.money(unit.disk_usd_per_month) or "-",
            "-" if chk is None else chk.level.value, style="bold",
        )
    return table


COST = Help(
    "Show what the VMs cost: each one's hourly rate, uptime, spend, month if left running, and disk.",
    """The VMs are the inventory's (or those of an --instances file, for a report made offline).
    Prices are forja's built-in table of Google's list prices, with --prices (a YAML file, or
    FORJA_PRICES) merged over it; an estimated price is marked *. --cap checks the spend against a cap
    in USD, per VM or for the whole project (--scope), warning at the --warn fraction of it. --run NAME
    shows one run's cost instead, part by part: setup, waiting for data, evaluation and the rest, time
    down, the disk.""",
    examples=(
        "forja cost",
        "forja cost --cap 50 --scope project",
        "forja cost --run lr3",
        "forja cost rate --machine-type g2-standard-8 --zone us-east1-d --spot",
    ),
    see_also=("forja cost rate", "forja plan", "forja runs", "forja prune"),
)


@verb(COST, register=commands.callback)
def cost(
    ctx: typer.Context,
    instances: Annotated[
        Path | None,
        typer.Option("--instances", help="A JSON or YAML file listing instances (name, zone, machine_type, "
                     "status, ... as the Compute API describes them) instead of the inventory."),
    ] = None,
    prices: Annotated[
        Path | None,
        typer.Option("--prices", help="YAML merged over the built-in price table (or $FORJA_PRICES)."),
    ] = None,
    cap: Annotated[float | None, typer.Option("--cap", help="Spend cap in USD to check against.")] = None,
    warn: Annotated[float, typer.Option("--warn", help="Warn at this fraction of the cap.")] = WARN_AT,
    scope: Annotated[
        str, typer.Option("--scope", help="Apply the cap per 'instance' or to the 'project'.")
    ] = SCOPES[0],
    now: Annotated[
        str | None, typer.Option("--now", help="Compute as of this RFC 3339 time (default: now).")
    ] = None,
    run: Annotated[
        str | None, typer.Option("--run", help="One run's cost (its id or name): setup, waiting for data, "
                                 "evaluation and the rest, time down, the disk.")
    ] = None,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from forja.cost.instances import instances_from_file

    given = instances_from_file(instances) if instances is not None else None
    if run is not None:
        _show_run_cost(ctx, forja_for(ctx).run_cost(run, given, prices=prices, now=now))
        return
    report = forja_for(ctx).cost(
        given, prices=prices, cap=cap, warn=warn, scope=scope, now=now
    )
    if global_options(ctx).json:
        emit_json(report.as_dict())
        return
    out.print(_cost_table(report))
    from forja.cost.budget import Level

    told: set[int] = set()  # a cluster's members share one check: said once, for the cluster
    named = {member: f"cluster {c.name} ({c.machine})" for c in report.clusters for member in c.members}
    for chk, line in zip(report.checks, report.lines, strict=True):
        if chk is not None and chk.level is not Level.OK and id(chk) not in told:
            told.add(id(chk))
            out.print(f"[bold]{named.get(line.name, line.name)}[/]: {chk.message}")
    if report.project is not None:
        out.print(f"project: {report.project.message}")
    stopped, stopped_month = report.stopped_disks
    if stopped:
        out.print(f"stopped, disk still billed: {fmt.money(stopped_month)}/month ({', '.join(stopped)}); "
                  "autostop_delete_after with `forja prune` deletes a VM stopped that long once its "
                  "checkpoints are in the bucket, `forja down --delete` does it now")
    if report.skipped:
        out.print(f"not priced (no machine_type/zone in hostvars): {', '.join(report.skipped)}")
    if report.own_machines:
        out.print(f"own machine, no cloud price: {', '.join(report.own_machines)}")


def _show_run_cost(ctx: typer.Context, found: Any) -> None:
    """`forja cost --run ID`: what the run cost, part by part (or its JSON, every digit)."""
    if global_options(ctx).json:
        emit_json(found.as_dict())
        return
    ended = fmt.timestamp(found.ended_at) if found.ended_at else "still running"
    table = Table(title=f"run {found.run_id}: {found.status}, {fmt.timestamp(found.started_at)} to {ended}",
                  caption=f"rate {fmt.hourly(found.usd_per_hour)}: {found.rate_source}")
    for column in ("part", "time", "cost", "share"):
        table.add_column(column, justify="left" if column == "part" else "right")
    known = [part for part in found.parts if part.seconds is not None]
    for part in known:  # the split comes from the fetched results; without them there is none
        share = part.seconds / found.up_s if found.up_s else None
        table.add_row(part.name.replace("_", " "), fmt.duration(part.seconds), fmt.money(part.usd),
                      fmt.percent(share))
    table.add_row("VM up for the run", fmt.duration(found.up_s), fmt.money(found.vm_usd), "",
                  end_section=True)
    table.add_row(f"down, VM not billed ({found.preemptions} preempted, {found.zone_moves} zone moves)",
                  fmt.duration(found.down_s), "", "")
    table.add_row("disk, the whole time", fmt.duration(found.span_s), fmt.money(found.disk_usd) or "?", "")
    table.add_row("[bold]total[/]", "", f"[bold]{fmt.money(found.cost_usd)}[/]", "")
    out.print(table)
    if not known:
        out.print(f"no split into setup, compute, data wait and evaluation: the run's results are not on "
                  f"this machine (fetch them with `forja fetch {found.run_id}`)")
    if found.disk_usd is None:
        out.print("the disk is not counted: no record of the run's VM (name the inventory or --instances)")
    if found.training_usd is not None:
        from forja.cost.run import TRAINING_LABEL

        out.print(f"{TRAINING_LABEL}: {fmt.money(found.training_usd)}")


RATE = Help(
    "Show the hourly rate of one machine type in one zone, on demand or Spot, and where it comes from.",
    """Priced from forja's built-in table of Google's list prices (with --prices merged over it), as
    forja cost and forja plan price; the basis says which prices were added up, or that it is an
    estimate. Nothing is asked of Google and no inventory is needed.""",
    examples=(
        "forja cost rate --machine-type g2-standard-8 --zone us-east1-d",
        "forja cost rate --machine-type g2-standard-24 --zone us-central1-a --spot --json",
    ),
    see_also=("forja cost", "forja plan", "forja zones"),
)


@verb(RATE, "rate", register=commands.command)
def rate(
    ctx: typer.Context,
    machine_type: Annotated[str, typer.Option("--machine-type", help="e.g. g2-standard-8")],
    zone: Annotated[str, typer.Option("--zone", help="e.g. us-east1-d")],
    spot: Annotated[bool, typer.Option("--spot", help="Spot price instead of on-demand.")] = False,
    prices: Annotated[
        Path | None,
        typer.Option("--prices", help="YAML merged over the built-in price table (or $FORJA_PRICES)."),
    ] = None,
) -> None:
    found = forja_for(ctx).rate(machine_type, zone, spot=spot, prices=prices)
    if global_options(ctx).json:
        emit_json({"usd_per_hour": found.usd_per_hour, "basis": found.basis, "what": found.what})
    else:
        out.print(f"{fmt.hourly(found.usd_per_hour)} ({found.what}; {found.basis})")
