"""A secret read from a file the user keeps private: the Hub token, the dashboard's token.

Why a file and not an option: a command line is visible to every user of the machine (``ps``), so
forja takes secrets from a file or the environment only. A file readable by others is refused
(chmod 600), as ssh refuses such a key.
"""

from __future__ import annotations

import stat
from pathlib import Path

from forja import errors


def read_private(path: str | Path, field: str, what: str) -> str:
    """The first line of ``path``; ConfigError naming ``field`` when it is unreadable, shared or empty."""
    path = Path(path).expanduser()
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as exc:
        raise errors.ConfigError(field, f"cannot read {path} ({exc.strerror or exc})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise errors.ConfigError(field, f"{path} is readable by others; chmod 600 {path}")
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise errors.ConfigError(field, f"{path} is empty; put {what} on its first line")
    return token
