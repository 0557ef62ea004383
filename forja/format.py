"""Numbers for people: how the `forja` command prints losses, money, rates and durations.

Raw floats are for programs (`--json` keeps every digit); a person reading a table needs the
digits that mean something and the unit: `final loss 0.008180`, not `0.008180368691682816`;
`0.2¢`, not `$0.0019884954039891124`; `$0.71/h`; `3.2 steps/s`; `2h 05m`. Every function here is
pure and total: None (a figure nobody reported) prints as an empty cell, never as "None".
"""

from __future__ import annotations

import math

#: What a missing figure prints as in a table.
MISSING = ""


def _number(value: float | int | None) -> float | None:
    """The value as a finite float, or None for a figure that cannot be shown as a number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def loss(value: float | None) -> str:
    """A loss (or any model metric) to 4 significant digits, trailing zeros kept: `0.008180`, `2.303`."""
    number = _number(value)
    if number is None:
        return MISSING
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    return f"{number:#.4g}".rstrip(".")


def money(usd: float | None) -> str:
    """US dollars: whole cents from one cent up (`$0.20`, `$1,234.56`), fractions of a cent below
    (`0.2¢`, `0.046¢`), so a tiny run's cost is neither `$0.00` nor eighteen digits."""
    number = _number(usd)
    if number is None:
        return MISSING
    sign = "-" if number < 0 else ""
    number = abs(number)
    if number == 0:
        return "$0.00"
    if number >= 0.01:
        return f"{sign}${number:,.2f}"
    cents = number * 100
    if cents < 0.001:
        return f"{sign}<0.001¢"
    return f"{sign}{cents:.2g}¢"


def hourly(usd_per_hour: float | None) -> str:
    """A price per hour: `$0.71/h`, `$0.0042/h` stays in dollars (prices are quoted that way)."""
    number = _number(usd_per_hour)
    if number is None:
        return MISSING
    if number == 0 or abs(number) >= 0.01:
        return f"${number:,.2f}/h"
    return f"${number:.2g}/h"


def per_second(value: float | None, unit: str) -> str:
    """A throughput with its unit: `3.2 steps/s`, `1,250 samples/s` (3 significant digits, whole
    numbers from 1000 up)."""
    number = _number(value)
    if number is None:
        return MISSING
    if abs(number) >= 1000:
        return f"{number:,.0f} {unit}/s"
    return f"{number:.3g} {unit}/s"


def duration(seconds: float | None) -> str:
    """Elapsed time: `0.4 s`, `3 s` (whole, as a --timeout is given), `42 s`, `3m 07s`, `2h 05m`, `3d 04h`."""
    number = _number(seconds)
    if number is None or number < 0:
        return MISSING
    if math.isinf(number):
        return "forever"
    if number < 10 and not number.is_integer():
        return f"{number:.1f} s"
    whole = round(number)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def percent(fraction: float | None) -> str:
    """A fraction as a percentage to one decimal: 0.9722 is `97.2%`."""
    number = _number(fraction)
    if number is None:
        return MISSING
    return f"{number * 100:.1f}%"


def count(value: float | int | None) -> str:
    """A whole count with thousands separators: `12,000` (steps, samples)."""
    number = _number(value)
    if number is None:
        return MISSING
    return f"{round(number):,}"


def timestamp(iso: str | None) -> str:
    """An RFC 3339 time to the minute, UTC as the history stores it: `2026-11-24 11:10`."""
    if not iso:
        return MISSING
    return iso[:16].replace("T", " ")


#: How each field of a run's summary is shown (the trainer's summary keys; others print as given),
#: and the kinds by name (`loss`, `money`, ...) for callers with a figure of no summary field.
SUMMARY_FORMATS = {
    "money": money,
    "hourly": hourly,
    "duration": duration,
    "percent": percent,
    "count": count,
    "steps": count,
    "final_loss": loss,
    "best_loss": loss,
    "last_loss": loss,
    "loss": loss,
    "accuracy": percent,
    "samples_per_s": lambda v: per_second(v, "samples"),
    "steps_per_s": lambda v: per_second(v, "steps"),
    "wall_s": duration,
    "duration_s": duration,
    "cost_usd": money,
    "usd_per_hour": hourly,
}


def field(name: str, value: object) -> str:
    """One summary field (or one kind of figure) for people, by its name's meaning (SUMMARY_FORMATS);
    a value that is not a number, or a name not listed, prints as given."""
    if value is None:
        return MISSING
    formatter = SUMMARY_FORMATS.get(name)
    if formatter is None or _number(value) is None:  # type: ignore[arg-type]
        return str(value)
    return formatter(value)  # type: ignore[operator]
