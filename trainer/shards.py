"""Sharded datasets larger than RAM or disk: Parquet shards read a window at a time, resumable at the sample.

Why Parquet (pyarrow) and not WebDataset tar shards: a Parquet file's footer says how many rows
each row group holds, and any row group can be read alone. So the sample order of an epoch is a
pure function of (seed, epoch) computed from metadata before a byte of data is read, and a run
resumed at step k starts reading at the row group that holds its next sample: no replay of the
epoch up to k, which a tar stream needs (it can only be read from the start of a shard, and knows
its length only once read). Zstandard is a Parquet codec (per column chunk), so compression costs
no extra layer, and numeric columns become tensors without a Python object per sample.
bench/shards_bench.py measures the codecs (numbers in trainer/README.md, "Sharded datasets").

The order of an epoch (all from ``(seed, epoch)``, :func:`trainer.data.epoch_seed`):

1. shards are permuted; consecutive groups of ``mix_shards`` shards have their row groups (each
   shard's in a permuted order) interleaved, so neighbouring samples come from several shards;
2. this sequence of N samples is cut into ``world_size`` equal contiguous lanes, one per rank (a
   rank reads only its own lane's shards), each lane into steps of ``global_batch / world_size``
   samples, and the steps into *windows* of whole steps (about ``window_mb`` of decoded data);
3. each window's samples are permuted, then cut into steps and micro-batches.

Window ``i`` of a rank goes to DataLoader worker ``i % workers``, so each worker reads its own
windows and the DataLoader hands them back in order: the order is the same with any number of
workers and at any micro-batch (an OOM fallback keeps the global batch). Memory is bounded by
about ``workers + 1`` windows plus a row group per worker. Up to a global batch of samples at
the end of an epoch is left out (as ``drop_last``), the same on every rank.

Sources: a local folder (a dataset staged at /var/lib/forja/data/NAME, or shards written by
:mod:`trainer.shard_writer`), or ``gs://BUCKET/datasets/NAME`` as ``forja data push`` lays it out
(``manifest.json`` naming content-addressed blobs under ``datasets/blobs/``). Bucket shards are
downloaded one at a time into a per-rank cache folder, checked against the manifest's sha256 before
use, shared by that rank's workers, and deleted once every worker is done with them: the disk holds
about ``mix_shards + 1`` shards per rank, never the dataset.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import default_collate

from trainer.config import ConfigError
from trainer.data import BatchPlan, StepSource, StreamPosition, epoch_seed
from trainer.errors import UserCodeError
from trainer.gcs import storage_client
from trainer.shard_format import SUFFIX, TENSOR_DTYPE, TENSOR_SHAPE

log = logging.getLogger(__name__)

DAMAGED = ".damaged"  # a shard found not to match its manifest hash: the note says so to the other workers
MANIFEST = "manifest.json"
BLOBS = "datasets/blobs"
DEFAULT_CACHE = "~/.cache/forja/shards"
#: Where a bucket's shards are cached when data_args.cache_dir is not set (a local NVMe disk).
CACHE_ENV = "FORJA_SHARD_CACHE"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Shard:
    """One Parquet file: where it is, and what its footer says (rows per row group, bytes per row)."""

    path: str  # relative to the dataset's root (the manifest's "path")
    rows: tuple[int, ...]
    bytes_per_row: float
    size: int = 0
    sha256: str | None = None  # from the manifest; a bucket's shards are checked against it

    @property
    def total(self) -> int:
        return sum(self.rows)


# -- where the shards come from --------------------------------------------------------------------


class LocalSource:
    """A folder of shards on this machine: opened in place, never copied, never deleted."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)

    def listing(self) -> list[dict[str, Any]]:
        manifest = self.root / MANIFEST
        if manifest.is_file():
            return _manifest_files(json.loads(manifest.read_text()), str(manifest))
        return [
            {"path": p.relative_to(self.root).as_posix(), "size": p.stat().st_size}
            for p in sorted(self.root.rglob(f"*{SUFFIX}"))
        ]

    def footer(self, entry: dict[str, Any]) -> pq.FileMetaData:
        return pq.read_metadata(self.root / entry["path"])

    def open(self, shard: Shard) -> pa.NativeFile:
        return pa.OSFile(str(self.root / shard.path))

    def done(self, shard: Shard, tag: str, expected: set[str]) -> None:
        """Nothing to delete: the folder is the user's."""

    def clean(self, keep: set[str]) -> None:
        """Nothing cached."""


