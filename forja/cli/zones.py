"""`forja zones`: the VM's candidate zones ranked by Google's capacity advice (`Forja.zones`).

A table (or `--json`): per zone, whether the machine type is offered, obtainability, estimated Spot
uptime, the 30-day Spot preemption rate and the price an hour, best zone first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from forja import format as fmt
from forja.cli.common import Help, emit_json, forja_for, global_options, out, show_progress, verb

if TYPE_CHECKING:
    from forja.contract import ZoneReport

#: No name: `forja zones` is the root's own verb, registered in forja/cli/__init__.py.
commands = typer.Typer()

_UPTIME = {60: "1 min", 600: "10 min", 3600: "1 h+"}


def zones_table(report: ZoneReport) -> Table:
    """The ranking as people read it: one row per zone, the zone to try first at the top."""
    signal = "ranked by Google's capacity advice" if report.advised else f"your order ({report.signal})"
    table = Table(
        title=f"forja zones {report.project}: {report.machine_type} {report.provisioning_model.lower()}, "
              f"{signal} ({report.elapsed_s:.1f} s)",
        caption="obtainable: 0-1, how likely Google can give you the VM now (0.7+ go, below 0.4 look "
                "elsewhere); "
                "uptime: how long a Spot VM is expected to run; preempted: mean daily Spot preemption rate "
                "over 30 days",
    )
    for column in ("#", "zone", "offered", "obtainable", "uptime", "preempted 30d", "price", "note"):
        table.add_column(column, justify="right" if column in ("#", "obtainable", "preempted 30d", "price")
                         else "left")
    for place, z in enumerate(report.zones, 1):
        offered = {True: "yes", False: "[red]no[/]", None: "?"}[z.offered]
        table.add_row(
            str(place), z.zone + (" (your zone)" if z.given == 0 else ""), offered,
            "" if z.obtainability is None else f"{z.obtainability:.2f}",
            _UPTIME.get(z.estimated_uptime_s or -1, fmt.duration(z.estimated_uptime_s)
                        if z.estimated_uptime_s else ""),
            fmt.percent(z.preemption_rate_30d),
            fmt.hourly(z.usd_per_hour) if z.usd_per_hour is not None else "",
            z.no_signal,
        )
    return table


ZONES = Help(
    "Rank the zones the VM could be made in by Google's capacity advice, creating nothing.",
    """The VM is the inventory's (machine type, GPU, Spot or not, zone and fallback zones); -e
    changes it. Each candidate zone (the VM's, its fallback zones, the other zones of their regions
    and of each --region) gets: how likely Google can give you the VM now (obtainable, 0 to 1), how
    long a Spot VM is expected to run, the 30-day Spot preemption rate, the price an hour, and whether
    the machine type is offered there; the best zone comes first. When Google has no advice for the
    project, the zones keep your order and the report says why; that is never a failure. forja up
    tries its fallback zones in this order, and so does a managed run's watcher when it moves.""",
    examples=(
        "forja zones",
        "forja zones --region us-central1 --region europe-west4",
        "forja -e gcp_instance_spot=true zones --json | jq -r '.zones[0].zone'",
    ),
    see_also=("forja check", "forja up", "forja watch", "forja cost rate"),
)


@verb(ZONES, register=commands.command)
def zones(
    ctx: typer.Context,
    region: Annotated[list[str] | None, typer.Option(
        "--region", help="Rank this region's zones too (repeat for more), besides those of the VM's zone and "
                         "fallback zones.")] = None,
) -> None:
    o = global_options(ctx)
    with show_progress(not o.json) as on_event:
        report = forja_for(ctx, on_event).zones(regions=region or ())
    if o.json:
        emit_json(report.model_dump())
    else:
        out.print(zones_table(report))
        if report.suggestion:
            out.print(f"[yellow]{report.suggestion}[/]")
