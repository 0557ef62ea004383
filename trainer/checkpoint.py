"""Checkpoints that survive SIGKILL, a full disk, a Spot VM's hard stop, and bits that rot on disk.

Why this shape: ``torch.save`` straight onto ``ckpt.pt`` leaves an unreadable file when the process
dies mid-write (measured: 20 of 20 kills). Writing a temporary file in the same folder, fsyncing it,
renaming it over the final name and fsyncing the folder means the newest *complete* checkpoint is
always on disk. A complete file can still be wrong: a bit flipped inside a tensor loads without any
error (3 of 3 in a drill) and the run goes on from damaged weights. So every file ends with a
checksum of everything before it, computed while the bytes are written and checked before
``torch.load`` reads it. The checksum is SHA-256 over the SHA-256 digests of consecutive 8 MiB
blocks: the blocks are hashed on a thread pool (hashlib releases the GIL) while the previous write
is still going, so a 605 MB checkpoint (50M parameters with AdamW state) pays about 0.1 s for it on
8 cores instead of the 0.5 s of one sequential hash, and verifying at load time is as parallel.
torch's own per-record zip CRC-32 (which ``torch.load`` never checks) is switched off for our
saves: it cost as much again and guarded nothing.
At start the newest checkpoint that verifies and loads is used; newer ones that do not are renamed
``*.corrupt`` (kept for a person to look at, never deleted). Everything stored is a tensor or a
plain Python value, so ``torch.load(weights_only=True)`` reads it (no pickle code execution from a
file on a shared disk).

Public, stable API (the trainer and users' own scripts through ``trainer.runlib``):
:func:`atomic_save`, :func:`verify_checkpoint`, :func:`footer_digest`, :func:`load_checkpoint`,
:class:`CheckpointManager` (``save``, ``list``, ``load_latest``, ``load_for_resume``),
:class:`CorruptCheckpoint`, :class:`NoValidCheckpoint`, :func:`rng_state`, :func:`set_rng_state`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from trainer.run_folder import TMP_MARK, atomic_file

log = logging.getLogger(__name__)

CKPT_RE = re.compile(r"^ckpt-(\d+)\.pt$")
#: A zip's end-of-central-directory record (torch.save writes a zip), and how far from the end it
#: can start (22 bytes plus a comment of at most 65,535): a file without it was cut short.
ZIP_END = b"PK\x05\x06"
ZIP_TAIL = 22 + 65535
CORRUPT_SUFFIX = ".corrupt"
#: Checkpoints saved after a run's last good one, set aside when it diverged (trainer.divergence).
DIVERGED_SUFFIX = ".diverged"
#: The last bytes of every checkpoint: this marker, 64 hex digits, and a newline. The digits are
#: SHA-256 over the concatenated SHA-256 digests of the bytes before the footer, cut in blocks of
#: ``BLOCK`` bytes (the last one shorter). A zip reader looks for its directory near the end and
#: skips them.
FOOTER_MARK = b"\nforja-checkpoint sha256-8MiB-blocks:"
FOOTER_LEN = len(FOOTER_MARK) + 64 + 1
BLOCK = 8 << 20
_THREADS = max(1, min(8, os.cpu_count() or 1))


class CorruptCheckpoint(Exception):
    """A checkpoint file that fails verification or does not load (truncated, flipped bits, not ours)."""


class NoValidCheckpoint(Exception):
    """Checkpoints were written for this run but none verifies, and a fresh start was not allowed."""


def _block_digest(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(data).digest()


class _HashingWriter:
    """A write-only file wrapper that hashes every byte, block by block, on its way to the disk.

    Whole blocks inside one write are hashed on the pool while the write itself runs (both release
    the GIL); the caller's buffer is only read until this call returns, so no copy is needed. A
    block split between writes is gathered in a small buffer first.
    """

    def __init__(self, handle: BinaryIO, pool: ThreadPoolExecutor) -> None:
        self.handle, self.pool = handle, pool
        self.partial = bytearray()
        self.digests: list[bytes] = []

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        if self.partial:
            take = min(BLOCK - len(self.partial), size)
            self.partial += view[:take]
            view = view[take:]
            if len(self.partial) == BLOCK:
                self.digests.append(_block_digest(self.partial))
                self.partial = bytearray()
        whole = len(view) - len(view) % BLOCK
        jobs: list[Future[bytes]] = [
            self.pool.submit(_block_digest, view[i : i + BLOCK]) for i in range(0, whole, BLOCK)
        ]
        self.handle.write(data)
        self.digests.extend(job.result() for job in jobs)
        self.partial += view[whole:]
        return size

    def flush(self) -> None:
        self.handle.flush()

    def hexdigest(self) -> str:
        if self.partial:
            self.digests.append(_block_digest(self.partial))
            self.partial = bytearray()
        return hashlib.sha256(b"".join(self.digests)).hexdigest()


@contextlib.contextmanager
def _zip_crc_off() -> Iterator[None]:
    """torch.save without its per-record CRC-32 (our footer covers every byte; torch.load ignores it)."""
    setter = getattr(torch.serialization, "set_crc32_options", None)
    getter = getattr(torch.serialization, "get_crc32_options", None)
    if setter is None or getter is None:  # an older torch: it computes them, nothing breaks
        yield
        return
    before = getter()
    setter(False)
    try:
        yield
    finally:
        setter(before)


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> str:
    """Write ``obj`` to ``path`` so that ``path`` is either the old file or the whole new one.

    The file is ``torch.save``'s bytes plus a footer holding their checksum (see ``FOOTER_MARK``);
    returns its hex digits. An ``OSError`` (``ENOSPC`` on a full disk) leaves no temporary file.
    """
    with atomic_file(path) as handle, ThreadPoolExecutor(_THREADS) as pool, _zip_crc_off():
        writer = _HashingWriter(handle, pool)
        torch.save(obj, writer)  # type: ignore[arg-type]  # any object with write() will do
        hexdigest = writer.hexdigest()
        handle.write(FOOTER_MARK + hexdigest.encode() + b"\n")
    return hexdigest


def _without_footer(path: Path, handle: BinaryIO, size: int, allow_legacy: bool) -> bool:
    """A file with no footer: False (load it unverified) only when legacy checkpoints are allowed.

    Otherwise it is never trusted: a stray or foreign ``ckpt-N.pt`` used to be taken for a
    pre-checksum checkpoint and block a resume while a valid one sat beside it. A file whose zip
    directory is missing at its end is called truncated; a complete one was written without a
    checksum (by a trainer from before checksums, or by another program).
    """
    handle.seek(max(0, size - ZIP_TAIL))
    complete = ZIP_END in handle.read(ZIP_TAIL)
    if not complete:
        raise CorruptCheckpoint(f"{path.name}: truncated ({size} bytes, its end is missing: the write was "
                                "cut short or the copy is incomplete)")  # fmt: skip
    if allow_legacy:
        return False
    raise CorruptCheckpoint(
        f"{path.name}: has no checksum footer (written before checksums existed, or not by forja's "
        "trainer); set allow_legacy_checkpoints: true to load such files unverified"
    )


def verify_checkpoint(path: str | os.PathLike[str], allow_legacy: bool = False) -> bool:
    """True when the file's footer matches its content.

    Raises :class:`CorruptCheckpoint` when the content does not match the footer, when the file is
    truncated or cannot be read, and when it has no footer (unless ``allow_legacy``: then False, and
    only a failing ``torch.load`` can reject it).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            handle.seek(max(0, size - FOOTER_LEN))
            footer = handle.read(FOOTER_LEN)
            if size < FOOTER_LEN or not footer.startswith(FOOTER_MARK):
                return _without_footer(path, handle, size, allow_legacy)
            expected = footer[len(FOOTER_MARK) : -1].decode("ascii", "replace")
            body, fd = size - FOOTER_LEN, handle.fileno()

            def block(offset: int) -> bytes:
                return _block_digest(os.pread(fd, min(BLOCK, body - offset), offset))

            with ThreadPoolExecutor(_THREADS) as pool:
                digests = list(pool.map(block, range(0, body, BLOCK)))
    except OSError as exc:
        raise CorruptCheckpoint(f"{path.name}: cannot be read ({exc})") from exc
    computed = hashlib.sha256(b"".join(digests)).hexdigest()
    if computed != expected:
        raise CorruptCheckpoint(
            f"{path.name}: content does not match its SHA-256 (stored {expected[:12]}..., "
            f"computed {computed[:12]}...): changed on disk after it was written"
        )
    return True