class BucketSource:
    """``gs://BUCKET/datasets/NAME``: manifest.json, blobs streamed a shard at a time into a cache."""

    def __init__(self, url: str, cache: Path) -> None:
        from trainer.gcs import parse_bucket_url  # one home for the bucket-name rule

        self.url = url
        try:
            self.bucket_name, prefix = parse_bucket_url(url)
        except ValueError as exc:
            raise ConfigError([f"data_args.source: {exc}"]) from None
        if not prefix.startswith("datasets/") or prefix.count("/") != 1:
            raise ConfigError(
                [f"data_args.source: a bucket dataset is gs://BUCKET/datasets/NAME (got {url!r})"]
            )
        self.prefix, self.cache = prefix, cache
        self._bucket: Any = None
        self._pid = 0

    def bucket(self) -> Any:
        """The bucket, with a client made in this process: a forked worker must not share the
        parent's connections (trainer.mirror builds its client the same way: STORAGE_EMULATOR_HOST)."""
        if self._bucket is None or self._pid != os.getpid():
            self._bucket, self._pid = storage_client().bucket(self.bucket_name), os.getpid()
        return self._bucket

    def __getstate__(self) -> dict[str, Any]:  # spawn/forkserver workers: a new client there too
        return {**self.__dict__, "_bucket": None, "_pid": 0}

    def listing(self) -> list[dict[str, Any]]:
        from google.api_core import exceptions

        name = f"{self.prefix}/{MANIFEST}"
        try:
            text = self.bucket().blob(name).download_as_bytes()
        except exceptions.NotFound:
            raise ConfigError(
                [
                    f"data_args.source: gs://{self.bucket_name}/{name} does not exist: the dataset was "
                    "never pushed or its push did not finish (forja data push PATH writes the manifest last)"
                ]
            ) from None
        return _manifest_files(json.loads(text), f"gs://{self.bucket_name}/{name}")

    def footer(self, entry: dict[str, Any]) -> pq.FileMetaData:
        """The shard's footer from two ranged reads (its length, then itself): no download."""
        blob = self.bucket().blob(f"{BLOBS}/{entry['sha256']}")
        size = int(entry.get("size") or 0)
        if size < 12:
            raise ConfigError(
                [f"data_args.source: the manifest gives {entry['path']} size {size}: not Parquet"]
            )
        tail = blob.download_as_bytes(start=size - 8, end=size - 1)
        if tail[4:] != b"PAR1":
            raise ConfigError([f"data_args.source: {entry['path']} is not a Parquet file (no PAR1 footer)"])
        length = struct.unpack("<I", tail[:4])[0]
        footer = blob.download_as_bytes(start=size - 8 - length, end=size - 9)
        return pq.read_metadata(pa.BufferReader(footer + tail))  # the reader only looks at the end

    def open(self, shard: Shard) -> pa.NativeFile:
        """The cached shard, opened (downloaded and checked first by whichever worker needs it first).

        Opened under the lock: a file deleted afterwards by the last worker done with it stays
        readable through this handle.
        """
        self.cache.mkdir(parents=True, exist_ok=True)
        assert shard.sha256 is not None
        final = self.cache / f"{shard.sha256}{SUFFIX}"
        damaged = self.cache / f"{shard.sha256}{DAMAGED}"
        with _locked(self.cache / f"{shard.sha256}.lock"):
            if damaged.exists():  # another worker found it damaged: not a second (doomed) download
                raise UserCodeError(damaged.read_text())
            if not final.exists():
                self._download(shard, final, damaged)
            return pa.OSFile(str(final))

    def _download(self, shard: Shard, final: Path, damaged: Path) -> None:
        blob_name = f"{BLOBS}/{shard.sha256}"
        part = final.with_name(f"{final.name}.part-{os.getpid()}")
        digest = hashlib.sha256()
        try:
            with open(part, "wb") as handle:
                self.bucket().blob(blob_name).download_to_file(_Hashing(handle, digest))
            if digest.hexdigest() != shard.sha256:
                problem = (
                    f"data_args.source: shard {shard.path} (gs://{self.bucket_name}/{blob_name}) has "
                    f"sha256 {digest.hexdigest()}, not the manifest's {shard.sha256}: the blob is damaged "
                    "or was replaced; push the dataset again (forja data push)"
                )
                damaged.write_text(problem)
                raise UserCodeError(problem)
            os.replace(part, final)
        finally:
            part.unlink(missing_ok=True)
        log.info("shard %s downloaded and verified (%d bytes)", shard.path, shard.size)

    def done(self, shard: Shard, tag: str, expected: set[str]) -> None:
        """``tag`` is done with ``shard``; the last of ``expected`` to say so deletes it."""
        assert shard.sha256 is not None
        marks = self.cache / f"{shard.sha256}.done"
        with _locked(self.cache / f"{shard.sha256}.lock"):
            marks.mkdir(exist_ok=True)
            (marks / tag).touch()
            if expected <= {p.name for p in marks.iterdir()}:
                (self.cache / f"{shard.sha256}{SUFFIX}").unlink(missing_ok=True)
                shutil.rmtree(marks, ignore_errors=True)

    def clean(self, keep: set[str]) -> None:
        """Before a pass: drop what an earlier session left (done marks, partial downloads, damage
        notes: the dataset may have been pushed again, shards this pass will not read again)."""
        if not self.cache.is_dir():
            return
        for item in self.cache.iterdir():
            sha = item.name.split(".", 1)[0]
            if item.name.endswith(".done"):
                shutil.rmtree(item, ignore_errors=True)
            elif ".part-" in item.name or item.name.endswith(DAMAGED) or (
                item.name.endswith(SUFFIX) and sha not in keep
            ):
                item.unlink(missing_ok=True)


