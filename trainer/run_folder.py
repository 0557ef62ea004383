"""A run folder: the name of everything a run writes into it, and the one atomic write.

The run folder is the trainer's ``out_dir`` (``FORJA_RUN_DIR`` for a script through
:mod:`trainer.runlib`; ``<host contract run_dir>/<run>`` on a host, the launcher's ``FORJA_OUT``;
``<results>/<run>/<host>/`` once forja has fetched it). What it holds, by the name given here::

    summary.json            SUMMARY            what the run did (trainer.summary lists the fields)
    events.jsonl            EVENTS             one line per event: start, preempt, resume, fail, ...
    metrics.jsonl           METRICS            one line per log step
    config.yaml             CONFIG             the config as the run resolved it (its ``steps``)
    live.json               LIVE               the port of the live metrics endpoint (trainer.live)
    oom.json                OOM_RECORD         the micro-batch an OOM under DDP lowered, for the restart
    checkpoints/            CHECKPOINTS_DIR    ckpt-<step>.pt and its kin (trainer.checkpoint names them)
    model/                  MODEL_DIR          the exported model (trainer.export names its files)
    plots/                  PLOTS_DIR          PLOT_FILES, drawn by trainer.report
    compile-cache/          COMPILE_CACHE_DIR  Inductor's cache, unless the config names another
    .trainer.lock           TRAINER_LOCK       rank 0's lock on the folder (trainer.folder_lock)
    .forja-stop-requested   STOP_REQUESTED     `forja stop` was here: the SIGTERM is the user's
    .lock                   LAUNCHER_LOCK      forja-train-launch's lock while it runs the trainer
    .forja-exits            LAUNCHER_EXITS     forja-train-launch: each worker's exit code, this session
    elastic.json            ELASTIC            forja-train-launch: this node's torchrun round
    COMPLETED               COMPLETED_MARKER   forja-train-launch: the run ended with exit 0
    hook.log                HOOK_LOG           forja-train-launch: the user's hooks' output and how each ended
    packages.json           PACKAGES           forja-train-launch: the run's Python packages at its start

and, in the run's prefix of a checkpoint bucket (``gs://BUCKET/PREFIX/<run>/``, trainer.mirror) and
so in a Vertex AI run fetched from it, ``checkpoints/``, ``model/`` and ``logs/`` (LOGS_DIR: the
LOGS and the SUMMARY). A file being written is ``<name>.tmp.<pid>`` (:func:`temporary_path`) until
it is renamed into place.

These names are an interface: hosts (forja-train-state, the autostop agent, the roles' tasks),
forja's fetch and status, and people's scripts read them. Never rename one;
tests/foundation/test_run_folder.py pins them as they are on disk.

Why here, in the trainer package: the trainer writes the folder, and the trainer is what reaches
the hosts (trainer_run's bundle); forja already imports ``trainer.*`` modules that need only the
standard library (trainer.figures, trainer.summary) from its own install, where torch is absent.
So this module imports only the standard library too, and the host scripts that run on the system
Python (roles/autostop/files/forja_autostop.py, roles/trainer_run/files/forja-train-state) get it
installed beside them as ``forja_run_folder.py`` (a link to this file in the role's files/, as
forja_figures.py is trainer/figures.py). What cannot import Python keeps its literals: the launcher
(a shell script) and the roles' YAML; tests/foundation/test_run_folder.py checks that they agree.

Why one :func:`write_atomic`: a reader (forja-train-state polling a run, the autostop agent, a
restart) must see either the old file or the whole new one, and a crash must not leave the new
name half written. The trainer had that write in several copies that had drifted apart (some
fsynced the file and the folder, some neither; three ways to name the temporary file). Under it,
:func:`atomic_file` serves a writer that streams (a checkpoint) and :func:`atomic_path` one that
wants a file name (safetensors, a download).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

# -- files the trainer (or a script through trainer.runlib) writes --------------------------------
SUMMARY = "summary.json"
EVENTS = "events.jsonl"
METRICS = "metrics.jsonl"
#: The run's two JSON-lines logs (the history a bucket keeps: trainer.mirror).
LOGS = (EVENTS, METRICS)
CONFIG = "config.yaml"
LIVE = "live.json"
OOM_RECORD = "oom.json"
CHECKPOINTS_DIR = "checkpoints"
MODEL_DIR = "model"
PLOTS_DIR = "plots"
#: The plots trainer.report draws into PLOTS_DIR, and all of them in the order the summary lists them.
PLOT_LOSS = "loss.png"
PLOT_THROUGHPUT = "throughput.png"
PLOT_UTILISATION = "utilisation.png"
PLOT_COST = "cost.png"
PLOT_FILES = (PLOT_LOSS, PLOT_THROUGHPUT, PLOT_UTILISATION, PLOT_COST)
COMPILE_CACHE_DIR = "compile-cache"
TRAINER_LOCK = ".trainer.lock"

# -- files others leave in it ------------------------------------------------------------------------
#: `forja stop` writes it before it stops the unit (roles/trainer_run/tasks/stop.yml); the trainer reads
#: it at the SIGTERM that follows, and the next session removes it (trainer.preemption).
STOP_REQUESTED = ".forja-stop-requested"
#: roles/trainer_run/files/forja-train-launch: its lock, its workers' exit codes, its torchrun round,
#: and its mark of a run that ended with exit 0 (a completed run is never started again).
LAUNCHER_LOCK = ".lock"
LAUNCHER_EXITS = ".forja-exits"
ELASTIC = "elastic.json"
COMPLETED_MARKER = "COMPLETED"
#: forja-train-launch: the output of the run's stop, preemption and down hooks, each framed by a line
#: saying when it started and how it ended (`forja logs` shows it; forja-train-state reads it).
HOOK_LOG = "hook.log"
#: forja-train-launch: {"python": version, "packages": {name: version}} of the run's Python, at its start
#: (the run's snapshot, forja/snapshot.py).
PACKAGES = "packages.json"

# -- the run's prefix in a checkpoint bucket (trainer.mirror) ----------------------------------------
#: Where the mirror uploads LOGS and SUMMARY, beside CHECKPOINTS_DIR (and MODEL_DIR, trainer.export).
LOGS_DIR = "logs"

#: Between a file's name and the writer's PID in the name of a file being written
#: (trainer.checkpoint removes the ones a killed writer left).
TMP_MARK = ".tmp."


def temporary_path(path: str | os.PathLike[str]) -> Path:
    """Where ``path``'s new bytes are written before the rename: beside it, ``<name>.tmp.<pid>``."""
    path = Path(path)
    return path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}")


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Persist a rename: the directory entry itself must reach the disk."""
    fd = os.open(folder, os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _put_in_place(tmp: Path, path: Path, replace: bool) -> None:
    """Rename the complete, fsynced ``tmp`` to ``path``; with ``replace`` False, never over a file."""
    if replace:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # refused (FileExistsError) when the file is there: it is kept
    except FileExistsError:
        raise
    except OSError:  # no hard links here: a rename, after one more look
        if path.exists():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
        os.replace(tmp, path)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], *, replace: bool = True) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into; ``path`` is the old file or the whole new one.

    The content goes to :func:`temporary_path` (same folder, so the rename stays on one file system),
    is fsynced, renamed over ``path`` and the folder fsynced. ``replace=False`` never replaces a file:
    when ``path`` exists (or appears meanwhile) ``FileExistsError`` is raised and ``path`` is kept.
    An exception in the block or an ``OSError`` (``ENOSPC``) leaves ``path`` as it was and no
    temporary file.
    """
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        _put_in_place(tmp, path, replace)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, replace: bool = True) -> Iterator[Path]:
    """:func:`atomic_file` for a writer that wants a file name (safetensors, a download): the block
    writes the temporary path it is given, which is then fsynced and renamed over ``path``."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        _put_in_place(tmp, path, replace)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, replace: bool = True) -> Path:
    """Write ``data`` (a ``str`` as UTF-8) to ``path`` through :func:`atomic_file`; returns ``path``.

    ``replace=False`` raises ``FileExistsError`` instead of replacing an existing file.
    """
    with atomic_file(path, replace=replace) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)
