"""`forja data push` throughput, and what a second push sends after one file changes.

Run on demand (not a test): ``python bench/data_push_bench.py [--size-gb 2] [--threads 8]``.
Generates a dataset (many small files and a few large ones, random bytes so nothing compresses),
pushes it with `Forja.push_data` to the sandbox's Cloud Storage emulator when the sandbox is up
(``forja sandbox up``), else to one it starts (forja_sandbox.storage_emulator, a subprocess on this
machine), into a bucket of its own that it empties afterwards. Then one small file changes and the
dataset is pushed again. Columns:

- ``hash s``: reading every file for its SHA-256 and CRC32C (each push does it);
- ``send s`` / ``MiB/s``: the uploads (bytes sent / seconds from the first upload to the manifest);
- ``total s``: the whole push, access check and manifest included;
- ``sent``: distinct contents sent and their bytes (the second push must send the changed file only).

The emulator is one Python process on this machine serving one request at a time; GCS from a VM
is another matter (parallel uploads are what count there). Issue 16: the second push sends only
the changed file.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from forja import datasets  # noqa: E402
from forja.api import Forja  # noqa: E402
from forja_sandbox import service  # noqa: E402
from forja_sandbox.storage_emulator import StorageEmulator  # noqa: E402

MiB = 1024 * 1024


def generate(root: Path, size_gb: float) -> tuple[int, int]:
    """A quarter of the bytes in small files (256 KiB), the rest in four large ones: (files, bytes)."""
    total = int(size_gb * 1024 * MiB)
    small_bytes = total // 4
    small = max(1, small_bytes // (256 * 1024))
    large = (total - small * 256 * 1024) // 4
    block = os.urandom(4 * MiB)
    count = 0
    for i in range(small):
        path = root / "train" / f"{i // 500:03d}" / f"sample-{i:06d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(i.to_bytes(8, "little") + os.urandom(256 * 1024 - 8))
        count += 1
    for i in range(4):
        with (root / f"shard-{i}.bin").open("wb") as fh:
            left = large
            fh.write(i.to_bytes(8, "little"))
            left -= 8
            while left > 0:
                fh.write(block[: min(left, len(block))])
                left -= len(block)
        count += 1
    return count, sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def sandbox_storage() -> str | None:
    """The running sandbox's storage endpoint, or None when it is not up."""
    url = service.storage_url()
    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b?project={service.PROJECT}", timeout=2) as resp:
            return url if resp.status == 200 else None
    except OSError:
        return None


def timed_push(forja: Forja, root: Path, bucket: str, threads: int) -> dict[str, Any]:
    marks: dict[str, float] = {}

    def on_progress(p: Any) -> None:
        marks.setdefault(p.phase, time.monotonic())

    start = time.monotonic()
    result = forja.push_data(root, name="bench", bucket=f"gs://{bucket}", threads=threads,
                             on_progress=on_progress)
    end = time.monotonic()
    sent_from = marks.get("upload", marks.get("manifest", end))
    send_s = marks.get("manifest", end) - sent_from
    hashed = sent_from - marks.get("hash", start)
    return {"result": result, "total": end - start, "hash": hashed, "send": send_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--dir", type=Path, default=None, help="where to generate (default: a temp folder)")
    parser.add_argument("--private", action="store_true",
                        help="start an emulator of its own even when the sandbox is up")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="forja-data-bench-", dir=args.dir) as tmp:
        root = Path(tmp) / "dataset"
        t0 = time.monotonic()
        files, size = generate(root, args.size_gb)
        print(f"generated {files} files, {size / MiB:.0f} MiB in {time.monotonic() - t0:.1f} s")
        url = None if args.private else sandbox_storage()
        own = None if url else StorageEmulator(data_dir=Path(tmp) / "gcs").start()
        url = url or own.url  # type: ignore[union-attr]
        print(f"storage: {url} ({'the sandbox' if own is None else 'started for this bench'})")
        os.environ["STORAGE_EMULATOR_HOST"] = url
        os.environ.pop("FORJA_INVENTORY", None)
        bucket = f"forja-bench-{uuid.uuid4().hex[:10]}"
        client = datasets.dataset_module().make_client(service.PROJECT, url)
        gcs = client.create_bucket(bucket)
        try:
            forja = Forja(inventory=None)
            rows = [("first push", timed_push(forja, root, bucket, args.threads))]
            changed = next((root / "train" / "000").iterdir())
            changed.write_bytes(b"changed " + changed.read_bytes()[8:])
            changed_bytes = changed.stat().st_size
            rows.append(("one file changed", timed_push(forja, root, bucket, args.threads)))
            rows.append(("nothing changed", timed_push(forja, root, bucket, args.threads)))
        finally:
            if own is None:  # the sandbox's store: leave it as it was (an own one goes with its folder)
                for blob in client.list_blobs(gcs):
                    blob.delete()
                gcs.delete()
            else:
                own.stop()

    print(f"\n{'push':<18} {'files':>6} {'sent':>22} {'hash s':>7} {'send s':>7} {'MiB/s':>7} {'total s':>8}")
    for label, row in rows:
        r = row["result"]
        rate = r.uploaded_bytes / MiB / row["send"] if row["send"] > 0 and r.uploaded_bytes else 0.0
        sent = f"{r.uploaded_files} ({r.uploaded_bytes / MiB:,.1f} MiB)"
        print(f"{label:<18} {r.files:>6} {sent:>22} {row['hash']:>7.1f} {row['send']:>7.1f} {rate:>7.1f} "
              f"{row['total']:>8.1f}")
    second = rows[1][1]["result"]
    ok = second.uploaded_files == 1 and second.uploaded_bytes == changed_bytes
    print(f"\nsecond push sent only the changed file: {'yes' if ok else 'NO'} "
          f"({second.uploaded_files} file, {second.uploaded_bytes} bytes)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
