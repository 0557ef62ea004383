"""`forja train --delete-data-after`: the run's dataset leaves the VM only after a run that completed
and exported its model, never after a failure (trainer/data_cleanup.py, run by forja-train-launch).

The rule as a table (`decide`), then the real launcher run locally, as systemd runs it on the VM
(tests/training/test_launcher_hooks.py does the same for hooks), then its `--cleanup-data`, as the
unit's ExecStopPost runs it with systemd's EXIT_STATUS: a run that exports a model and exits 0 takes
its staged dataset with it. The bucket copy goes too, but not the blobs another dataset shares
(Google's client against the sandbox's Cloud Storage emulator). The launcher also notes the run's
Python packages at its start (the run's snapshot, forja/snapshot.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from trainer_helpers import launcher_env

from trainer import run_folder
from trainer.data_cleanup import decide, delete_bucket_copy
from trainer.export import WEIGHTS

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "roles" / "trainer_run" / "files" / "forja-train-launch"


def run_dir(tmp_path: Path, *, completed: bool, model: bool) -> Path:
    out = tmp_path / "out"
    (out / run_folder.MODEL_DIR).mkdir(parents=True)
    if completed:
        (out / run_folder.COMPLETED_MARKER).touch()
    if model:
        (out / run_folder.MODEL_DIR / WEIGHTS).write_bytes(b"w")
    return out


@pytest.mark.parametrize(("rc", "completed", "model", "staged", "rank", "disk", "bucket", "why"), [
    (0, True, True, "data/digits", 0, True, True, "exported its model"),
    (1, False, True, "data/digits", 0, False, False, "did not complete (exit 1)"),
    (3, False, False, "data/digits", 0, False, False, "kept for a resume"),  # preempted after a save
    (0, True, False, "data/digits", 0, False, False, "exported no model"),
    (0, True, True, "elsewhere/digits", 0, False, True, "not inside the data folder"),
    (0, True, True, "data", 0, False, True, "not inside the data folder"),  # the data folder itself
    (0, True, True, "data/digits", 1, True, False, "node 0 removes the bucket copy"),
])
def test_data_goes_only_after_a_completed_run_with_its_model(
    tmp_path: Path, rc: int, completed: bool, model: bool, staged: str, rank: int, disk: bool,
    bucket: bool, why: str,
) -> None:
    (tmp_path / "data" / "digits").mkdir(parents=True)
    (tmp_path / "elsewhere" / "digits").mkdir(parents=True)
    on_disk, in_bucket = decide(rc, run_dir(tmp_path, completed=completed, model=model),
                                str(tmp_path / staged), str(tmp_path / "data"), rank, "gs://b/datasets/digits")
    assert (on_disk.delete, in_bucket.delete) == (disk, bucket)
    assert why in on_disk.why + " " + in_bucket.why


#: A run that exports a model (as trainer.export does at the end) and exits with FORJA_TEST_RC.
RUN = """
import os, sys
out = os.environ["FORJA_RUN_DIR"]
os.makedirs(os.path.join(out, "model"), exist_ok=True)
open(os.path.join(out, "model", "model.safetensors"), "wb").write(b"w")
sys.exit(int(os.environ["FORJA_TEST_RC"]))
"""


@pytest.mark.skipif(shutil.which("flock") is None, reason="the launcher needs flock")
def test_the_launcher_removes_the_staged_dataset_after_a_completed_run(tmp_path: Path) -> None:
    """One launcher run (a failed one's rc reaches `decide` the same way; the table covers it)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "run.py").write_text(RUN)
    staged = tmp_path / "data" / "digits"
    staged.mkdir(parents=True)
    (staged / "train.parquet").write_bytes(b"PAR1")
    env = launcher_env(tmp_path, "cleaned", {"command": ["run.py"]}, project, FORJA_TEST_RC="0",
                       FORJA_DELETE_DATA=str(staged), FORJA_DELETE_BUCKET_COPY="",
                       FORJA_DATA_DIR=str(tmp_path / "data"))
    done = subprocess.run(["bash", str(LAUNCHER)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert staged.exists()  # the run's own user cannot remove root's data: systemd's ExecStopPost does
    done = subprocess.run(["bash", str(LAUNCHER), "--cleanup-data"], env={**env, "EXIT_STATUS": "0"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not staged.exists() and staged.parent.is_dir()
    said = f"forja: dataset on disk: the run completed and exported its model: removing {staged}"
    assert said in done.stdout
    packages = json.loads((tmp_path / "out" / run_folder.PACKAGES).read_text())
    assert packages["packages"]["PyYAML"]  # the run's Python, listed at its start


def test_the_bucket_copy_goes_but_the_blobs_another_dataset_names_stay(bucket: Any) -> None:
    """Blobs are content-addressed and shared (forja data push): removing one dataset's copy keeps
    every blob another dataset's manifest still names (Google's client against the emulator)."""

    def manifest(name: str, shas: list[str]) -> None:
        files = [{"path": f"f{i}", "size": 1, "sha256": sha, "crc32c": ""} for i, sha in enumerate(shas)]
        bucket.blob(f"datasets/{name}/manifest.json").upload_from_string(json.dumps({"files": files}))
        for sha in shas:
            bucket.blob(f"datasets/blobs/{sha}").upload_from_string(b"x")

    manifest("digits", ["a" * 64, "b" * 64])
    manifest("other", ["b" * 64])
    said = delete_bucket_copy(f"gs://{bucket.name}/datasets/digits")
    left = sorted(b.name for b in bucket.list_blobs())
    assert left == ["datasets/blobs/" + "b" * 64, "datasets/other/manifest.json"]
    assert "1 blobs; 1 shared with other datasets kept" in said
