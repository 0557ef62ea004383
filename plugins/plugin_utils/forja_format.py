# Copyright: forja contributors
# Apache-2.0
"""Numbers for people: how forja shows each figure of a run's summary, and each kind of figure.

The one home of the figure kinds forja shows (percent, count, timestamp) and of which kind each
summary field is shown as (``SUMMARY_FORMATS``, ``field``). Both sides read them here, so what a
playbook prints and what the ``forja`` command prints never differ:

- the ``forja.gpu.forja_format`` filter imports this file the Ansible way
  (``ansible_collections.forja.gpu.plugins.plugin_utils.forja_format``), so an installed collection
  formats with no forja package beside it;
- forja's Python loads this same file by path (``forja/module_utils.py``) and ``forja.format``
  re-exports its names.

The rules of a loss, money, a rate, a throughput and a duration live one layer further down, in
``trainer/figures.py``: the trainer's own log line needs them on a GPU host where neither forja nor
this collection's plugins are (the trainer imports nothing of either). The trainer ships inside
this collection (galaxy.yml), so the filter finds it as ``ansible_collections.forja.gpu.trainer``,
and forja, which installs the trainer package, as ``trainer``. Standard library only otherwise, no
Ansible, no forja. Controller side only, hence plugin_utils, not module_utils: no module imports
this file (AnsiballZ ships module_utils, not the trainer), and ansible-test's module_utils import
check would refuse its import of the trainer.
"""

from __future__ import annotations

try:  # Ansible: the trainer package shipped in the collection
    from ansible_collections.forja.gpu.trainer.figures import (
        MISSING,
        as_number,
        duration,
        hourly,
        loss,
        money,
        per_second,
    )
except ImportError:  # forja's Python loads this file by path (forja/module_utils.py); it installs the trainer
    from trainer.figures import MISSING, as_number, duration, hourly, loss, money, per_second  # type: ignore

__all__ = ["MISSING", "SUMMARY_FORMATS", "count", "duration", "field", "hourly", "loss", "money",
           "per_second", "percent", "timestamp"]


def percent(fraction: float | None) -> str:
    """A fraction as a percentage to one decimal: 0.9722 is `97.2%`."""
    number = as_number(fraction)
    if number is None:
        return MISSING
    return f"{number * 100:.1f}%"


def count(value: float | int | None) -> str:
    """A whole count with thousands separators: `12,000` (steps, samples)."""
    number = as_number(value)
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
    if formatter is None or as_number(value) is None:  # type: ignore[arg-type]
        return str(value)
    return formatter(value)  # type: ignore[operator]
