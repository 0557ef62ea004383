# Copyright: forja contributors
# Apache-2.0
"""Durations as people write them in forja's settings: 7d, 36h, 1d12h, 90m, 600s, or plain seconds.

Why one home: the managed watcher's --max-down, a Flex-start VM's gcp_instance_max_run_duration and
autostop_delete_after are all written this way, by the same people; one reader keeps them agreeing.
Standard library only: modules, action plugins and forja's Python (forja.module_utils.load) read it.
"""

from __future__ import annotations

import re
from typing import Any

#: Days, hours, minutes and seconds, each optional and in that order; each part may have decimals.
_PART = r"(?:(\d+(?:\.\d+)?)\s*{unit})?"
DURATION_RE = re.compile("^" + "".join(_PART.format(unit=u) for u in "dhms") + "$")
UNIT_SECONDS = (86400.0, 3600.0, 60.0, 1.0)
#: How the error says to write one.
FORM = "write it as days, hours, minutes or seconds, e.g. 7d, 36h, 1d12h, 90m or 600s"


def seconds(value: Any, field_name: str | None = None) -> float:
    """Seconds for "7d", "36h", "1d12h", "90m", "1.5d", "600s" or a plain number of seconds;
    ValueError naming the field (when given) and the form for anything else."""
    text = str(value).strip().lower().replace(" ", "")
    try:
        return float(text)
    except ValueError:
        pass
    match = DURATION_RE.match(text)
    if not text or not match or not any(match.groups()):
        named = f"{field_name}: " if field_name else ""
        raise ValueError(f"{named}{value!r} is not a duration; {FORM}")
    return sum(float(part or 0) * unit for part, unit in zip(match.groups(), UNIT_SECONDS, strict=True))


def words(total: float) -> str:
    """A duration for people in a message: 2 d 3 h, 5 h 10 min, 90 s."""
    total = max(0.0, total)
    if total >= 86400:
        days, rest = divmod(int(total), 86400)
        return f"{days} d {rest // 3600} h" if rest >= 3600 else f"{days} d"
    if total >= 3600:
        hours, rest = divmod(int(total), 3600)
        return f"{hours} h {rest // 60} min" if rest >= 60 else f"{hours} h"
    if total >= 60:
        return f"{int(total // 60)} min"
    return f"{total:.0f} s"
