"""Training-thread stall per checkpoint with the bucket mirror on, and the background upload's time.

Run on demand (not a test): ``python bench/checkpoint_upload_bench.py [--sizes-mb 8 1024] [--repeats 2]``.
Starts the sandbox's storage emulator (forja_sandbox.storage_emulator, a subprocess on this machine)
and, per state size, saves checkpoints as the trainer's ``save_checkpoint`` does: the local atomic
write (``CheckpointManager.save``) then the hand-over to the mirror (``CheckpointMirror.submit``).
Columns:

- ``write s``: the local atomic write (torch.save, checksum, fsync, rename): there with or without a bucket;
- ``mirror stall ms``: what mirroring adds to the training thread (the hand-over): the stall for the upload;
- ``upload s`` / ``MB/s``: the background upload, promotion and marker included (to the emulator);
- ``steps/s busy``: a stand-in training loop (small matmuls) run while the upload goes, against the
  same loop idle: the upload shares the CPU, it never stops the loop.

Goal (issue 15): the stall for an upload under 1 s for a 1 GB state.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from forja_sandbox.storage_emulator import StorageEmulator  # noqa: E402
from trainer.checkpoint import CheckpointManager  # noqa: E402
from trainer.mirror import CheckpointMirror  # noqa: E402

LOOP = torch.ones(128, 128)


def loop_rate(
    until: float | None = None, seconds: float = 1.0, mirror: CheckpointMirror | None = None
) -> float:
    """Stand-in training steps per second: for ``seconds``, or while ``mirror`` is busy."""
    start, steps = time.perf_counter(), 0
    while True:
        torch.mm(LOOP, LOOP)
        steps += 1
        elapsed = time.perf_counter() - start
        if mirror is not None and mirror.idle():
            break
        if mirror is None and elapsed >= seconds:
            break
    return steps / max(elapsed, 1e-9)


def bench_size(folder: Path, size_mb: int, repeats: int, url: str) -> dict[str, float]:
    ckpts = CheckpointManager(folder / f"ckpt-{size_mb}", keep=2)
    mirror = CheckpointMirror(url, f"bench-{size_mb}mb", keep=2)
    weights = torch.randn(size_mb * (1 << 20) // 4)
    writes, stalls, uploads, rates = [], [], [], []
    loop_rate(seconds=0.5)  # warm-up
    for step in range(1, repeats + 1):
        weights[0] = step
        idle = loop_rate(seconds=1.0)
        began = time.perf_counter()
        path = ckpts.save({"step": step, "model": {"w": weights}}, step)
        written = time.perf_counter()
        mirror.submit(path, step)
        handed = time.perf_counter()
        rates.append(loop_rate(mirror=mirror) / idle)
        mirror.wait()
        writes.append(written - began)
        stalls.append(handed - written)
        assert mirror.stats.uploaded[-1] == step, mirror.stats
        uploads.append(mirror.stats.last_upload_s or 0.0)
    mirror.close(0)
    size = path.stat().st_size / 1e6
    upload = statistics.median(uploads)
    return {
        "mb": size,
        "write": statistics.median(writes),
        "stall_ms": max(stalls) * 1000,
        "upload": upload,
        "mbs": size / max(upload, 1e-9),
        "busy": statistics.median(rates),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[8, 1024])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="upload-bench-") as tmp:
        folder = Path(tmp)
        with StorageEmulator(data_dir=folder / "gcs") as store:
            os.environ["STORAGE_EMULATOR_HOST"] = store.url
            from google.cloud import storage

            storage.Client().create_bucket("bench")
            rows = [bench_size(folder, size, args.repeats, "gs://bench/runs") for size in args.sizes_mb]
    print(f"checkpoint upload to the storage emulator, {os.cpu_count()} CPUs, median of {args.repeats}")
    header = ("state MB", 9), ("write s", 8), ("mirror stall ms", 16), ("upload s", 9), ("MB/s", 7)
    print(" ".join(f"{name:>{width}}" for name, width in header), f"{'steps/s busy':>13}")
    for row in rows:
        print(
            f"{row['mb']:>9.0f} {row['write']:>8.2f} {row['stall_ms']:>16.2f} {row['upload']:>9.2f} "
            f"{row['mbs']:>7.0f} {row['busy']:>12.0%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
