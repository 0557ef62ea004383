"""Numbers for people: a loss to 4 significant digits, money in cents or fractions of a cent, a
throughput with its unit, a duration in two units.

The one home of these rules. The trainer's own log line uses them on the host, where none of forja
is installed (the trainer imports nothing of forja); `forja.format` imports them from here, as forja
already reads the summary's field list from `trainer.summary`, so what the trainer prints and what
`forja` prints never differ. Standard library only: forja imports this from the product install,
where torch is absent. Machine-readable outputs (metrics.jsonl, summary.json, --json) keep every digit.
Every function is pure and total: None (a figure nobody reported) prints as MISSING, never "None".
"""

from __future__ import annotations

import math

#: What a missing figure prints as (an empty table cell).
MISSING = ""


def as_number(value: float | int | None) -> float | None:
    """The value as a float, or None for a figure that cannot be shown as a number (None, NaN, text)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def loss(value: float | None) -> str:
    """A loss (or any model metric) to 4 significant digits, trailing zeros kept: `0.3120`, `0.008180`."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"  # a diverged step: said, not shown as a missing figure
    number = as_number(value)
    if number is None:
        return MISSING
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    return f"{number:#.4g}".rstrip(".")


def money(usd: float | None) -> str:
    """US dollars: whole cents from one cent up (`$0.20`, `$1,234.56`), fractions of a cent below
    (`0.2¢`, `0.046¢`), so a tiny run's cost is neither `$0.00` nor eighteen digits."""
    number = as_number(usd)
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
    number = as_number(usd_per_hour)
    if number is None:
        return MISSING
    if number == 0 or abs(number) >= 0.01:
        return f"${number:,.2f}/h"
    return f"${number:.2g}/h"


def per_second(value: float | None, unit: str) -> str:
    """`3.2 steps/s`, `11,234 samples/s`: 3 significant digits, whole numbers from 1000 up."""
    number = as_number(value)
    if number is None:
        return MISSING
    if abs(number) >= 1000:
        return f"{number:,.0f} {unit}/s"
    return f"{number:.3g} {unit}/s"


def duration(seconds: float | None) -> str:
    """Elapsed time: `0.4 s`, `3 s` (whole, as a --timeout is given), `42 s`, `3m 07s`, `2h 05m`, `3d 04h`."""
    number = as_number(seconds)
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
