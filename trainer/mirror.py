"""Checkpoints mirrored to a Cloud Storage bucket in the background, and pulled back on resume.

Why: a Spot VM's checkpoints live on a zonal disk. When the zone has no GPU left, the run can only
go on elsewhere if its checkpoints are somewhere else too. Every checkpoint the trainer (or a
script through :mod:`trainer.runlib`) writes is therefore copied to
``gs://BUCKET/PREFIX/<run>/checkpoints/``, by one background thread, so that training does not wait
for the network.

Layout of a run's prefix::

    ckpt-<step>.pt                  the checkpoint, byte for byte as on disk (its checksum footer too)
    ckpt-<step>.pt.complete.json    the completion marker: step, size, sha256 (the footer's digest),
                                    and the generation of the object above it vouches for
    .partial/ckpt-<step>.pt.<id>    an upload in progress, or one a crash abandoned: never read

and beside it, ``gs://BUCKET/PREFIX/<run>/logs/``: the run folder's ``events.jsonl`` and
``metrics.jsonl`` (whole lines only) and ``summary.json`` once the run has one, overwritten after
each checkpoint is marked complete and once more when the mirror closes. The run's history lives
in them (sessions, preemptions, the steps a resume redid): a start on a fresh disk (a new VM in
another zone) downloads the two logs before it writes anything, so the history and the resume's
lost steps count the sessions the lost disk saw. Local logs are never overwritten, and a failed
log upload only costs a warning.

Atomic: the bytes go to a ``.partial/`` name first (a resumable upload, in chunks), are copied to
the final name, and only then does the marker appear. A reader takes nothing without a marker,
and checks the downloaded bytes against the marker's size and digest (and the file's own footer)
before it uses them, so an upload cut anywhere never passes for a checkpoint. Every write carries
a generation precondition taken from what the attempt saw when it began (0: "must not exist"):
a retry whose first try did get through, or a second writer, gets 412 instead of replacing a
newer object.

Bounded stall: :meth:`CheckpointMirror.submit` only hard-links the file into a staging folder
(so pruning the local copy cannot pull it from under the upload) and hands it to the worker:
microseconds, whatever the size. The worker has one slot besides the upload under way; a newer
checkpoint replaces a waiting older one (resume only ever wants the newest, and a backlog of
uploads slower than the checkpoint interval would otherwise grow without end). A failed upload is
logged and retried with exponential backoff until it succeeds or a newer checkpoint supersedes it;
training never waits for it. At the end of a run :meth:`CheckpointMirror.close` waits a bounded time
for the last upload.

google-cloud-storage is imported only when a bucket is configured: the trainer runs without it.
The client finds its credentials as Google's libraries do (the VM's service account on the VM),
or talks to an emulator named by ``STORAGE_EMULATOR_HOST``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from trainer.checkpoint import (
    CKPT_RE,
    CORRUPT_SUFFIX,
    CheckpointManager,
    CorruptCheckpoint,
    footer_digest,
    verify_checkpoint,
)
from trainer.gcs import run_prefix, storage_client
from trainer.run_folder import (
    CHECKPOINTS_DIR,
    LOGS,
    LOGS_DIR,
    SUMMARY,
    atomic_path,
    write_atomic,
)

log = logging.getLogger(__name__)

#: The environment variable naming the bucket (``gs://BUCKET/PREFIX``) when the config does not.
BUCKET_ENV = "FORJA_CHECKPOINT_BUCKET"
#: Most seconds a preempted run waits for its last upload: Spot gives 30 s from the notice, the
#: launcher kills 20 s after SIGTERM (FORJA_STOP_GRACE_S), and the stop's own save comes first.
PREEMPTED_UPLOAD_WAIT_S = 10.0
MARKER_SUFFIX = ".complete.json"
PARTIAL = ".partial/"
#: Local folder (inside the checkpoint folder) of hard links to checkpoints waiting for upload.
STAGING = ".upload"
#: What the marker's ``sha256`` is: checkpoint.FOOTER_MARK's checksum of the bytes before the footer.
DIGEST_ALGORITHM = "sha256-8MiB-blocks"
#: Bytes per request of the resumable upload (a multiple of 256 KiB, as the API requires).
CHUNK_SIZE = 32 << 20
#: Seconds to wait for the network on each request (connect, read) before the attempt counts as failed.
REQUEST_TIMEOUT_S = (10.0, 120.0)
# The run folder's logs (trainer.run_folder.LOGS) are mirrored to ``PREFIX/<run>/logs/<name>`` (the
# run's history, see above). Its summary (run_folder.SUMMARY, trainer.report.write_summary, replaced
# whole) goes up beside them, so a run whose disk is gone (a Vertex AI replica, a deleted VM) still
# has it in the bucket; it is not restored at a start: the session that ends writes its own.
MARKER_RE = re.compile(r"^ckpt-(\d+)\.pt" + re.escape(MARKER_SUFFIX) + "$")


class MirrorUnavailable(RuntimeError):
    """The bucket cannot be read, and the local disk holds no checkpoint to resume from instead.

    A plain failure (exit 1): the restart tries again, rather than silently starting from step 0
    while the run's progress sits in an unreachable bucket.
    """


def bucket_url(configured: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The bucket to mirror to: the config's, else ``FORJA_CHECKPOINT_BUCKET``, else None (off)."""
    env = os.environ if env is None else env
    return (configured or env.get(BUCKET_ENV, "")).strip() or None