class _Hashing:
    """A file wrapper that hashes what is written through it (the download is checked as it lands)."""

    def __init__(self, handle: BinaryIO, digest: Any) -> None:
        self.handle, self.digest = handle, digest

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.handle.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _manifest_files(manifest: Any, where: str) -> list[dict[str, Any]]:
    """The manifest's file entries (interface 1 of the dataset layout), checked for the keys we use."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, list):
        raise ConfigError([f"data_args.source: {where} has no 'files' list (not a forja dataset manifest)"])
    for entry in files:
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)):
            raise ConfigError([f"data_args.source: {where} has a file entry without a path: {entry!r}"])
        sha = entry.get("sha256")
        if sha is not None and not _HEX64.match(str(sha)):
            raise ConfigError([f"data_args.source: {where}: {entry['path']} has a bad sha256 {sha!r}"])
    return files


def open_source(source: str, cache_dir: str | None) -> LocalSource | BucketSource:
    """The source ``data_args.source`` names; ConfigError when the folder does not exist."""
    if source.startswith("gs://"):
        base = Path(os.path.expanduser(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE))
        key = hashlib.sha256(source.rstrip("/").encode()).hexdigest()[:12]
        return BucketSource(source.rstrip("/"), base / key)
    root = Path(os.path.expanduser(source))
    if not root.is_dir():
        raise ConfigError(
            [
                f"data_args.source: {source!r} is not a folder (give a folder of .parquet shards, or "
                "gs://BUCKET/datasets/NAME)"
            ]
        )
    return LocalSource(root.resolve())


def read_shards(source: LocalSource | BucketSource, split: str, columns: list[str], key: str) -> list[Shard]:
    """The split's shards (files under ``split/``) with their footers; ConfigError naming ``key``."""
    prefix = split.strip("/") + "/" if split.strip("/") else ""
    entries = [e for e in source.listing() if e["path"].endswith(SUFFIX) and e["path"].startswith(prefix)]
    if not entries:
        raise ConfigError(
            [
                f"{key}: no {SUFFIX} shards under {source.url}/{prefix} (write some with "
                "python -m trainer.shards write, or name the split folder)"
            ]
        )
    shards = []
    for entry in sorted(entries, key=lambda e: e["path"]):
        if isinstance(source, BucketSource) and not entry.get("sha256"):
            raise ConfigError([f"data_args.source: the manifest gives no sha256 for {entry['path']}"])
        meta = source.footer(entry)
        names = set(meta.schema.to_arrow_schema().names)
        missing = [c for c in columns if c not in names]
        if missing:
            raise ConfigError(
                [
                    f"data_args.columns: {missing[0]!r} is not a column of {entry['path']} "
                    f"(its columns: {', '.join(sorted(names))})"
                ]
            )
        rows = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
        decoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        shards.append(
            Shard(
                entry["path"],
                rows,
                decoded / max(1, sum(rows)),
                int(entry.get("size", 0)),
                entry.get("sha256"),
            )
        )
    return shards


