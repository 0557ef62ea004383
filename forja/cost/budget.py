"""Budget: a spend cap per instance or per project, with a warning before it is reached.

The controller side (this module) judges spend computed from the cloud's timestamps; the host
side (the autostop agent) enforces the same rule from its own uptime, because a VM that runs
away overnight has no controller watching it. Both use the same levels and wording. The figures
in a message are for people (`forja.format`: `0.4¢`, `$1.20`, `$0.85/h`, `10h 00m`); `spend_usd`,
`cap_usd` and `hours_left` keep every digit for --json.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence

from forja import format as fmt
from forja.cost.spend import CostLine


class Level(str, enum.Enum):
    OK = "ok"
    WARN = "warn"
    CAP = "cap"


@dataclasses.dataclass(frozen=True)
class Budget:
    """A cap in USD and the fraction of it at which to warn (0.8 = warn at 80 %)."""

    cap_usd: float
    warn_fraction: float = 0.8

    def __post_init__(self) -> None:
        if isinstance(self.cap_usd, bool) or not isinstance(self.cap_usd, int | float) or self.cap_usd <= 0:
            raise ValueError(f"budget cap_usd is {self.cap_usd!r}; give a positive amount in USD, e.g. 50")
        if not 0 < self.warn_fraction <= 1:
            raise ValueError(
                f"budget warn_fraction is {self.warn_fraction!r}; "
                "give a fraction of the cap in (0, 1], e.g. 0.8"
            )


@dataclasses.dataclass(frozen=True)
class BudgetCheck:
    level: Level
    spend_usd: float
    cap_usd: float
    hours_left: float | None
    message: str


def check(budget: Budget, spend_usd: float, usd_per_hour: float = 0.0) -> BudgetCheck:
    """Where spend stands against the cap, and how many running hours are left at this rate."""
    left = budget.cap_usd - spend_usd
    hours_left = max(0.0, left / usd_per_hour) if usd_per_hour > 0 else None
    if spend_usd >= budget.cap_usd:
        level = Level.CAP
        message = f"spend cap {fmt.money(budget.cap_usd)} reached (spent {fmt.money(spend_usd)})"
    elif spend_usd >= budget.warn_fraction * budget.cap_usd:
        level = Level.WARN
        message = (
            f"spent {fmt.money(spend_usd)} of the {fmt.money(budget.cap_usd)} cap "
            f"({spend_usd / budget.cap_usd:.0%}, warning at {budget.warn_fraction:.0%})"
        )
    else:
        level = Level.OK
        message = f"spent {fmt.money(spend_usd)} of the {fmt.money(budget.cap_usd)} cap"
    if hours_left is not None and level is not Level.CAP:
        message += f"; {fmt.duration(hours_left * 3600)} of running left at {fmt.hourly(usd_per_hour)}"
    return BudgetCheck(level, round(spend_usd, 6), budget.cap_usd, hours_left, message)


def line_spend(line: CostLine) -> float:
    """An instance's spend: its whole history when known, else its current or last session."""
    return line.total_usd if line.total_usd is not None else line.session_usd


def check_instance(budget: Budget, line: CostLine) -> BudgetCheck:
    rate = line.usd_per_hour if line.status.upper() == "RUNNING" else 0.0
    return check(budget, line_spend(line), rate)


def check_project(budget: Budget, lines: Iterable[CostLine]) -> BudgetCheck:
    """The project cap counts every instance's spend and the burn rate of those running."""
    lines = list(lines)
    spend = sum(line_spend(line) for line in lines)
    rate = sum(line.usd_per_hour for line in lines if line.status.upper() == "RUNNING")
    return check(budget, spend, rate)


def check_units(budget: Budget, units: Iterable[Sequence[CostLine]]) -> dict[str, BudgetCheck]:
    """A per-instance cap, by instance name: a cluster's members share one check of their spend and
    rate added up, since a cluster is made, kept and paid for as one (a cap per member would let four
    VMs spend four caps)."""
    found: dict[str, BudgetCheck] = {}
    for unit in units:
        unit = list(unit)
        chk = check_instance(budget, unit[0]) if len(unit) == 1 else check_project(budget, unit)
        found.update((line.name, chk) for line in unit)
    return found