@dataclass(frozen=True)
class Marker:
    """A completion marker: the object it vouches for, and what its bytes must be."""

    step: int
    name: str  # the checkpoint object's full name
    size: int
    sha256: str
    generation: int  # of the checkpoint object the marker vouches for
    marker_generation: int = 0  # of the marker object itself (0: not read from the bucket)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": 1,
                "step": self.step,
                "object": self.name,
                "size": self.size,
                "sha256": self.sha256,
                "algorithm": DIGEST_ALGORITHM,
                "generation": str(self.generation),
            }
        )

    @classmethod
    def from_json(cls, text: bytes | str, marker_generation: int) -> Marker:
        data = json.loads(text)
        if data.get("algorithm") != DIGEST_ALGORITHM:
            raise ValueError(f"unknown digest algorithm {data.get('algorithm')!r}")
        return cls(
            step=int(data["step"]),
            name=str(data["object"]),
            size=int(data["size"]),
            sha256=str(data["sha256"]),
            generation=int(data["generation"]),
            marker_generation=marker_generation,
        )


@dataclass
class MirrorStats:
    """What the worker did, for the run's events and the bench (written by the worker only)."""

    uploaded: list[int] = field(default_factory=list)  # steps whose marker is in the bucket
    superseded: list[int] = field(default_factory=list)  # steps a newer checkpoint replaced
    failed_attempts: int = 0
    last_error: str | None = None
    last_upload_s: float | None = None  # seconds of the last successful upload, promotion included


@dataclass
class _Job:
    path: Path  # the staged hard link (or the checkpoint itself where links are not possible)
    step: int
    staged: bool


class _CountingReader:
    """A file reader that publishes how many bytes the upload has taken (the mirror's progress)."""

    def __init__(self, handle: BinaryIO, mirror: CheckpointMirror, step: int, size: int) -> None:
        self.handle, self.mirror, self.step, self.size = handle, mirror, step, size

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.mirror.progress = (self.step, self.handle.tell(), self.size)
        return data

    def tell(self) -> int:
        return self.handle.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.handle.seek(offset, whence)