# -- the order of an epoch -------------------------------------------------------------------------


@dataclass(frozen=True)
class Slice:
    """Rows [lo, hi) of row group ``group`` of shard ``shard`` (indices into the dataset's lists)."""

    shard: int
    group: int
    lo: int
    hi: int


@dataclass
class EpochOrder:
    """An epoch's sequence of row groups and where each starts in the sequence of samples."""

    units: list[tuple[int, int]]  # (shard, row group)
    starts: np.ndarray  # sample offset of each unit; one more entry: the total

    def slices(self, first: int, last: int) -> list[Slice]:
        """The row-group slices that hold samples [first, last) of the epoch's sequence."""
        out = []
        k = int(np.searchsorted(self.starts, first, side="right")) - 1
        while k < len(self.units) and self.starts[k] < last:
            shard, group = self.units[k]
            lo, hi = max(first, int(self.starts[k])), min(last, int(self.starts[k + 1]))
            out.append(Slice(shard, group, lo - int(self.starts[k]), hi - int(self.starts[k])))
            k += 1
        return out


def epoch_order(shards: list[Shard], seed: int, epoch: int, mix_shards: int) -> EpochOrder:
    """Shards permuted, then row groups of ``mix_shards`` consecutive shards interleaved."""
    rng = np.random.default_rng(epoch_seed(seed, epoch))
    order = rng.permutation(len(shards))
    units: list[tuple[int, int]] = []
    for first in range(0, len(order), mix_shards):
        group = [int(s) for s in order[first : first + mix_shards]]
        groups = [rng.permutation(len(shards[s].rows)) for s in group]
        for k in range(max(len(g) for g in groups)):
            units.extend((s, int(g[k])) for s, g in zip(group, groups, strict=True) if k < len(g))
    sizes = [shards[s].rows[g] for s, g in units]
    return EpochOrder(units, np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]))


