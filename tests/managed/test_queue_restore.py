"""A zone move brings the VM's run queue back (issue 29): what the old VM mirrored to the bucket is sent
again to the new VM, in order, each run with its own options and its place in the queue.

Real parts only: the host's queue program (roles/trainer_run/files/forja_queue.py) uploads its queue
over HTTP to the sandbox's Cloud Storage emulator as it does on a VM; forja reads it back with Google's
client (`forja.queue.mirrored`); the runs' snapshots are real history events and files, one of them a
git project that moved on since (put back in a temporary worktree). What each run is sent with is
decided by a plain function, read here directly (`forja.queue.requeued`). Sending is a playbook on a
host: `restore` is given forja's real train with no inventory named, which refuses after it has taken
every keyword it was given and before anything is recorded, so the glue runs for real. The restore on
a host with the real train is tests/api/test_queue_hosts.py's (q-third).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from forja import queue as run_queue
from forja import snapshot, training
from forja.history import History
from forja.session import Session
from forja_sandbox.service import PROJECT
from forja_sandbox.storage_emulator import StorageEmulator

q = run_queue.rules()
BUCKET = "forja-queue-mirror"
VM = "forja-l4"


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True)
    return done.stdout


def _entry(run: str, seq: int, *, priority: int = 0, mib: int | None = None, source: str | None = None,
           admitted: float | None = None) -> dict[str, Any]:
    return {"run": run, "seq": seq, "priority": priority, "gpu_memory_mib": mib, "memory_source": source,
            "timeout_s": 900, "enqueued_at": 100.0 + seq, "passed": 0, "admitted_at": admitted}


@pytest.fixture
def moved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Session, Path, list[dict[str, Any]]]:
    """The old VM's queue as forja reads it from the bucket after the move: the watched run and one more
    on the GPU, two waiting ("urgent", sent from a git project that has moved on since), and "lost", a
    run this history does not know. Each known run has its snapshot; no inventory is named anywhere."""
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no user's inventory either
    for name in ("FORJA_INVENTORY", "ANSIBLE_INVENTORY"):
        monkeypatch.delenv(name, raising=False)
    session = Session(tmp_path, inventory=None, history=History(tmp_path / "history.db"), extravars={
        "trainer_run_checkpoint_bucket": f"gs://{BUCKET}/checkpoints", "gcp_bucket_project": PROJECT})
    project = tmp_path / "project"
    project.mkdir()
    git(project, "init", "-q")
    (project / "model.py").write_text("WIDTH = 64\n")
    git(project, "add", ".")
    git(project, "commit", "-qm", "one")
    entries = [_entry("watched", 1, admitted=150.0), _entry("beside", 2, mib=4096, source="declared",
                                                              admitted=160.0),
               _entry("early", 3, mib=9000, source="planned"),
               _entry("urgent", 4, priority=5, mib=6144, source="declared"), _entry("lost", 5)]
    for i, entry in enumerate(entries[:-1]):
        run = entry["run"]
        config = tmp_path / f"{run}.yaml"
        config.write_text(f"steps: {10 + i}\n")
        session.history.start(run, name=run, config_path=str(config), config_hash=None)
        snapshot.record(session, run, project=project if run == "urgent" else None, config=config,
                        options={"script": None, "args": [], "excludes": ["data/"], "procs": None,
                                 "hooks": {}, "extravars": {"seed": i}})
    (project / "model.py").write_text("WIDTH = 128\n")
    git(project, "commit", "-qam", "two")

    queue_dir = tmp_path / "runs" / q.QUEUE_DIR_NAME
    queue_dir.mkdir(parents=True)
    for entry in entries:
        q.write_json(str(queue_dir / f"{entry['run']}.json"), entry)
    with StorageEmulator(data_dir=tmp_path / "gcs") as emulator:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
        storage.Client(project=PROJECT, credentials=AnonymousCredentials()).create_bucket(BUCKET)
        host_config = {**q.load_config(str(tmp_path / "none.json")), "run_dir": str(tmp_path / "runs"),
                       "bucket": f"gs://{BUCKET}/checkpoints", "storage_emulator_host": emulator.url,
                       "host": VM}
        assert q.mirror(host_config, 200.0) is True
        assert q.mirror(host_config, 230.0) is False  # unchanged: no upload at each 30 s pass
        return session, project, run_queue.mirrored(session, VM)


def test_each_mirrored_run_is_queued_again_from_its_snapshot_in_its_place(
    moved: tuple[Session, Path, list[dict[str, Any]]],
) -> None:
    session, project, mirrored = moved
    # The host's order: what ran, then the waiting ones by priority (restore keeps it).
    assert [e["run"] for e in mirrored] == ["watched", "beside", "urgent", "early", "lost"]
    sent: dict[str, dict[str, Any]] = {}
    for entry in mirrored[1:4]:
        with run_queue.requeued(session, entry) as how:
            sent[entry["run"]] = {**how, "config": Path(how["config"]).read_text(),
                                  "code": how["project"] and (Path(how["project"]) / "model.py").read_text()}
    beside, urgent, early = sent["beside"], sent["urgent"], sent["early"]
    for run, how in sent.items():
        assert (how["name"], how["wait"], how["yes"], how["queue"]) == (run, False, True, True)
        assert (how["excludes"], how["queue_timeout_s"]) == (["data/"], 900)
    assert (beside["priority"], beside["gpu_memory"], beside["extravars"]) == (0, "4096MiB", {"seed": 1})
    # A waiting run keeps when it was queued (its wait goes on); a running one waits anew to resume.
    assert (urgent["queued_at"], early["queued_at"]) == (104.0, 103.0) and "queued_at" not in beside
    assert (urgent["priority"], urgent["gpu_memory"], urgent["config"]) == (5, "6144MiB", "steps: 13\n")
    assert urgent["code"] == "WIDTH = 64\n" and Path(urgent["project"]) != project  # its commit, not HEAD's
    assert not Path(urgent["project"]).exists(), "the worktree lived while the run was sent"
    assert len(git(project, "worktree", "list").splitlines()) == 1
    assert (early["config"], early["project"], early["extravars"]) == ("steps: 12\n", None, {"seed": 2})
    assert "gpu_memory" not in early  # a planned peak is planned again by the new send, not declared


def test_restore_skips_the_watched_run_says_each_refusal_and_goes_on_with_the_others(
    moved: tuple[Session, Path, list[dict[str, Any]]],
) -> None:
    session, project, mirrored = moved
    said: list[str] = []
    assert run_queue.restore(session, mirrored, training.train, skip="watched", say=said.append) == []
    assert [line.split(":")[0] for line in said] == [
        f"queued run {run} was not sent again" for run in ("beside", "urgent", "early", "lost")]
    assert all("inventory" in line for line in said[:3]), said  # train's own refusal: no hosts named
    assert "no run 'lost' in the history" in said[3]
    runs = session.history.list()
    assert sorted(r.run_id for r in runs) == ["beside", "early", "urgent", "watched"]
    assert not [e for r in runs for e in session.history.events(r.run_id) if e.kind == "queue_restored"]
    assert len(git(project, "worktree", "list").splitlines()) == 1