class CheckpointMirror:
    """One run's checkpoints in ``gs://BUCKET/PREFIX/<run>/checkpoints/``: background upload, verified pull.

    ``keep``: markers kept in the bucket (older checkpoints are deleted after a new one is marked);
    0 keeps all. The retry delays double from ``retry_initial_s`` to ``retry_max_s``. ``run_dir``:
    the run folder whose logs (:data:`trainer.run_folder.LOGS`) go to ``logs/`` beside
    ``checkpoints/``, and come back at a start on a fresh disk; None mirrors checkpoints only.
    """

    def __init__(
        self,
        url: str,
        run: str,
        *,
        keep: int = 3,
        chunk_size: int = CHUNK_SIZE,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 60.0,
        run_dir: Path | None = None,
    ) -> None:
        self.bucket_name, root = run_prefix(url, run)
        self.prefix = f"{root}{CHECKPOINTS_DIR}/"
        self.logs_prefix = f"{root}{LOGS_DIR}/"
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.keep = keep
        self.chunk_size = chunk_size
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.stats = MirrorStats()
        #: (step, bytes read so far, size) of the upload under way, None between uploads.
        self.progress: tuple[int, int, int] | None = None
        self._bucket_obj: Any = None
        self._client_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pending: _Job | None = None
        self._current: _Job | None = None
        self._closing = False
        self._thread: threading.Thread | None = None
        self._logs_due = False  # close() asked the worker for one more upload of the logs
        self._logs_busy = False  # the worker is uploading the logs alone (no checkpoint job)
        #: sha256 of each log's bytes last uploaded (unchanged logs are not sent again).
        self._logs_sent: dict[str, bytes] = {}
        #: Why this session must not replace the bucket's logs (None: it may): until restore_logs has
        #: compared the run folder with the bucket, a folder holding only this session's lines (a
        #: failure on a fresh disk) would replace the whole history.
        self._logs_held: str | None = "the bucket's logs were not looked at yet (restore_logs)"
        self._deadline: float | None = None  # the first close()'s: a later one waits no longer

    @property
    def url(self) -> str:
        return f"gs://{self.bucket_name}/{self.prefix}"

    # -- the client (google.cloud.storage imported here only) -------------------------------------------

    def bucket(self) -> Any:
        """The ``google.cloud.storage.Bucket`` (client made on first use, shared by both threads)."""
        with self._client_lock:
            if self._bucket_obj is None:
                try:
                    client = storage_client()
                except ImportError as exc:
                    raise RuntimeError(
                        f"checkpoint_bucket {self.url} needs google-cloud-storage "
                        "(pip install -r trainer/requirements.txt)"
                    ) from exc
                self._bucket_obj = client.bucket(self.bucket_name)
            return self._bucket_obj

    # -- reading: what the bucket holds, pulled only when verified --------------------------------------

    def markers(self) -> list[Marker]:
        """The run's completion markers, newest step first (unreadable ones are skipped, with a warning)."""
        bucket = self.bucket()
        found: list[tuple[int, Any]] = []
        for blob in bucket.client.list_blobs(self.bucket_name, prefix=self.prefix, timeout=REQUEST_TIMEOUT_S):
            match = MARKER_RE.match(blob.name[len(self.prefix) :])
            if match:
                found.append((int(match.group(1)), blob))
        markers: list[Marker] = []
        for _, blob in sorted(found, key=lambda item: -item[0]):
            generation = int(blob.generation)  # read first: a download may reset the properties
            try:
                text = blob.download_as_bytes(if_generation_match=generation, timeout=REQUEST_TIMEOUT_S)
                markers.append(Marker.from_json(text, generation))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring %s: not a completion marker (%s)", blob.name, exc)
        return markers

    def fetch(self, marker: Marker, folder: Path) -> Path:
        """Download the checkpoint ``marker`` vouches for into ``folder`` as ``ckpt-<step>.pt``, verified.

        The bytes land in a temporary file (``*.tmp.<pid>``: a kill leaves nothing a resume would take)
        and are renamed into place only after their size, the marker's digest and the file's own footer
        agree. A local file of the same step (one that did not verify) is set aside as ``*.corrupt``.
        Raises :class:`CorruptCheckpoint` when the object is gone, changed or damaged.
        """
        from google.api_core import exceptions as gexc

        folder.mkdir(parents=True, exist_ok=True)
        dest = folder / f"ckpt-{marker.step}.pt"
        blob = self.bucket().blob(marker.name, generation=marker.generation)
        with atomic_path(dest) as tmp:  # fsynced and renamed into place at the end, the folder fsynced
            try:
                blob.download_to_filename(str(tmp), timeout=REQUEST_TIMEOUT_S)
            except gexc.NotFound as exc:
                raise CorruptCheckpoint(
                    f"{marker.name}: generation {marker.generation} named by its marker is gone"
                ) from exc
            size = tmp.stat().st_size
            if size != marker.size:
                raise CorruptCheckpoint(f"{marker.name}: {size} bytes, its marker says {marker.size}")
            digest = footer_digest(tmp)
            if digest != marker.sha256:
                raise CorruptCheckpoint(
                    f"{marker.name}: checksum {str(digest)[:12]}... is not the marker's "
                    f"{marker.sha256[:12]}..."
                )
            if not verify_checkpoint(tmp):  # the content against the footer: the bytes themselves
                raise CorruptCheckpoint(f"{marker.name}: has no checksum footer")
            if dest.exists():
                dest.rename(dest.with_name(dest.name + CORRUPT_SUFFIX))
        return dest

    def pull_newer(self, ckpts: CheckpointManager) -> Path | None:
        """Bring the bucket's newest verified checkpoint to the disk when it is newer than the disk's.

        "The disk's" is the newest local file whose checksum verifies (read, not loaded). Remote
        checkpoints that fail verification are skipped, newest first. When the bucket cannot be
        listed, the local checkpoint is used with a warning; with none on disk,
        :class:`MirrorUnavailable` is raised (the restart tries again).
        """
        local = newest_verified_step(ckpts)
        try:
            markers = self.markers()
        except Exception as exc:  # the bucket unreachable, no access, no such bucket
            if local is not None:
                log.warning(
                    "cannot list %s (%s): resuming from the local checkpoint of step %d", self.url, exc, local
                )
                return None
            raise MirrorUnavailable(
                f"cannot list {self.url} ({type(exc).__name__}: {exc}) and {ckpts.folder} holds no "
                "checkpoint: not starting from step 0 while the run's checkpoints may be there"
            ) from exc
        for marker in markers:
            if local is not None and marker.step <= local:
                break
            try:
                path = self.fetch(marker, ckpts.folder)
            except Exception as exc:  # damaged, gone, or the network: try the next older one
                log.warning("bucket checkpoint of step %d not taken: %s", marker.step, exc)
                continue
            log.info("pulled %s from %s (verified)", path.name, self.url)
            return path
        return None

    def sync_at_start(self, ckpts: CheckpointManager) -> Path | None:
        """At a (re)start, before the resume point is loaded (rank 0): pull, or catch up.

        Pulls the bucket's newest verified checkpoint when it is newer than the disk's (returns its
        path). When the disk's is the newer (a session killed before its upload finished), it is
        submitted for upload now. Raises :class:`MirrorUnavailable` (see :meth:`pull_newer`).
        On a fresh disk the run's logs come back first (:meth:`restore_logs`).
        """
        clear_staging(ckpts.folder)
        self.restore_logs()
        pulled = self.pull_newer(ckpts)
        local = newest_verified_step(ckpts)
        if pulled is None and local is not None:
            try:
                remote = self.markers()
            except Exception as exc:  # unreachable now: the next checkpoint is uploaded anyway
                log.warning("cannot list %s (%s)", self.url, exc)
                return None
            if not remote or remote[0].step < local:
                self.submit(ckpts.path_for(local), local)
        return pulled

    # -- the run's logs: events.jsonl and metrics.jsonl beside the checkpoints ---------------------------

    def restore_logs(self) -> list[str]:
        """A start on a fresh disk: the bucket's logs into the run folder; the names downloaded.

        Call it before the session writes anything to the run folder (rank 0); uploads of the logs
        wait for it. Only when the folder holds none of :data:`trainer.run_folder.LOGS` (a disk that
        kept its logs knows at least as much: they are never overwritten). Both are read before either
        is written, each through a temporary file renamed into place. When the bucket's logs cannot be
        read, this session does not upload its own (they would replace a history it never saw): a
        warning says so, and a later call tries again.
        """
        if self.run_dir is None or self._logs_held is None:
            return []
        if any((self.run_dir / name).exists() for name in LOGS):
            self._logs_held = None
            return []
        found: dict[str, bytes] = {}
        try:
            from google.api_core import exceptions as gexc

            bucket = self.bucket()
            for name in LOGS:
                with contextlib.suppress(gexc.NotFound):
                    found[name] = bucket.blob(self.logs_prefix + name).download_as_bytes(
                        timeout=REQUEST_TIMEOUT_S
                    )
            restored = [name for name, data in found.items() if _write_new(self.run_dir / name, data)]
        except Exception as exc:  # unreachable, no access: train on, but leave the bucket's history alone
            self._logs_held = f"{type(exc).__name__}: {exc}"
            log.warning(
                "cannot read the run's logs in gs://%s/%s (%s): this session's logs stay on this disk only",
                self.bucket_name, self.logs_prefix, self._logs_held,
            )  # fmt: skip
            return []
        self._logs_sent.update({name: hashlib.sha256(found[name]).digest() for name in restored})
        self._logs_held = None
        if restored:
            log.info("restored %s from gs://%s/%s", ", ".join(restored), self.bucket_name, self.logs_prefix)
        return restored

    def upload_logs(self) -> bool:
        """Upload the run folder's logs that changed since their last upload (whole lines only).

        Best effort: a failure is logged and returns False (the next checkpoint's upload tries again).
        Nothing before :meth:`restore_logs` has looked at the bucket's.
        """
        if self.run_dir is None or self._logs_held is not None:
            return False
        ok = True
        for name in (*LOGS, SUMMARY):
            try:
                data = (self.run_dir / name).read_bytes()
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("cannot read %s for its upload (%s)", name, exc)
                ok = False
                continue
            data = data[: data.rfind(b"\n") + 1]  # a line being written goes with the next upload
            digest = hashlib.sha256(data).digest()
            if not data or self._logs_sent.get(name) == digest:
                continue
            try:
                self.bucket().blob(self.logs_prefix + name).upload_from_string(
                    data,
                    content_type="application/json" if name == SUMMARY else "application/x-ndjson",
                    retry=None,
                    timeout=REQUEST_TIMEOUT_S,
                )
            except Exception as exc:  # the logs are history, not the run: never a reason to stop
                log.warning(
                    "upload of %s to gs://%s/%s failed (%s: %s); the next upload tries again",
                    name, self.bucket_name, self.logs_prefix, type(exc).__name__, exc,
                )  # fmt: skip
                ok = False
                continue
            self._logs_sent[name] = digest
        return ok

    # -- writing: one attempt ---------------------------------------------------------------------------

    def upload(self, path: Path, step: int) -> Marker:
        """Upload ``path`` as step ``step`` and mark it complete: one attempt, raising on any failure.

        No request is retried by the client (``retry=None``): the worker's own loop retries the
        whole attempt, with its backoff, and gives up an attempt when a newer checkpoint waits.
        """
        from google.api_core import exceptions as gexc

        bucket = self.bucket()
        size = path.stat().st_size
        digest = footer_digest(path)
        if digest is None:
            raise ValueError(f"{path.name} has no checksum footer: it cannot be marked complete")
        final = f"{self.prefix}ckpt-{step}.pt"
        marker_blob = bucket.blob(final + MARKER_SUFFIX)
        # What is there now: every write below is conditional on it staying so.
        existing_marker: Marker | None = None
        with contextlib.suppress(gexc.NotFound):
            marker_blob.reload(retry=None, timeout=REQUEST_TIMEOUT_S)
            generation = int(marker_blob.generation)  # read first: a download may reset the properties
            text = marker_blob.download_as_bytes(
                if_generation_match=generation, retry=None, timeout=REQUEST_TIMEOUT_S
            )
            existing_marker = Marker.from_json(text, generation)
        if existing_marker is not None and (existing_marker.sha256, existing_marker.size) == (digest, size):
            self.stats.last_upload_s = 0.0
            return existing_marker  # an earlier attempt got through (its answer was lost)
        existing = bucket.get_blob(final, retry=None, timeout=REQUEST_TIMEOUT_S)
        partial = bucket.blob(f"{self.prefix}{PARTIAL}ckpt-{step}.pt.{uuid.uuid4().hex[:12]}")
        partial.chunk_size = self.chunk_size
        started = time.monotonic()
        self.progress = (step, 0, size)
        try:
            with open(path, "rb") as handle:
                partial.upload_from_file(
                    _CountingReader(handle, self, step, size),
                    size=size,
                    if_generation_match=0,
                    retry=None,
                    timeout=REQUEST_TIMEOUT_S,
                )
            if existing_marker is not None:  # a different checkpoint of this step: unmark it first
                marker_blob.delete(
                    if_generation_match=existing_marker.marker_generation,
                    retry=None,
                    timeout=REQUEST_TIMEOUT_S,
                )
            promoted = bucket.copy_blob(
                partial,
                bucket,
                final,
                if_generation_match=existing.generation if existing is not None else 0,
                retry=None,
                timeout=REQUEST_TIMEOUT_S,
            )
            marker = Marker(step, final, size, digest, int(promoted.generation))
            written = bucket.blob(final + MARKER_SUFFIX)
            written.upload_from_string(
                marker.to_json(),
                content_type="application/json",
                if_generation_match=0,
                retry=None,
                timeout=REQUEST_TIMEOUT_S,
            )
            marker = replace(marker, marker_generation=int(written.generation))
        finally:
            self.progress = None
            with contextlib.suppress(Exception):  # best effort: .partial/ is never read, pruning retries
                partial.delete(retry=None, timeout=REQUEST_TIMEOUT_S)
        self.stats.last_upload_s = time.monotonic() - started
        self._prune(step)
        return marker

    def _prune(self, newest: int) -> None:
        """Delete what the bucket no longer needs: checkpoints beyond the newest ``keep`` markers, and
        abandoned partial uploads of older steps (failures here are logged; the next prune retries)."""
        try:
            bucket = self.bucket()
            blobs = list(
                bucket.client.list_blobs(self.bucket_name, prefix=self.prefix, timeout=REQUEST_TIMEOUT_S)
            )
            marked = sorted(
                (int(m.group(1)), b) for b in blobs if (m := MARKER_RE.match(b.name[len(self.prefix) :]))
            )
            old = marked[: -self.keep] if self.keep else []
            for step, blob in old:  # the marker goes first: a checkpoint is never marked but missing
                blob.delete(if_generation_match=blob.generation, timeout=REQUEST_TIMEOUT_S)
                with contextlib.suppress(Exception):
                    bucket.blob(f"{self.prefix}ckpt-{step}.pt").delete(timeout=REQUEST_TIMEOUT_S)
            for blob in blobs:
                rest = blob.name[len(self.prefix) :]
                match = re.match(re.escape(PARTIAL) + r"ckpt-(\d+)\.pt\.", rest)
                if match and int(match.group(1)) < newest:
                    blob.delete(timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:
            log.warning("pruning %s failed (%s); the next upload tries again", self.url, exc)

    # -- the background worker --------------------------------------------------------------------------

    def start(self) -> CheckpointMirror:
        """Start the worker thread (once)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="forja-checkpoint-mirror", daemon=True
                )
                self._thread.start()
        return self

    def submit(self, path: Path, step: int) -> None:
        """Queue ``path`` (a checkpoint just written) for upload and return at once.

        It replaces a checkpoint still waiting (never the one being uploaded).
        """
        job = _stage(Path(path), step)
        with self._cond:
            if self._closing:
                _unstage(job)
                raise RuntimeError("the checkpoint mirror is closed")
            older, self._pending = self._pending, job
            self._cond.notify_all()
        if older is not None:
            log.info("checkpoint of step %d superseded by step %d before its upload began", older.step, step)
            self.stats.superseded.append(older.step)
            _unstage(older)
        self.start()

    def idle(self) -> bool:
        """Nothing waiting and nothing under way."""
        with self._cond:
            return self._pending is None and self._current is None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted checkpoint is uploaded or superseded; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and self._current is None, timeout_s)

    def close(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for the last upload, then stop taking new ones; True when all are in.

        Then the logs go up once more when they changed since (the events written after the last
        checkpoint), within the same wait. Called again (after the run's last events), it uploads
        the logs again, never waiting past the first call's deadline. An upload still under way goes
        on in its (daemon) thread until the process exits; its checkpoint stays on the local disk,
        and the next start uploads it.
        """
        deadline = time.monotonic() + timeout_s
        if self._deadline is not None:
            deadline = min(deadline, self._deadline)
        self._deadline = deadline
        done = self.wait(max(0.0, deadline - time.monotonic()))
        if done and self.run_dir is not None and self._logs_held is None:
            with self._cond:
                self._logs_due = True
                self._cond.notify_all()
            self.start()  # the worker of an earlier close() has ended
            with self._cond:
                self._cond.wait_for(
                    lambda: not (self._logs_due or self._logs_busy), max(0.0, deadline - time.monotonic())
                )
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if not done:
            step = self._current.step if self._current else self._pending.step if self._pending else None
            log.warning(
                "the upload of the checkpoint of step %s to %s did not finish within %.0f s; "
                "it stays on the local disk and the next start uploads it",
                step,
                self.url,
                timeout_s,
            )
        return done

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._logs_due or self._closing)
                if self._pending is None and not self._logs_due:
                    self._thread = None  # closed: a later close() starts another for the logs
                    return
                job, self._pending = self._pending, None
                self._current = job
                if job is None:  # the logs alone (close)
                    self._logs_due, self._logs_busy = False, True
            try:
                if job is None:
                    self.upload_logs()
                else:
                    self._upload_with_retries(job)
            finally:
                if job is not None:
                    _unstage(job)
                with self._cond:
                    self._current, self._logs_busy = None, False
                    self._cond.notify_all()

    def _upload_with_retries(self, job: _Job) -> None:
        attempt = 0
        while True:
            try:
                self.upload(job.path, job.step)
            except Exception as exc:  # anything: training goes on, the next attempt may work
                attempt += 1
                delay = min(self.retry_max_s, self.retry_initial_s * 2 ** (attempt - 1))
                self.stats.failed_attempts += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "upload of the checkpoint of step %d to %s failed (attempt %d: %s: %s); retry in %.1f s",
                    job.step, self.url, attempt, type(exc).__name__, exc, delay,
                )  # fmt: skip
                with self._cond:
                    self._cond.wait_for(lambda: self._pending is not None or self._closing, delay)
                    newer, closing = self._pending, self._closing
                if newer is not None:
                    log.info(
                        "checkpoint of step %d: upload abandoned for the newer step %d", job.step, newer.step
                    )
                    self.stats.superseded.append(job.step)
                    return
                if closing:
                    return
                continue
            self.stats.uploaded.append(job.step)
            log.info(
                "checkpoint of step %d mirrored to %s (%.1f s)", job.step, self.url, self.stats.last_upload_s
            )
            with self._cond:  # read from now on: what close() asked for so far goes with this upload
                self._logs_due = False
            self.upload_logs()
            return