@dataclass(frozen=True)
class Lane:
    """One rank's share of an epoch: steps of ``step_samples``, grouped into windows of ``window_steps``."""

    start: int  # first sample of the lane in the epoch's sequence
    steps: int
    step_samples: int
    window_steps: int

    @property
    def windows(self) -> int:
        return -(-self.steps // self.window_steps)

    def window(self, index: int) -> tuple[int, int]:
        """Samples [first, last) of window ``index`` in the epoch's sequence."""
        first = index * self.window_steps
        last = min(self.steps, first + self.window_steps)
        return self.start + first * self.step_samples, self.start + last * self.step_samples


# -- the dataset -----------------------------------------------------------------------------------


@dataclass(eq=False)  # a dataset is compared by identity, as torch's are
class ShardedDataset(StepSource):
    """Parquet shards as a :class:`trainer.data.StepSource`: windows of steps, resumable at any step."""

    source: LocalSource | BucketSource
    shards: list[Shard]
    columns: list[str] | None = None
    shapes: dict[str, list[int]] = field(default_factory=dict)
    transform: Callable[[dict[str, Any]], Any] | None = None
    window_mb: float = 256.0
    mix_shards: int = 2

    def __post_init__(self) -> None:
        super().__init__()
        self.total = sum(s.total for s in self.shards)
        self.bytes_per_row = sum(s.bytes_per_row * s.total for s in self.shards) / max(1, self.total)

    # -- planning (every rank computes the same from the footers)

    def lane(self, plan: BatchPlan, rank: int) -> Lane:
        step_samples = plan.global_batch // plan.world_size
        per_rank = self.total // plan.world_size
        steps = per_rank // step_samples
        if steps < 1:
            raise ConfigError(
                [
                    f"batch: the global batch {plan.global_batch} is larger than the {self.total} samples "
                    "of the shards (lower batch_size or effective_batch_size)"
                ]
            )
        window_samples = self.window_mb * 2**20 / max(self.bytes_per_row, 1.0)
        window_steps = max(1, min(steps, int(window_samples // step_samples)))
        return Lane(rank * per_rank, steps, step_samples, window_steps)

    def steps_per_epoch(self, plan: BatchPlan) -> int:
        return self.lane(plan, 0).steps

    def _remaining(self, position: StreamPosition) -> tuple[EpochOrder, Lane, int]:
        order = epoch_order(self.shards, position.seed, position.epoch, self.mix_shards)
        lane = self.lane(position.plan, position.rank)
        return order, lane, position.start_step // lane.window_steps

    def _users(self, order: EpochOrder, lane: Lane, first_window: int, workers: int) -> dict[int, set[int]]:
        """Shard -> the workers that read it in the windows from ``first_window`` on."""
        users: dict[int, set[int]] = {}
        for i, window in enumerate(range(first_window, lane.windows)):
            for part in order.slices(*lane.window(window)):
                users.setdefault(part.shard, set()).add(i % workers)
        return users

    def prepare_epoch(self, position: StreamPosition) -> None:
        order, lane, first = self._remaining(position)
        keep = {self.shards[s].sha256 or "" for s in self._users(order, lane, first, 1)}
        self.source.clean(keep)

    # -- reading

    def windows(
        self,
        position: StreamPosition,
        worker: int,
        workers: int,
        collate: Callable[[list[Any]], Any] | None,
    ) -> Iterator[list[list[Any]]]:
        order, lane, first = self._remaining(position)
        plan = position.plan
        users = self._users(order, lane, first, workers)
        last_use: dict[int, int] = {}
        for i, window in enumerate(range(first, lane.windows)):
            if i % workers == worker:
                for part in order.slices(*lane.window(window)):
                    last_use[part.shard] = window
        tag = f"e{position.epoch}-s{position.start_step}-w{worker}"
        expected = {
            s: {f"e{position.epoch}-s{position.start_step}-w{w}" for w in ws} for s, ws in users.items()
        }
        reader = _Reader(self.source, self.shards, self.columns)
        try:
            for i, window in enumerate(range(first, lane.windows)):
                if i % workers != worker:
                    continue
                first_sample, last_sample = lane.window(window)
                parts = order.slices(first_sample, last_sample)
                table = pa.concat_tables([reader.read(p) for p in parts])
                rng = np.random.default_rng(
                    [epoch_seed(position.seed, position.epoch), position.rank, window]
                )
                table = table.take(pa.array(rng.permutation(table.num_rows)))
                skip = max(0, position.start_step - window * lane.window_steps)
                steps = self._steps(table, plan, skip, lane.step_samples, collate)
                del table
                for part in parts:  # the window is in tensors: a shard read for the last time can go
                    if last_use.get(part.shard) == window:
                        reader.close(part.shard)
                        self.source.done(self.shards[part.shard], tag, expected[part.shard])
                yield steps
        finally:
            reader.close_all()

    def _steps(
        self,
        table: pa.Table,
        plan: BatchPlan,
        skip: int,
        step_samples: int,
        collate: Callable[..., Any] | None,
    ) -> list[list[Any]]:
        """The window's steps (after ``skip``), each a list of collated micro-batches."""
        table = table.slice(skip * step_samples)
        per_sample = self.transform is not None or collate is not None
        batch = None if per_sample else self._tensors(table)
        rows = self._samples(table) if per_sample else None
        steps = []
        for step in range(table.num_rows // step_samples):
            micro = []
            for m in range(plan.accum_steps):
                lo = step * step_samples + m * plan.micro_batch
                if rows is not None:
                    micro.append((collate or default_collate)(rows[lo : lo + plan.micro_batch]))
                else:
                    assert batch is not None
                    micro.append(_cut(batch, lo, lo + plan.micro_batch))
            steps.append(micro)
        return steps

    def _tensors(self, table: pa.Table) -> tuple[torch.Tensor, ...] | dict[str, torch.Tensor]:
        """Each column as one tensor over the table's rows: a tuple in ``columns`` order, else a dict."""
        names = self.columns or table.column_names
        tensors = {
            name: column_tensor(table.column(name), table.schema.field(name), self.shapes.get(name))
            for name in names
        }
        return tuple(tensors[n] for n in names) if self.columns else tensors

    def _samples(self, table: pa.Table) -> list[Any]:
        rows = table.to_pylist()
        if self.transform is None:
            names = self.columns or table.column_names
            return [tuple(r[n] for n in names) if self.columns else r for r in rows]
        return [self.transform(r) for r in rows]

    def __iter__(self) -> Iterator[Any]:
        """Plain samples in stored order (find-batch, estimate, evaluation), one row group at a time."""
        reader = _Reader(self.source, self.shards, self.columns)
        try:
            for s, shard in enumerate(self.shards):
                for g, rows in enumerate(shard.rows):
                    table = reader.read(Slice(s, g, 0, rows))
                    if self.transform is not None:
                        yield from (self.transform(r) for r in table.to_pylist())
                        continue
                    batch = self._tensors(table)
                    for i in range(rows):
                        yield _cut(batch, i, i + 1, single=True)
                reader.close(s)
                self.source.done(shard, "solo", {"solo"})
        finally:
            reader.close_all()


def _cut(batch: Any, lo: int, hi: int, single: bool = False) -> Any:
    if isinstance(batch, dict):
        return {k: v[lo] if single else v[lo:hi] for k, v in batch.items()}
    return tuple(v[lo] if single else v[lo:hi] for v in batch)


class _Reader:
    """One worker's open shards and its last row group read (neighbouring windows share one)."""

    def __init__(self, source: LocalSource | BucketSource, shards: list[Shard], columns: list[str] | None):
        self.source, self.shards, self.columns = source, shards, columns
        self.files: dict[int, tuple[pa.NativeFile, pq.ParquetFile]] = {}
        self.last: tuple[tuple[int, int], pa.Table] | None = None

    def read(self, part: Slice) -> pa.Table:
        key = (part.shard, part.group)
        if self.last is None or self.last[0] != key:
            if part.shard not in self.files:
                handle = self.source.open(self.shards[part.shard])
                self.files[part.shard] = (handle, pq.ParquetFile(handle))
            self.last = (key, self.files[part.shard][1].read_row_group(part.group, columns=self.columns))
        return self.last[1].slice(part.lo, part.hi - part.lo)

    def close(self, shard: int) -> None:
        entry = self.files.pop(shard, None)
        if entry is not None:
            entry[0].close()
        if self.last is not None and self.last[0][0] == shard:
            self.last = None

    def close_all(self) -> None:
        for shard in list(self.files):
            self.close(shard)


def column_tensor(column: pa.ChunkedArray, field: pa.Field, shape: list[int] | None) -> torch.Tensor:
    """A numeric column (scalars, lists of one length, or tensors stored as bytes) as a tensor of
    shape (rows, *shape); a tensor column's own shape applies unless ``shape`` is given."""
    array = column.combine_chunks()
    kind, name, meta = array.type, field.name, field.metadata or {}
    if pa.types.is_fixed_size_binary(kind) and TENSOR_DTYPE in meta:
        dtype = np.dtype(meta[TENSOR_DTYPE].decode())
        data = array.buffers()[1]
        values = np.frombuffer(
            data, dtype=np.uint8, count=len(array) * kind.byte_width, offset=array.offset * kind.byte_width
        ).view(dtype)
        values = values.reshape(len(array), *json.loads(meta[TENSOR_SHAPE]))
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        values = array.flatten().to_numpy(zero_copy_only=False)
        if len(array) and values.size % len(array):
            raise UserCodeError(
                f"data_args.columns: column {name!r} holds lists of different lengths; give "
                "data_args.transform (and a collate) to turn its rows into samples"
            )
        values = values.reshape(len(array), -1)
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        values = array.to_numpy(zero_copy_only=False)
    else:
        raise UserCodeError(
            f"data_args.columns: column {name!r} is {kind}, not numbers; give data_args.transform "
            "(a function from a row dict to a sample) to decode it"
        )
    if not values.flags.writeable:  # a zero-copy view of Arrow's buffer: torch wants its own
        values = values.copy()
    tensor = torch.from_numpy(np.ascontiguousarray(values))
    if shape:
        try:
            tensor = tensor.reshape(len(array), *shape)
        except RuntimeError:
            raise UserCodeError(
                f"data_args.shapes: {name}: {shape} does not fit its {values.size // max(1, len(array))} "
                "values per row"
            ) from None
    return tensor


def dataset(
    source: str,
    train: str = "train",
    eval: str | None = None,
    columns: list[str] | None = None,
    shapes: dict[str, list[int]] | None = None,
    transform: str | None = None,
    window_mb: float = 256.0,
    mix_shards: int = 2,
    cache_dir: str | None = None,
) -> tuple[ShardedDataset, ShardedDataset | None]:
    """(train, eval) from Parquet shards: the data factory a config names (``data: trainer.shards:dataset``).

    ``source``: a folder of shards, or gs://BUCKET/datasets/NAME. ``train``/``eval``: the split folders
    inside it (eval null: no evaluation). ``columns``: the batch is a tuple in this order, e.g.
    ``[image, label]``; null: a dict of every column. ``shapes``: a list column reshaped per sample,
    e.g. ``{image: [1, 8, 8]}``. ``transform``: ``module:function`` from a row dict to a sample, for
    columns that are not numbers (encoded images, text). ``window_mb``: decoded data shuffled
    together (memory per DataLoader worker). ``mix_shards``: shards whose row groups interleave.
    ``cache_dir``: where a bucket's shards are downloaded (default $FORJA_SHARD_CACHE, else
    ~/.cache/forja/shards), a rank subfolder each.
    """
    if window_mb <= 0:
        raise ConfigError([f"data_args.window_mb: must be > 0 (got {window_mb})"])
    if mix_shards < 1:
        raise ConfigError([f"data_args.mix_shards: must be >= 1 (got {mix_shards})"])
    unknown = [c for c in shapes or {} if columns is not None and c not in columns]
    if unknown:
        raise ConfigError([f"data_args.shapes: {unknown[0]!r} is not one of data_args.columns {columns}"])
    rank = os.environ.get("RANK", "0")
    opened = open_source(source, cache_dir)
    if isinstance(opened, BucketSource):
        opened.cache = opened.cache / f"rank{rank}"
    fn = None
    if transform is not None:
        from trainer.imports import load_callable

        fn = load_callable(transform, "data_args.transform")
    wanted = list(columns or []) + [c for c in (shapes or {}) if c not in (columns or [])]

    def split(name: str, key: str) -> ShardedDataset:
        shards = read_shards(opened, name, wanted, key)
        return ShardedDataset(opened, shards, columns, dict(shapes or {}), fn, window_mb, mix_shards)

    return split(train, "data_args.train"), None if eval is None else split(eval, "data_args.eval")


if __name__ == "__main__":
    import sys

    from trainer.shard_writer import main

    sys.exit(main())
