"""Files the sandbox writes for another process to read: whole, or not at all."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomically(path: Path, data: str | bytes, *, mode: int = 0o666, fsync: bool = False) -> Path:
    """Write `data` (text as UTF-8) to `path` through a temporary beside it and a rename, so a reader
    (th-up.sh, the running sandbox service, the next start after a SIGKILL) never finds it half
    written. The temporary is this process's and thread's own, so two writers never share one.

    `mode`: the new file's permissions, as `os.open` takes them (the default is `open`'s, so the umask
    decides); `fsync`: on disk before the rename, not only in the page cache.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path
