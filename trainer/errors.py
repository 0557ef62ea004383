"""Which failures a restart can fix, and which it cannot: exceptions mapped to exit codes.

Why: systemd restarts a failed run (``Restart=on-failure``), which is right for a crash on a
flaky GPU or a lost peer, and wrong for a missing data file, a typo in ``model_args`` or a full
disk: those fail the same way five times in a row and then the unit gives up with no hint. Each of
them ends with its own code from :mod:`trainer.exit_codes`, listed in the unit's
``RestartPreventExitStatus``, and with one line saying what to fix.

The trainer marks the calls into the user's code during setup (building the data, building the
model) with :func:`user_code`; an exception raised there becomes a :class:`UserCodeError`. Errors
raised later, inside the training loop, stay ordinary failures (exit 1): a CUDA or NCCL error
inside the user's forward pass is often transient, and a restart resumes from the checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from trainer import exit_codes
from trainer.checkpoint import NoValidCheckpoint
from trainer.config import ConfigError
from trainer.divergence import Diverged
from trainer.folder_lock import FolderLocked

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class UserCodeError(Exception):
    """The user's model, data or loss raised while the run was being set up."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        yield node
        node = node.__cause__ or node.__context__


def disk_full_error(exc: BaseException) -> OSError | None:
    """The ``ENOSPC``/``EDQUOT`` error behind ``exc`` (raised directly or as its cause), if any."""
    for node in _chain(exc):
        if isinstance(node, OSError) and node.errno in DISK_FULL_ERRNOS:
            return node
        if isinstance(node, RuntimeError) and "No space left on device" in str(node):
            return OSError(errno.ENOSPC, str(node))  # torch's C++ writer reports ENOSPC as text
    return None


@contextlib.contextmanager
def user_code(key: str, what: str) -> Iterator[None]:
    """Turn an exception raised by the user's ``what`` (config key ``key``) into :class:`UserCodeError`.

    A full disk and the trainer's own ConfigError pass through unchanged: they have their own codes.
    """
    try:
        yield
    except (ConfigError, UserCodeError):
        raise
    except Exception as exc:
        if disk_full_error(exc) is not None:
            raise
        raise UserCodeError(f"{key}: {what} raised {type(exc).__name__}: {exc}") from exc


def exit_code_for(exc: BaseException) -> int:
    """The :mod:`trainer.exit_codes` code a process ending with ``exc`` should return."""
    if disk_full_error(exc) is not None:
        return exit_codes.DISK_FULL
    if isinstance(exc, ConfigError):
        return exit_codes.BAD_CONFIG
    if isinstance(exc, UserCodeError):
        return exit_codes.USER_ERROR
    if isinstance(exc, NoValidCheckpoint):
        return exit_codes.NO_VALID_CHECKPOINT
    if isinstance(exc, Diverged):
        return exit_codes.DIVERGED
    if isinstance(exc, FolderLocked):
        return exit_codes.LOCKED
    return exit_codes.FAILED


def describe(exc: BaseException) -> str:
    """One line for a person: what went wrong, what the exit code means, what to do."""
    code = exit_code_for(exc)
    full = disk_full_error(exc)
    if full is not None:
        where = f" ({full.filename})" if getattr(full, "filename", None) else ""
        text = f"the disk is full: {full.strerror or full}{where}; free space, then restart"
    else:
        text = str(exc)
    meaning = exit_codes.MEANING.get(code, "")
    tail = "; a restart cannot fix this" if code in exit_codes.NO_RESTART and "restart" not in meaning else ""
    return f"error: {text}\n[exit {code}: {meaning}{tail}]"
