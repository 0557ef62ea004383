"""Numbers for people: how the `forja` command prints losses, money, rates and durations.

Raw floats are for programs (`--json` keeps every digit); a person reading a table needs the
digits that mean something and the unit: `final loss 0.008180`, not `0.008180368691682816`;
`0.2¢`, not `$0.0019884954039891124`; `$0.71/h`; `3.2 steps/s`; `2h 05m`. Every function here is
pure and total: None (a figure nobody reported) prints as an empty cell, never as "None".

Where the rules live, each in one home, re-exported here so every caller keeps `forja.format`:

- loss, money, rate, throughput and duration: `trainer.figures`, because the trainer's own log line
  needs them on a host without forja (the trainer imports nothing of forja; forja may import the
  trainer's standard-library modules, as it does trainer.summary);
- percent, count, timestamp and which kind each summary field is shown as (`SUMMARY_FORMATS`,
  `field`): `plugins/plugin_utils/forja_format.py`, because the `forja.gpu.forja_format` filter
  imports them the Ansible way and an installed collection must work with no forja beside it; forja
  loads that file by path (`forja/module_utils.py`, the one place that does).

`plain` (JSON data for `--json` and `forja ui`) is forja's own and stays here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from forja import module_utils
from trainer.figures import MISSING, duration, hourly, loss, money, per_second

#: The names that come from plugins/plugin_utils/forja_format.py, loaded (by path) on first use, so
#: that importing forja (`forja --help`) does not need its Ansible content.
_SHOWN = ("percent", "count", "timestamp", "SUMMARY_FORMATS", "field")
__all__ = ["MISSING", "duration", "hourly", "loss", "money", "per_second", "plain", *_SHOWN]


def __getattr__(name: str) -> Any:
    """percent, count, timestamp, field and SUMMARY_FORMATS (how each field of a run's summary is
    shown, and the kinds by name): plugins/plugin_utils/forja_format.py's, as forja loads it."""
    if name in _SHOWN:
        shown = module_utils.load("forja_format", "forja._figure_formats", module_utils.PLUGIN_UTILS)
        return getattr(shown, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
