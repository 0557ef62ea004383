# Copyright: forja contributors
# Apache-2.0
"""Which of a run's result files the controller lacks, so fetch.yml fetches only those.

ansible's fetch module already skips a file whose copy is the same, but it asks the host for each
file's checksum in a call of its own (0.1-0.2 s each): a run with two dozen results cost 2-3 s on
every re-run of site.yml. forja-train-state --results lists every result with its checksum (in the
wait's last poll, or in one call of fetch.yml's own); this filter compares them with the controller's
copies (SHA-1, as fetch does), so a clean re-run fetches nothing and a deleted or changed local copy
is fetched again.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any


def _sha1(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha1").hexdigest()
    except OSError:
        return None


def fetch_needed(files: list[dict[str, Any]], root: str, dest: str) -> list[str]:
    """The paths of `files` ({path, checksum} each) whose copy under `dest` (same path below `root`) is
    missing or differs."""
    needed = []
    for entry in files:
        path = entry["path"]
        local = os.path.join(os.path.expanduser(dest), os.path.relpath(path, root))
        if entry.get("checksum") is None or _sha1(local) != entry["checksum"]:
            needed.append(path)
    return sorted(needed)


class FilterModule:
    """forja's fetch filter."""

    def filters(self) -> dict[str, Any]:
        return {"forja_fetch_needed": fetch_needed}