def footer_digest(path: str | os.PathLike[str]) -> str | None:
    """The checksum a checkpoint's footer holds (64 hex digits), read without hashing; None without one.

    What :func:`atomic_save` returned for the file: the bucket mirror puts it in its completion marker.
    """
    path = Path(path)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < FOOTER_LEN:
            return None
        handle.seek(size - FOOTER_LEN)
        footer = handle.read(FOOTER_LEN)
    if not footer.startswith(FOOTER_MARK):
        return None
    return footer[len(FOOTER_MARK) : -1].decode("ascii", "replace")


def load_checkpoint(
    path: str | os.PathLike[str], map_location: str | torch.device = "cpu", allow_legacy: bool = False
) -> dict[str, Any]:
    """Verify then load one checkpoint (``weights_only=True``); :class:`CorruptCheckpoint` if it fails."""
    path = Path(path)
    checked = verify_checkpoint(path, allow_legacy)
    if not checked:
        log.warning("%s has no checksum (written before checksums existed): loading it unverified", path.name)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # a truncated zip, a bad pickle, an I/O error
        raise CorruptCheckpoint(f"{path.name}: does not load ({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{path.name}: holds a {type(state).__name__}, not a checkpoint mapping")
    return state


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states as weights_only-loadable values."""
    version, mt, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(mt), gauss],
        "numpy": [
            np_name,
            torch.from_numpy(np_keys.astype(np.int64)),
            int(np_pos),
            int(np_has_gauss),
            float(np_gauss),
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@dataclass(frozen=True)
class Found:
    """A checkpoint that loaded, and the newer ones that did not (renamed ``*.corrupt`` for inspection)."""

    path: Path
    state: dict[str, Any]
    skipped: list[Path]


class CheckpointManager:
    """``ckpt-<step>.pt`` files in one folder: save atomically, keep the newest K, load the newest valid.

    ``required`` names the keys a loaded mapping must hold to count as valid (the built-in trainer's
    ``step`` and ``model``; a user's own loop may store anything and pass ``required=()``).
    """

    def __init__(
        self,
        folder: Path,
        keep: int = 3,
        required: tuple[str, ...] = ("step", "model"),
        allow_legacy: bool = False,
    ) -> None:
        self.folder = Path(folder)
        self.keep = keep
        self.required = required
        #: Load files without a checksum footer (from a trainer before checksums) unverified.
        self.allow_legacy = allow_legacy

    def path_for(self, step: int) -> Path:
        return self.folder / f"ckpt-{step}.pt"

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest first (by step, not by file time)."""
        if not self.folder.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := CKPT_RE.match(p.name))]
        return [p for _, p in sorted(found)]

    def set_aside_after(self, step: int, suffix: str = DIVERGED_SUFFIX) -> list[str]:
        """Rename the checkpoints of steps after ``step`` to ``ckpt-N.pt<suffix>`` (kept for a person
        to look at): the next start resumes from the newest one left. Returns the new names."""
        moved = []
        for path in self.list():
            if int(CKPT_RE.match(path.name).group(1)) > step:  # type: ignore[union-attr]
                moved.append(path.rename(path.with_name(path.name + suffix)).name)
        return moved

    def corrupt(self) -> list[Path]:
        """Checkpoints set aside by an earlier load (``ckpt-<step>.pt.corrupt``), by name."""
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.iterdir() if p.name.endswith(CORRUPT_SUFFIX))

    def remove_stale_temporaries(self) -> list[Path]:
        """Delete ``*.tmp.<pid>`` files a killed writer left behind; return what was removed.

        Only a file whose writer's PID is gone: one a live process is still writing stays.
        """
        from trainer.folder_lock import pid_alive

        if not self.folder.is_dir():
            return []
        stale = []
        for path in self.folder.iterdir():
            if TMP_MARK not in path.name:
                continue
            pid = path.name.rsplit(TMP_MARK, 1)[1]
            if pid.isdigit() and (int(pid) == os.getpid() or pid_alive(int(pid))):
                continue
            path.unlink(missing_ok=True)
            stale.append(path)
        return stale

    def save(self, state: dict[str, Any], step: int) -> Path:
        """Write ``state`` as ``ckpt-<step>.pt`` (atomic, checksummed), then keep only the newest K."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path_for(step)
        atomic_save(state, path)
        self.prune()
        return path

    def prune(self) -> None:
        for old in self.list()[: -self.keep]:
            old.unlink(missing_ok=True)

    def load_latest(self, map_location: str | torch.device = "cpu", quarantine: bool = True) -> Found | None:
        """The newest checkpoint that verifies and loads; newer ones that fail are set aside.

        Set aside (renamed ``ckpt-N.pt.corrupt``) rather than deleted, so a person can look at them,
        and so pruning never keeps a broken file in place of a good older one.
        """
        skipped: list[Path] = []
        for path in reversed(self.list()):
            try:
                state = load_checkpoint(path, map_location, self.allow_legacy)
                missing = [key for key in self.required if key not in state]
                if missing:
                    raise CorruptCheckpoint(
                        f"{path.name}: not a trainer checkpoint (no {', '.join(missing)})"
                    )
            except CorruptCheckpoint as exc:
                log.warning("checkpoint %s; trying the previous one", exc)
                if quarantine:
                    path = path.rename(path.with_name(path.name + CORRUPT_SUFFIX))
                skipped.append(path)
                continue
            return Found(path, state, skipped)
        return None

    def load_for_resume(
        self, allow_fresh_start: bool = False, map_location: str | torch.device = "cpu"
    ) -> Found | None:
        """What a (re)starting run resumes from: the newest valid checkpoint, or None for a new run.

        None only when this folder never held a checkpoint, or when ``allow_fresh_start`` is set.
        When checkpoints were written but none verifies (now, or set aside by an earlier start),
        raises :class:`NoValidCheckpoint`: starting again from step 0 silently would throw away
        days of paid work and report success.
        """
        found = self.load_latest(map_location)
        if found is not None:
            return found
        bad = self.corrupt()
        if not bad or allow_fresh_start:
            if bad:
                log.warning(
                    "no valid checkpoint (%s set aside); allow_fresh_start is on: starting from step 0",
                    ", ".join(p.name for p in bad),
                )
            return None
        raise NoValidCheckpoint(
            f"no valid checkpoint in {self.folder}: {', '.join(p.name for p in bad)} failed verification "
            "(kept for inspection). Starting again from step 0 would discard the run's progress; to do "
            "that on purpose set allow_fresh_start: true (--set allow_fresh_start=true), or move the "
            "*.corrupt files away"
        )
