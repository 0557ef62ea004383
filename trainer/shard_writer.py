"""Write the Parquet shards trainer.shards reads: `python -m trainer.shards write` or write_shards().

Why these defaults: shards of about 1 GB decoded (the unit a bucket streams, downloads and
deletes), row groups of about 32 MB (the unit read at once: small enough for a window of
``window_mb`` to span several, so neighbouring samples come from several row groups) and
Zstandard level 3 on every column (bench/shards_bench.py: real pixels shrink several-fold and
read about as fast as uncompressed ones; incompressible data costs nothing but the check).
Each file is written under a temporary name and renamed when complete, so a folder never holds
half a shard that looks whole.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainer.shard_format import SUFFIX, TENSOR_DTYPE, TENSOR_SHAPE

Rows = pa.Table | pa.RecordBatch | Mapping[str, Any]


def table_from_arrays(columns: Mapping[str, Any]) -> pa.Table:
    """Numpy arrays (first axis: samples) as a table. A sample that is itself an array (an image, a
    token block) is stored as raw bytes, ``fixed_size_binary``, with its dtype and shape in the
    field's metadata (:data:`trainer.shard_format.TENSOR_DTYPE`): Parquet stores a list column with two
    16-bit levels per value, which for uint8 pixels measured 4x the data in memory when read."""
    fields, arrays = [], []
    for name, value in columns.items():
        array = np.ascontiguousarray(np.asarray(value))
        if array.ndim <= 1:
            arrays.append(pa.array(array))
            fields.append(pa.field(name, arrays[-1].type))
            continue
        width = array[0].nbytes if len(array) else int(np.prod(array.shape[1:])) * array.itemsize
        kind = pa.binary(width)
        arrays.append(pa.FixedSizeBinaryArray.from_buffers(kind, len(array), [None, pa.py_buffer(array)]))
        meta = {TENSOR_DTYPE: array.dtype.str, TENSOR_SHAPE: json.dumps(list(array.shape[1:]))}
        fields.append(pa.field(name, kind, nullable=False, metadata=meta))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


class ShardWriter:
    """Appends rows to ``out/split/shard-NNNNNN.parquet`` files, starting a new one every ``shard_mb``."""

    def __init__(
        self,
        out: str | os.PathLike[str],
        split: str = "train",
        shard_mb: float = 1024.0,
        row_group_mb: float = 32.0,
        compression: str = "zstd",
        level: int | None = 3,
    ) -> None:
        self.folder = Path(out) / split
        self.folder.mkdir(parents=True, exist_ok=True)
        self.shard_bytes, self.group_bytes = shard_mb * 2**20, row_group_mb * 2**20
        self.compression = None if compression == "none" else compression
        self.level = level if self.compression else None
        self.written: list[Path] = []
        self._pending: list[pa.Table] = []
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None
        self._in_shard = 0.0

    def write(self, rows: Rows) -> None:
        table = (
            rows
            if isinstance(rows, pa.Table)
            else (
                pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else table_from_arrays(rows)
            )
        )
        self._pending.append(table)
        while sum(t.nbytes for t in self._pending) >= self.group_bytes:
            self._flush_group()

    def _flush_group(self, everything: bool = False) -> None:
        pending = pa.concat_tables(self._pending) if self._pending else None
        self._pending = []
        if pending is None or pending.num_rows == 0:
            return
        per_row = max(1.0, pending.nbytes / pending.num_rows)
        rows = len(pending) if everything else max(1, min(len(pending), int(self.group_bytes // per_row)))
        group, rest = pending.slice(0, rows), pending.slice(rows)
        if self._writer is None:
            self._tmp = self.folder / f".shard-{len(self.written):06d}{SUFFIX}.tmp"
            small = [f.name for f in group.schema if not pa.types.is_fixed_size_binary(f.type)]
            self._writer = pq.ParquetWriter(
                self._tmp,
                group.schema,
                compression=self.compression or "none",
                compression_level=self.level,
                use_dictionary=small,  # a dictionary of unique tensors only costs a failed try
                store_schema=True,  # the fields' metadata (a tensor's dtype and shape) travel along
            )
        self._writer.write_table(group, row_group_size=len(group))
        self._in_shard += group.nbytes
        if self._in_shard >= self.shard_bytes:
            self._close_shard()
        if rest.num_rows:
            self._pending = [rest]

    def _close_shard(self) -> None:
        if self._writer is None or self._tmp is None:
            return
        self._writer.close()
        final = self.folder / f"shard-{len(self.written):06d}{SUFFIX}"
        os.replace(self._tmp, final)
        self.written.append(final)
        self._writer, self._tmp, self._in_shard = None, None, 0.0

    def close(self) -> list[Path]:
        """Flush what is pending and finish the last shard; the shards written, in order."""
        while self._pending:
            self._flush_group(everything=sum(t.nbytes for t in self._pending) < self.group_bytes)
        self._close_shard()
        return self.written

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        elif self._writer is not None and self._tmp is not None:  # a failed write leaves no shard
            self._writer.close()
            self._tmp.unlink(missing_ok=True)


def write_shards(
    rows: Iterable[Rows], out: str | os.PathLike[str], split: str = "train", **options: Any
) -> list[Path]:
    """Write an iterable of tables / record batches / dicts of arrays as shards; the files written."""
    with ShardWriter(out, split, **options) as writer:
        for chunk in rows:
            writer.write(chunk)
    return writer.written


def demo_columns(name: str) -> dict[str, dict[str, np.ndarray]]:
    """A built-in demo dataset as columns: image (flattened floats), label, id; train and eval splits."""
    from trainer import demo

    loaded = {"digits": demo.digits, "mnist": demo.mnist}[name]()
    splits, first = {}, 0
    for split, part in zip(("train", "eval"), loaded, strict=True):
        x, y = part.tensors
        ids = np.arange(first, first + len(y), dtype=np.int64)
        first += len(y)
        splits[split] = {"image": x.numpy().reshape(len(y), -1), "label": y.numpy(), "id": ids}
    return splits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.shards", description="Write Parquet shards for data: trainer.shards:dataset."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="write shards from a demo dataset or a .npz file")
    write.add_argument("out", help="dataset folder (shards go to OUT/SPLIT/shard-NNNNNN.parquet)")
    source = write.add_mutually_exclusive_group(required=True)
    source.add_argument("--demo", choices=["digits", "mnist"], help="a built-in dataset: train and eval")
    source.add_argument("--npz", help="a .npz file: each array one column, first axis the samples")
    write.add_argument("--split", default="train", help="split folder for --npz (default: train)")
    write.add_argument("--shard-mb", type=float, default=1024.0, help="decoded MB per shard (1024)")
    write.add_argument("--row-group-mb", type=float, default=32.0, help="decoded MB per row group (32)")
    write.add_argument("--compression", default="zstd", choices=["zstd", "none", "snappy", "lz4"])
    write.add_argument("--level", type=int, default=3, help="zstd level (3)")
    args = parser.parse_args(argv)
    options = {
        "shard_mb": args.shard_mb,
        "row_group_mb": args.row_group_mb,
        "compression": args.compression,
        "level": args.level,
    }
    if args.demo:
        splits = demo_columns(args.demo)
    else:
        with np.load(args.npz) as arrays:
            splits = {args.split: {k: arrays[k] for k in arrays.files}}
    for split, columns in splits.items():
        files = write_shards([columns], args.out, split, **options)
        rows = sum(pq.read_metadata(f).num_rows for f in files)
        print(f"{split}: {rows} rows in {len(files)} shard(s) under {Path(args.out) / split}")
    return 0
