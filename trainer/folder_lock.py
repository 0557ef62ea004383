"""One writer per run folder: the trainer's own lock, also when no launcher is there.

Why: forja's launcher locks the folder for a run it starts, but a trainer started by hand (or a
user's runlib script) on a folder in use found the first trainer's checkpoint being written, took
it for "left by a killed writer", deleted it, and the first crashed (exit 1, so systemd restarted
it into the same fight). Rank 0 of a run now holds an exclusive ``flock`` on
``<out_dir>/.trainer.lock`` for the whole session, and a second trainer exits at once with
:data:`trainer.exit_codes.LOCKED` (75, never restarted), naming the holder's PID.

A lock of its own, not the launcher's ``.lock``: the launcher's is held by the launcher and
inherited by the trainer it starts, so the trainer must not wait for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from trainer.run_folder import TRAINER_LOCK


class FolderLocked(Exception):
    """Another trainer writes this run folder."""


@contextlib.contextmanager
def folder_lock(out: Path) -> Iterator[None]:
    """Hold ``out``'s trainer lock while the block runs; :class:`FolderLocked` when another holds it."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / TRAINER_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            raise FolderLocked(
                f"{out} is being written by another trainer (pid {holder}); wait for it to end, stop it, "
                "or give this run another out_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (one we may not signal exists too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
