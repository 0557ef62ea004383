"""One process at a time: an flock on a file that names its holder.

Why one home: a run's managed watcher and a sweep's driver each must be alone (two watchers would
both restart and move the VM; two drivers would ask and tell over each other in one study), and a
second one is refused with who holds the lock, so the user knows which process to stop. The lock
is the kernel's (``flock``): a holder that dies releases it, and no stale file blocks the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def held(path: Path, refused: Callable[[str], Exception]) -> Iterator[None]:
    """Hold the lock at ``path`` (made with its folder), or raise ``refused(holder)``, where holder
    says which process has it ("pid 123 since …")."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise refused(handle.read().strip() or "another process") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)
