"""`forja cost`: what each instance costs now, has cost, and would cost if left running.

Instances come from the Ansible inventory (read by `forja.inventory`: the hostvars the playbooks
see, as plain values) or from a JSON/YAML file of instance dicts, so the report also works offline and
in tests. Mounted into the main CLI as `forja cost`; `python -m forja.cost` runs it standalone.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from forja.cost.budget import Budget, BudgetCheck, Level, check_instance, check_project
from forja.cost.prices import PriceError, load_prices
from forja.cost.spend import CostLine, cost_report, parse_time, rate_of

app = typer.Typer(
    name="cost",
    help="Hourly rate, uptime, spend, monthly figure and disk cost of each instance.",
    invoke_without_command=True,
    no_args_is_help=False,
)

PricesOpt = Annotated[
    Path | None,
    typer.Option("--prices", help="YAML merged over the built-in price table (or $FORJA_PRICES)."),
]


def instances_from_file(path: Path) -> list[dict[str, Any]]:
    """A list of instance dicts, or {"instances": [...]}, in JSON or YAML."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise typer.BadParameter(f"{path} does not exist", param_hint="--instances") from exc
    if isinstance(data, dict) and "instances" in data:
        data = data["instances"]
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise typer.BadParameter(f"{path} must hold a list of instance mappings", param_hint="--instances")
    return data


def instances_from_inventory(inventory: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Hostvars of every host that looks like a GCP instance; the others are named, not priced.

    Read through `forja.inventory`, the one reader of the inventory: plain values, no cached facts.
    """
    from forja import inventory as inv
    from forja.errors import ForjaError

    try:
        return inv.gcp_instances(inventory)
    except ForjaError as exc:
        raise typer.BadParameter(exc.message, param_hint="--inventory") from exc


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if seconds else "-"


def render(lines: list[CostLine], checks: list[BudgetCheck | None], console: Console, date: str) -> None:
    table = Table(
        title=f"forja cost (prices of {date}; * = estimate)",
        caption="spent: since the last start (or the last run when stopped); total: over the known history; "
        "month: if left running 730 h, disk included; disk/mo: what it costs while stopped",
    )
    columns = (
        "instance",
        "zone",
        "type",
        "status",
        "$/h",
        "up",
        "spent",
        "total",
        "month",
        "disk/mo",
        "budget",
    )
    for column in columns:
        table.add_column(
            column, justify="left" if column in ("instance", "zone", "type", "status") else "right"
        )
    for line, chk in zip(lines, checks, strict=True):
        star = "*" if "estimate" in line.basis else ""
        table.add_row(
            line.name,
            line.zone,
            line.machine_type + (" spot" if line.spot else ""),
            line.status,
            f"{line.usd_per_hour:.4f}{star}",
            _duration(line.uptime_s),
            _money(line.session_usd),
            _money(line.total_usd),
            _money(line.monthly_if_running_usd),
            _money(line.disk_usd_per_month),
            "-" if chk is None else chk.level.value,
        )
    console.print(table)


@app.callback()
def show(
    ctx: typer.Context,
    instances: Annotated[
        Path | None,
        typer.Option("--instances", help="JSON/YAML list of instance dicts instead of the inventory."),
    ] = None,
    inventory: Annotated[
        str | None,
        typer.Option("--inventory", "-i", help="Inventory for ansible-inventory (default: ansible.cfg's)."),
    ] = None,
    prices: PricesOpt = None,
    cap: Annotated[float | None, typer.Option("--cap", help="Spend cap in USD to check against.")] = None,
    warn: Annotated[float, typer.Option("--warn", help="Warn at this fraction of the cap.")] = 0.8,
    scope: Annotated[
        str, typer.Option("--scope", help="Apply the cap per 'instance' or to the 'project'.")
    ] = "instance",
    now: Annotated[
        str | None, typer.Option("--now", help="Compute as of this RFC 3339 time (default: now).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show every instance's cost (the default action of `forja cost`)."""
    if ctx.invoked_subcommand is not None:
        return
    # Under the main CLI, `forja --json -i INV cost` passes its global options down.
    inventory = inventory or getattr(ctx.obj, "inventory", None)
    as_json = as_json or bool(getattr(ctx.obj, "json", False))
    if scope not in ("instance", "project"):
        raise typer.BadParameter(f"{scope!r}: use 'instance' or 'project'", param_hint="--scope")
    try:
        table = load_prices(prices)
        budget = Budget(cap, warn) if cap is not None else None
    except (PriceError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--prices/--cap/--warn") from exc
    moment = parse_time(now) if now else datetime.now(timezone.utc)
    skipped: list[str] = []
    if instances is not None:
        raw = instances_from_file(instances)
    else:
        raw, skipped = instances_from_inventory(inventory)
    try:
        lines = cost_report(raw, table, moment)
    except (PriceError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--instances/--inventory/--prices") from exc
    checks: list[BudgetCheck | None] = [None] * len(lines)
    project = None
    if budget is not None and scope == "instance":
        checks = [check_instance(budget, line) for line in lines]
    elif budget is not None:
        project = check_project(budget, lines)
    if as_json:
        out: dict[str, Any] = {
            "prices_date": table.date,
            "now": moment.isoformat(),
            "instances": [
                {
                    **line.as_dict(),
                    "budget": None if chk is None else {"level": chk.level.value, "message": chk.message},
                }
                for line, chk in zip(lines, checks, strict=True)
            ],
            "skipped": skipped,
        }
        if project is not None:
            out["project_budget"] = {"level": project.level.value, "message": project.message}
        typer.echo(json.dumps(out, indent=2))
        return
    console = Console()
    if not console.is_terminal:  # piped or captured: never truncate instance names to 80 columns
        console = Console(width=160)
    render(lines, checks, console, table.date)
    for chk, line in zip(checks, lines, strict=True):
        if chk is not None and chk.level is not Level.OK:
            console.print(f"[bold]{line.name}[/]: {chk.message}")
    if project is not None:
        console.print(f"project: {project.message}")
    if skipped:
        console.print(f"not priced (no machine_type/zone in hostvars): {', '.join(skipped)}")


@app.command("rate")
def rate(
    machine_type: Annotated[str, typer.Option("--machine-type", help="e.g. g2-standard-8")],
    zone: Annotated[str, typer.Option("--zone", help="e.g. us-east1-d")],
    spot: Annotated[bool, typer.Option("--spot", help="Spot price instead of on-demand.")] = False,
    prices: PricesOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON with the figure's basis.")] = False,
) -> None:
    """Print the hourly rate of one machine type (what the forja_hourly_rate filter gives playbooks)."""
    try:
        found = rate_of(machine_type, zone, load_prices(prices), spot)
    except (PriceError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--machine-type/--zone/--prices") from exc
    if as_json:
        typer.echo(json.dumps({"usd_per_hour": found.usd_per_hour, "basis": found.basis, "what": found.what}))
    else:
        typer.echo(f"{found.usd_per_hour}")
