"""Numbers for people: how the `forja` command prints losses, money, rates and durations.

Raw floats are for programs (`--json` keeps every digit); a person reading a table needs the
digits that mean something and the unit: `final loss 0.008180`, not `0.008180368691682816`;
`0.2¢`, not `$0.0019884954039891124`; `$0.71/h`; `3.2 steps/s`; `2h 05m`. Every function here is
pure and total: None (a figure nobody reported) prints as an empty cell, never as "None".
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

# Loss, money, throughput and duration: their one home is trainer.figures, because the trainer's own
# log line needs them on a host without forja (the trainer imports nothing of forja; forja may import
# the trainer's standard-library modules, as it does trainer.summary).
from trainer.figures import MISSING, duration, hourly, loss, money, per_second
from trainer.figures import as_number as _number

__all__ = ["MISSING", "SUMMARY_FORMATS", "count", "duration", "field", "hourly", "loss", "money",
           "per_second", "percent", "plain", "timestamp"]


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


def plain(obj: Any, drop: tuple[str, ...] = ()) -> Any:
    """Plain JSON data from dataclasses, dicts, tuples and paths: what ``--json`` prints and
    ``forja ui`` serves (full precision: the rounding above is for people only). Dataclass fields
    named in ``drop`` are left out (the CLI drops a RunResult's raw ``events``, kept for Python)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = [f.name for f in dataclasses.fields(obj) if f.name not in drop]
        return {name: plain(getattr(obj, name), drop) for name in names}
    if isinstance(obj, dict):
        return {str(k): plain(v, drop) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v, drop) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj
