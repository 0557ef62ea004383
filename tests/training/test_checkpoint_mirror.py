"""Checkpoints mirrored to a bucket (trainer.mirror): atomic, verified, and never in training's way.

Against the sandbox's real storage emulator (a subprocess a test can kill), reached by Google's own
client through STORAGE_EMULATOR_HOST, as on a VM it would reach Cloud Storage.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import REPO, objects, subprocess_env, tiny_digits

from forja_sandbox.storage_emulator import StorageEmulator
from trainer import run_folder, runlib
from trainer.checkpoint import CheckpointManager, atomic_save, footer_digest
from trainer.config import ConfigError, validate
from trainer.mirror import MARKER_SUFFIX, PARTIAL, CheckpointMirror, Marker
from trainer.train import train

storage = pytest.importorskip("google.cloud.storage")


def events(run: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run / run_folder.EVENTS).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def tensors_equal(a: Any, b: Any) -> bool:
    """Nested dicts/lists of tensors and plain values, equal bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(tensors_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_a_run_mirrors_every_checkpoint_with_a_marker_that_carries_its_checksum(
    tmp_path: Path, bucket: Any
) -> None:
    raw = tiny_digits(
        tmp_path, steps=30, checkpoint_every_steps=10, checkpoint_bucket=f"gs://{bucket.name}/exp"
    )
    result = train(validate(raw))
    assert result.status == "completed"
    local = tmp_path / "run" / run_folder.CHECKPOINTS_DIR
    stored = objects(bucket, "exp/run/checkpoints/")
    markers = {name: json.loads(data) for name, data in stored.items() if name.endswith(MARKER_SUFFIX)}
    # Uploads faster than checkpoints: each is in the bucket. Slower: a waiting one gives way to the
    # newer (queue depth 1), so the last one is always there, and each saved step is accounted for.
    [mirrored] = events(tmp_path / "run", "mirror")
    assert mirrored["complete"] is True and mirrored["uploaded_steps"][-1] == 30
    assert sorted(mirrored["uploaded_steps"] + mirrored["superseded_steps"]) == [10, 20, 30]
    assert sorted(m["step"] for m in markers.values()) == mirrored["uploaded_steps"]
    for name, marker in markers.items():
        data_name = name.removesuffix(MARKER_SUFFIX)
        assert stored[data_name] == (local / f"ckpt-{marker['step']}.pt").read_bytes()
        assert marker["sha256"] == footer_digest(local / f"ckpt-{marker['step']}.pt")
        assert marker["size"] == len(stored[data_name])
    assert not [name for name in stored if PARTIAL in name]


def test_resume_from_the_bucket_with_the_disk_wiped_equals_the_local_resume(
    tmp_path: Path, bucket: Any
) -> None:
    url = f"gs://{bucket.name}/exp"
    first = tiny_digits(tmp_path, steps=20, checkpoint_every_steps=10, checkpoint_bucket=url)
    train(validate(first))
    shutil.copytree(tmp_path / "run", tmp_path / "local")  # the same run, resumed from its own disk
    shutil.rmtree(tmp_path / "run" / run_folder.CHECKPOINTS_DIR)  # a new VM: only the bucket has them

    train(validate({**first, "steps": 30, "checkpoint_bucket": url}))
    train(validate({**first, "steps": 30, "checkpoint_bucket": None, "out_dir": str(tmp_path / "local")}))

    for run in ("run", "local"):
        [resumed] = events(tmp_path / run, "resume")
        assert resumed["resumed_from_step"] == 20
    from_bucket = CheckpointManager(tmp_path / "run" / run_folder.CHECKPOINTS_DIR).load_latest()
    from_disk = CheckpointManager(tmp_path / "local" / run_folder.CHECKPOINTS_DIR).load_latest()
    assert from_bucket is not None and from_disk is not None
    assert from_bucket.state["step"] == from_disk.state["step"] == 30
    for key in ("model", "optimizer", "scheduler", "rng"):
        assert tensors_equal(from_bucket.state[key], from_disk.state[key]), key


def test_the_mirrors_uploads_leave_the_runs_python_random_state_alone(tmp_path: Path, bucket: Any) -> None:
    """The client draws each multipart boundary from a generator: never the run's own, or the state a
    checkpoint saves would depend on when the network let an upload through (trainer/gcs.py)."""
    ckpts = CheckpointManager(tmp_path / "ckpts")
    mirror = CheckpointMirror(f"gs://{bucket.name}/exp", "run", run_dir=tmp_path)
    (tmp_path / run_folder.EVENTS).write_text('{"event": "start"}\n')
    assert mirror.restore_logs() == []  # this disk's logs are the run's: they go up from now on
    random.seed(7)
    before = random.getstate()
    for step in (1, 2, 3):  # each: the checkpoint, its marker and the logs, from the mirror's thread
        mirror.submit(ckpts.save({"step": step, "model": {"w": torch.arange(64.0)}}, step), step)
        assert mirror.wait(60)
    (tmp_path / run_folder.EVENTS).write_text('{"event": "start"}\n{"event": "end"}\n')
    assert mirror.upload_logs()  # and from this thread
    assert mirror.close(60)
    assert len(objects(bucket, "exp/run/checkpoints/")) >= 2 and objects(bucket, "exp/run/logs/")
    assert random.getstate() == before


def test_an_object_without_a_valid_marker_is_never_taken(tmp_path: Path, bucket: Any) -> None:
    url = f"gs://{bucket.name}/exp"
    ckpts = CheckpointManager(tmp_path / "writer", keep=5)
    mirror = CheckpointMirror(url, "run", keep=5)
    mirror.submit(ckpts.save({"step": 5, "model": {"w": torch.arange(1000.0)}}, 5), 5)
    assert mirror.close(60)
    # Newer objects that must not count: a whole checkpoint with no marker, a partial upload, and a
    # marker whose object was cut short (its size and digest no longer match).
    newer = tmp_path / "newer.pt"
    digest = atomic_save({"step": 9, "model": {"w": torch.zeros(1000)}}, newer)
    data = newer.read_bytes()
    prefix = "exp/run/checkpoints/"
    bucket.blob(f"{prefix}ckpt-9.pt").upload_from_string(data)
    bucket.blob(f"{prefix}{PARTIAL}ckpt-12.pt.abc").upload_from_string(data)
    cut = bucket.blob(f"{prefix}ckpt-8.pt")
    cut.upload_from_string(data[: len(data) // 2])
    marker = Marker(8, cut.name, len(data), digest, int(cut.generation))
    bucket.blob(cut.name + MARKER_SUFFIX).upload_from_string(marker.to_json())

    fresh = CheckpointManager(tmp_path / "fresh")
    pulled = CheckpointMirror(url, "run").sync_at_start(fresh)
    assert pulled == fresh.path_for(5)
    assert [p.name for p in fresh.list()] == ["ckpt-5.pt"]
    found = fresh.load_for_resume()
    assert found is not None and found.state["step"] == 5


def test_a_damaged_checkpoint_on_disk_is_replaced_by_the_buckets_verified_copy(
    tmp_path: Path, bucket: Any
) -> None:
    url = f"gs://{bucket.name}/exp"
    ckpts = CheckpointManager(tmp_path / "ckpts")
    mirror = CheckpointMirror(url, "run")
    path = ckpts.save({"step": 3, "model": {"w": torch.arange(4096.0)}}, 3)
    mirror.submit(path, 3)
    assert mirror.close(60)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x10  # a bit flipped on the disk after the upload
    path.write_bytes(bytes(data))

    assert CheckpointMirror(url, "run").sync_at_start(ckpts) == path
    assert [p.name for p in ckpts.corrupt()] == ["ckpt-3.pt.corrupt"]  # kept for a person to look at
    found = ckpts.load_for_resume()
    assert found is not None and torch.equal(found.state["model"]["w"], torch.arange(4096.0))


def test_a_newer_checkpoint_on_disk_is_kept_and_uploaded_at_start(tmp_path: Path, bucket: Any) -> None:
    """A session killed before its upload finished: the disk's newer checkpoint wins and goes up."""
    url = f"gs://{bucket.name}/exp"
    ckpts = CheckpointManager(tmp_path / "ckpts")
    first = CheckpointMirror(url, "run")
    first.submit(ckpts.save({"step": 1, "model": {"w": torch.ones(10)}}, 1), 1)
    assert first.close(60)
    ckpts.save({"step": 2, "model": {"w": torch.full((10,), 2.0)}}, 2)  # never uploaded

    again = CheckpointMirror(url, "run")
    assert again.sync_at_start(ckpts) is None
    assert again.close(60)
    assert [m.step for m in again.markers()] == [2, 1]


def test_a_retry_after_success_changes_nothing_and_a_new_save_of_a_step_replaces_it(
    tmp_path: Path, bucket: Any
) -> None:
    mirror = CheckpointMirror(f"gs://{bucket.name}/exp", "run")
    ckpts = CheckpointManager(tmp_path / "ckpts")
    path = ckpts.save({"step": 7, "model": {"w": torch.ones(100)}}, 7)
    first = mirror.upload(path, 7)
    again = mirror.upload(path, 7)  # as when the first attempt's answer was lost
    assert again == first and again.marker_generation != 0
    assert bucket.get_blob(first.name).generation == first.generation
    path = ckpts.save({"step": 7, "model": {"w": torch.zeros(100)}}, 7)  # a later session's step 7
    replaced = mirror.upload(path, 7)
    assert replaced.sha256 == footer_digest(path) != first.sha256
    assert [(m.step, m.sha256) for m in mirror.markers()] == [(7, replaced.sha256)]
    assert bucket.blob(replaced.name).download_as_bytes() == path.read_bytes()


def test_the_launchers_resume_point_on_a_fresh_disk_comes_from_the_bucket(
    tmp_path: Path, bucket: Any, emulator: StorageEmulator
) -> None:
    url = f"gs://{bucket.name}/exp"
    writer = CheckpointMirror(url, "run")
    writer.submit(CheckpointManager(tmp_path / "old-vm").save({"step": 4, "model": {}}, 4), 4)
    assert writer.close(60)
    fresh = tmp_path / "new-vm"
    env = subprocess_env(FORJA_CHECKPOINT_BUCKET=url, FORJA_RUN="run", STORAGE_EMULATOR_HOST=emulator.url)
    done = subprocess.run(
        [sys.executable, "-m", "trainer.runlib", "resume-point", str(fresh)],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(fresh / "ckpt-4.pt")


def test_a_bad_bucket_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"checkpoint_bucket: .*gs://BUCKET"):
        validate(tiny_digits(tmp_path, checkpoint_bucket="s3://somewhere"))
    with pytest.raises(ConfigError, match="checkpoint_bucket: 'My_Bucket' is not a Cloud Storage bucket"):
        validate(tiny_digits(tmp_path, checkpoint_bucket="gs://My_Bucket/x"))


def test_the_trainer_imports_no_google_client_without_a_bucket(tmp_path: Path) -> None:
    code = (
        "import sys; from trainer.config import validate; from trainer.train import train; "
        "import trainer.runlib; "
        f"train(validate({tiny_digits(tmp_path, steps=3)!r})); "
        # `google.cloud.`: the bare namespace package may be there from the start (an nspkg.pth of
        # google-cloud-aiplatform, the sandbox's); a client is a module below it
        "assert not [m for m in sys.modules if m.startswith('google.cloud.')], 'a client imported'"
    )
    env = subprocess_env()
    env.pop("FORJA_CHECKPOINT_BUCKET", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.timeout(120)  # a save that waited for the dead store would hang here, not pass
@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_upload_fault_the_store_killed_mid_upload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store dies mid-upload and comes back: nothing incomplete is marked, the loop never waits,
    and a later upload succeeds."""
    store = StorageEmulator(data_dir=tmp_path / "gcs").start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", store.url)
        monkeypatch.setenv("FORJA_RUN", "faulty")
        storage.Client().create_bucket("faults")
        weights = torch.randn(6 << 20)  # a 24 MiB checkpoint, sent in 256 KiB requests: ~100 of them
        killed_during: int | None = None
        steps_while_down = 0
        with runlib.Run(
            total_steps=1000, run_dir=tmp_path / "run", checkpoint_bucket="gs://faults/p", render_plots=False
        ) as run:
            mirror = run.mirror
            assert mirror is not None
            mirror.chunk_size, mirror.retry_initial_s, mirror.retry_max_s = 256 << 10, 0.1, 0.5
            step = 0
            while killed_during is None and step < 200:  # save, and kill the store mid-upload
                step += 1
                run.save({"model": {"w": weights + step}}, step)
                while not mirror.idle():  # training steps, watching the upload go
                    progress = mirror.progress
                    if progress is not None and progress[2] // 4 < progress[1] < progress[2]:
                        store.kill()
                        killed_during = progress[0]
                        break
                    time.sleep(0.002)
            assert killed_during is not None, "no upload was caught in progress"
            # The store is down: training and saving go on, while the uploads behind them fail.
            while (steps_while_down < 8 or not mirror.stats.failed_attempts) and steps_while_down < 200:
                step += 1
                steps_while_down += 1
                run.save({"model": {"w": weights + step}}, step)
            assert mirror.stats.failed_attempts >= 1
            assert not mirror.stats.uploaded or mirror.stats.uploaded[-1] < killed_during
            store.start()  # same port, same data
            step += 1
            run.save({"model": {"w": weights + step}}, step)
            last = step
        [mirrored] = events(tmp_path / "run", "mirror")
        assert mirrored["complete"] is True and mirrored["uploaded_steps"][-1] == last

        # Every marker in the bucket vouches for a whole, verified checkpoint; the newest is the last.
        reader = CheckpointMirror("gs://faults/p", "faulty")
        markers = reader.markers()
        assert markers[0].step == last
        assert killed_during in mirror.stats.superseded  # given up for a newer one, never marked
        assert killed_during not in [m.step for m in markers]
        for marker in markers:
            path = reader.fetch(marker, tmp_path / "check")
            assert torch.equal(torch.load(path, weights_only=True)["model"]["w"], weights + marker.step)
        fresh = CheckpointManager(tmp_path / "fresh")
        assert reader.sync_at_start(fresh) == fresh.path_for(last)
    finally:
        store.stop()


# -- the run's logs beside its checkpoints: the history survives a new disk ---------------------------


def signal_or_crash_at(step: int, crash: bool = False) -> Any:
    """An on_step hook: a real SIGTERM to this process once ``step`` is done, or (crash) an exception."""

    def hook(done: int) -> None:
        if done == step and crash:
            raise RuntimeError(f"crash after step {step}")
        if done == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


def bucket_logs(bucket: Any, prefix: str) -> dict[str, bytes]:
    return {name.rsplit("/", 1)[1]: data for name, data in objects(bucket, prefix).items()}


def run_logs(run: Path) -> dict[str, bytes]:
    """What the mirror uploads: the logs, and the summary once the run has written one."""
    names = [*run_folder.LOGS, *([run_folder.SUMMARY] if (run / run_folder.SUMMARY).is_file() else [])]
    return {name: (run / name).read_bytes() for name in names}


def losses(run: Path) -> list[tuple[int, float]]:
    lines = (run / run_folder.METRICS).read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


def test_a_resume_on_a_new_disk_counts_the_lost_disks_sessions_as_the_kept_disk_does(
    tmp_path: Path, bucket: Any
) -> None:
    """Preempted, then crashed, then resumed on a new disk (a zone move): the bucket's logs bring
    back the sessions the lost disk saw, so the summary says what the same resume on the old disk says."""
    url = f"gs://{bucket.name}/exp"
    raw = tiny_digits(tmp_path, steps=30, checkpoint_every_steps=10, checkpoint_bucket=url)
    run = tmp_path / "run"
    first = train(validate(raw), on_step=signal_or_crash_at(12))  # saved at 13, preempted
    assert first.status == "preempted"
    # The preempted session's last uploads carry every line it wrote, its preempt event included.
    assert bucket_logs(bucket, "exp/run/logs/") == run_logs(run)
    assert [e["event"] for e in events(run, "preempt")] == ["preempt"]
    with pytest.raises(RuntimeError, match="crash after step 24"):  # resumed at 13, saved at 20
        train(validate(raw), on_step=signal_or_crash_at(24, crash=True))
    assert bucket_logs(bucket, "exp/run/logs/") == run_logs(run)  # its fail event too

    shutil.copytree(run, tmp_path / "kept")  # the same run resumed from the disk it ran on
    shutil.rmtree(run)  # a new VM in another zone: a new boot disk, only the bucket knows the run
    moved = train(validate(raw))
    kept = train(validate({**raw, "checkpoint_bucket": None, "out_dir": str(tmp_path / "kept")}))

    assert moved.status == kept.status == "completed"
    assert moved.summary["resumed_from_step"] == kept.summary["resumed_from_step"] == 20
    # one preemption (SIGTERM, clean save), one crash: a restart, not a preemption
    assert moved.summary["preemptions"] == kept.summary["preemptions"] == 1
    assert moved.summary["restarts"] == kept.summary["restarts"] == 1
    assert moved.summary["lost_steps"] == kept.summary["lost_steps"] == 4  # steps 21-24, redone
    assert losses(run) == losses(tmp_path / "kept")
    assert [s for s, _ in losses(run)] == list(range(1, 31))
    from_bucket = CheckpointManager(run / run_folder.CHECKPOINTS_DIR).load_latest()
    from_disk = CheckpointManager(tmp_path / "kept" / run_folder.CHECKPOINTS_DIR).load_latest()
    assert from_bucket is not None and from_disk is not None
    for key in ("model", "optimizer", "scheduler", "rng"):
        assert tensors_equal(from_bucket.state[key], from_disk.state[key]), key


def test_local_logs_are_never_replaced_by_the_buckets(tmp_path: Path, bucket: Any) -> None:
    url = f"gs://{bucket.name}/exp"
    old = tmp_path / "old"
    old.mkdir()
    (old / run_folder.EVENTS).write_text('{"event":"start"}\n{"event":"preempt"}\n{"event":"resu')
    (old / run_folder.METRICS).write_text('{"step":1}\n')
    writer = CheckpointMirror(url, "run", run_dir=old)
    assert not writer.upload_logs()  # not before the start compared the folder with the bucket
    assert writer.restore_logs() == [] and writer.upload_logs()
    uploaded = bucket_logs(bucket, "exp/run/logs/")
    assert uploaded[run_folder.EVENTS] == b'{"event":"start"}\n{"event":"preempt"}\n'  # whole lines only

    kept = tmp_path / "kept"  # a disk that kept one of the two: it is still this disk's history
    kept.mkdir()
    (kept / run_folder.METRICS).write_text('{"step":9}\n')
    CheckpointMirror(url, "run", run_dir=kept).sync_at_start(
        CheckpointManager(kept / run_folder.CHECKPOINTS_DIR))
    assert [p.name for p in kept.iterdir()] == [run_folder.METRICS]
    assert (kept / run_folder.METRICS).read_text() == '{"step":9}\n'

    fresh = tmp_path / "fresh"
    CheckpointMirror(url, "run", run_dir=fresh).sync_at_start(
        CheckpointManager(fresh / run_folder.CHECKPOINTS_DIR))
    assert sorted(p.name for p in fresh.iterdir()) == sorted(run_folder.LOGS)  # no temporary file left
    assert run_logs(fresh) == uploaded


def test_a_runlib_script_resumed_on_a_new_disk_keeps_its_history(tmp_path: Path, bucket: Any) -> None:
    url = f"gs://{bucket.name}/exp"

    def session(stop_at: int | None = None, total: int = 6) -> runlib.Run:
        with runlib.Run(
            total_steps=total, run_dir=tmp_path / "run", checkpoint_bucket=url, render_plots=False
        ) as run:
            for step in range(run.start_step + 1, total + 1):
                run.log(step, loss=1.0 / step)
                if step == stop_at:
                    os.kill(os.getpid(), signal.SIGTERM)
                stop = run.should_stop()
                if stop or step % 2 == 0 or step == total:
                    run.save({"model": {"w": torch.full((4,), float(step))}}, step)
                if stop:
                    break
        return run

    assert session(stop_at=3).status == "preempted"
    assert bucket_logs(bucket, "exp/run/logs/") == run_logs(tmp_path / "run")
    shutil.rmtree(tmp_path / "run")
    assert session().status == "completed"
    summary = json.loads((tmp_path / "run" / run_folder.SUMMARY).read_text())
    assert (summary["resumed_from_step"], summary["preemptions"], summary["lost_steps"]) == (3, 1, 0)
    shutil.rmtree(tmp_path / "run")  # moved again, then run longer: a finished session is no preemption
    assert session(total=8).status == "completed"
    summary = json.loads((tmp_path / "run" / run_folder.SUMMARY).read_text())
    assert (summary["resumed_from_step"], summary["preemptions"], summary["lost_steps"]) == (6, 1, 0)
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / run_folder.METRICS).open()]
    assert steps == list(range(1, 9))