def _stage(path: Path, step: int) -> _Job:
    """A hard link to ``path`` in the staging folder: the upload reads it even if pruning deletes ``path``."""
    staging = path.parent / STAGING
    link = staging / f"{path.name}.{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir(exist_ok=True)
        os.link(path, link)
    except OSError as exc:  # a file system without hard links: upload from the file itself
        log.debug("cannot stage %s (%s): uploading it in place", path.name, exc)
        return _Job(path, step, staged=False)
    return _Job(link, step, staged=True)


def _unstage(job: _Job) -> None:
    if job.staged:
        job.path.unlink(missing_ok=True)


def _write_new(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` through a temporary file renamed into place; never over an existing file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_atomic(path, data, replace=False)
    except FileExistsError:  # it appeared meanwhile: it is kept
        return False
    return True


def clear_staging(folder: Path) -> None:
    """Remove staging links a killed process left (the next start re-submits the newest checkpoint)."""
    staging = folder / STAGING
    if staging.is_dir():
        for link in staging.iterdir():
            link.unlink(missing_ok=True)


def newest_verified_step(ckpts: CheckpointManager) -> int | None:
    """The step of the newest local checkpoint whose checksum verifies (or which predates checksums)."""
    for path in reversed(ckpts.list()):
        try:
            verify_checkpoint(path)
        except CorruptCheckpoint:
            continue
        match = CKPT_RE.match(path.name)
        if match:
            return int(match.group(1))
    return None


def open_for_run(
    url: str | None, run: str, ckpts: CheckpointManager, **options: Any
) -> CheckpointMirror | None:
    """A starting run's mirror, synced (:meth:`CheckpointMirror.sync_at_start`); None without a bucket."""
    if url is None:
        return None
    mirror = CheckpointMirror(url, run, keep=ckpts.keep, **options)
    mirror.sync_at_start(ckpts)
    return mirror
