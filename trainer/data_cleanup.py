"""`forja train --delete-data-after`: remove a run's dataset from the VM (and the bucket) once it is done.

Run on the host after the run's unit stopped (its ExecStopPost, as root, since a staged dataset is
root's: `forja-train-launch --cleanup-data`) when its env file names a dataset (FORJA_DELETE_DATA: the
staged folder; FORJA_DELETE_BUCKET_COPY: gs://BUCKET/datasets/NAME when the user asked for the bucket
copy too), so it happens even when the laptop that sent the run sleeps. `python -m
trainer.data_cleanup STATUS` with systemd's EXIT_STATUS (a number, or a signal's name).

Why the rule is strict (`decide`): data is deleted only after a run that completed (exit 0 and the
launcher's COMPLETED marker) and whose model was exported (model/ holds the weights). A failed,
stopped or preempted run keeps its data, since it will be resumed or sent again.

The staged folder is removed only when it lies inside the host's data folder (FORJA_DATA_DIR, the
host contract's data_dir), so a config's odd path can never turn this into a deletion elsewhere. The
bucket copy is the dataset's manifest and the content-addressed blobs no other dataset's manifest
names (blobs are shared between datasets that hold the same file). Standard library, plus
google-cloud-storage (the trainer's own dependency) for the bucket copy.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from trainer import run_folder
from trainer.export import WEIGHTS

#: The env file's settings (roles/trainer_run/templates/run.env.j2).
ENV_DATA = "FORJA_DELETE_DATA"
ENV_BUCKET = "FORJA_DELETE_BUCKET_COPY"
ENV_DATA_DIR = "FORJA_DATA_DIR"
#: The bucket layout of `forja data push` (plugins/module_utils/forja_dataset.py).
BLOBS = "datasets/blobs/"


@dataclass(frozen=True)
class Decision:
    """Whether to delete, and why (one line for the journal)."""

    delete: bool
    why: str


def decide(rc: int, run_dir: Path, staged: str, data_dir: str, node_rank: int = 0,
           bucket_copy: str = "") -> tuple[Decision, Decision]:
    """(the staged folder, the bucket copy): delete each or not, and why. Pure but for reading run_dir."""
    if rc != 0 or not (run_dir / run_folder.COMPLETED_MARKER).exists():
        keep = f"the run did not complete (exit {rc}): its data is kept for a resume"
        return Decision(False, keep), Decision(False, keep)
    if not (run_dir / run_folder.MODEL_DIR / WEIGHTS).is_file():
        keep = "the run completed but exported no model: its data is kept"
        return Decision(False, keep), Decision(False, keep)
    base = os.path.realpath(data_dir) if data_dir else ""
    target = os.path.realpath(staged) if staged else ""
    if not staged:
        disk = Decision(False, "no staged dataset named")
    elif not base or os.path.commonpath([base, target]) != base or target == base:
        disk = Decision(False, f"{staged} is not inside the data folder {data_dir or '(unset)'}: not deleted")
    elif not os.path.isdir(target):
        disk = Decision(False, f"{staged} is not on this host's disk (already removed?)")
    else:
        disk = Decision(True, f"the run completed and exported its model: removing {staged}")
    if not bucket_copy:
        bucket = Decision(False, "the bucket copy was not asked for")
    elif node_rank != 0:
        bucket = Decision(False, "node 0 removes the bucket copy")
    else:
        bucket = Decision(True, f"the run completed and exported its model: removing {bucket_copy}")
    return disk, bucket


def delete_bucket_copy(url: str) -> str:
    """Delete gs://BUCKET/datasets/NAME's manifest and the blobs no other manifest names; say what went."""
    from trainer.gcs import storage_client

    bucket_name, _, prefix = url.removeprefix("gs://").partition("/")
    name = prefix.removeprefix("datasets/").strip("/")
    bucket = storage_client().bucket(bucket_name)
    manifest = bucket.blob(f"datasets/{name}/manifest.json")
    mine = {f["sha256"] for f in json.loads(manifest.download_as_bytes())["files"]}
    others: set[str] = set()
    for blob in bucket.list_blobs(prefix="datasets/"):
        if blob.name.endswith("/manifest.json") and blob.name != manifest.name:
            others |= {f["sha256"] for f in json.loads(blob.download_as_bytes()).get("files", [])}
    manifest.delete()  # first: a dataset without its manifest is no longer "complete" for anyone
    gone = mine - others
    for sha in sorted(gone):
        blob = bucket.blob(f"{BLOBS}{sha}")
        if blob.exists():
            blob.delete()
    shared = len(mine - gone)
    return f"removed {url} (its manifest and {len(gone)} blobs; {shared} shared with other datasets kept)"


def main(argv: list[str]) -> int:
    """Decide and delete; never fails the run (its exit status is the launcher's, not this one's)."""
    # systemd's EXIT_STATUS: a number, or a signal's name (TERM, KILL) when the run was killed
    rc = int(argv[0]) if argv and argv[0].isdigit() else 1
    run_dir = Path(os.environ.get("FORJA_OUT", "."))
    disk, bucket = decide(rc, run_dir, os.environ.get(ENV_DATA, ""), os.environ.get(ENV_DATA_DIR, ""),
                          int(os.environ.get("FORJA_NODE_RANK", "0") or 0), os.environ.get(ENV_BUCKET, ""))
    print(f"forja: dataset on disk: {disk.why}", flush=True)
    if disk.delete:
        shutil.rmtree(os.environ[ENV_DATA], ignore_errors=True)
    if os.environ.get(ENV_BUCKET):
        print(f"forja: dataset in the bucket: {bucket.why}", flush=True)
    if bucket.delete:
        try:
            print(f"forja: {delete_bucket_copy(os.environ[ENV_BUCKET])}", flush=True)
        except Exception as exc:  # said, never failing the completed run
            print(f"forja: the bucket copy {os.environ[ENV_BUCKET]} was not removed: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
