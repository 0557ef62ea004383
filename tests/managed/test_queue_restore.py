"""A zone move brings the VM's run queue back (issue 29): what the old VM mirrored to the bucket is sent
again to the new VM, in order, each run with its own options.

Real parts: the host's queue program (roles/trainer_run/files/forja_queue.py) uploads its queue over
HTTP to the sandbox's Cloud Storage emulator as it does on a VM; forja reads it with Google's client;
the runs' snapshots are real history events; the watcher's own `_move` orders the steps. The cloud
steps of the move (delete, create, configure) and the sending of runs are playbooks that need hosts:
those stand-ins record the calls, and the "create" one mirrors the new VM's empty queue, as the new VM
does once configured, so a watcher that read the mirror after the move would find nothing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from forja import errors, lifecycle, managed, snapshot, training
from forja import queue as run_queue
from forja import zones as zone_advice
from forja.contract import InstanceState
from forja.history import History
from forja.session import Session
from forja_sandbox.service import PROJECT
from forja_sandbox.storage_emulator import StorageEmulator

q = run_queue.rules()
BUCKET = "forja-queue-mirror"
VM = "forja-l4"
GONE = InstanceState(exists=False)


def _entry(run: str, seq: int, *, priority: int = 0, mib: int | None = None, source: str | None = None,
           admitted: float | None = None) -> dict[str, Any]:
    return {"run": run, "seq": seq, "priority": priority, "gpu_memory_mib": mib, "memory_source": source,
            "timeout_s": 900, "enqueued_at": 100.0 + seq, "passed": 0, "admitted_at": admitted}


def no_advice(*_args: Any, **_kwargs: Any) -> None:
    raise errors.ForjaError("no capacity advice here: the user's zone order")


def test_a_zone_move_sends_the_mirrored_queue_again_in_order_with_each_runs_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    emulator = StorageEmulator(data_dir=tmp_path / "gcs")
    with emulator:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
        bucket = storage.Client(project=PROJECT, credentials=AnonymousCredentials()).create_bucket(BUCKET)

        # The old VM: the watched run and one more run from the queue on the GPU, two waiting.
        queue_dir = tmp_path / "runs" / q.QUEUE_DIR_NAME
        queue_dir.mkdir(parents=True)
        entries = [_entry("watched", 1, admitted=150.0), _entry("beside", 2, mib=4096, source="declared",
                                                                  admitted=160.0),
                   _entry("early", 3, mib=9000, source="planned"),
                   _entry("urgent", 4, priority=5, mib=6144, source="declared")]
        for entry in entries:
            q.write_json(str(queue_dir / f"{entry['run']}.json"), entry)
        host_config = {**q.load_config(str(tmp_path / "none.json")), "run_dir": str(tmp_path / "runs"),
                       "bucket": f"gs://{BUCKET}/checkpoints", "storage_emulator_host": emulator.url,
                       "host": VM}
        assert q.mirror(host_config, 200.0) is True
        assert q.mirror(host_config, 230.0) is False  # unchanged: no upload at each 30 s pass

        inventory = tmp_path / "hosts.yml"
        inventory.write_text(yaml.safe_dump({"forja_gpu": {"hosts": {VM: {
            "ansible_connection": "local", "trainer_run_checkpoint_bucket": f"gs://{BUCKET}/checkpoints",
            "gcp_bucket_project": PROJECT}}}}))
        history = History(tmp_path / "history.db")
        session = Session(tmp_path, inventory=str(inventory), history=history)
        project = tmp_path / "project"  # "urgent" was sent with a project in git, the others without
        project.mkdir()
        (project / "model.py").write_text("WIDTH = 64\n")
        commit = ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m"]
        for argv in (["init", "-q"], ["add", "."], commit):
            subprocess.run(["git", "-C", str(project), *argv], check=True)
        configs = {}
        for i, entry in enumerate(entries):
            run = entry["run"]
            configs[run] = tmp_path / f"{run}.yaml"
            configs[run].write_text(f"steps: {10 + i}\n")
            history.start(run, name=run, config_path=str(configs[run]), config_hash=None)
            snapshot.record(session, run, project=project if run == "urgent" else None, config=configs[run],
                            options={"script": None, "args": [], "excludes": ["data/"], "procs": None,
                                     "hooks": {}, "extravars": {"seed": i}})

        calls: list[str] = []
        sent: list[dict[str, Any]] = []

        def new_vm(_session: Any, _extravars: Any = None) -> None:
            calls.append("up")  # the new VM, once configured, mirrors its own (empty) queue under the name
            for path in queue_dir.glob("*.json"):
                path.unlink()
            q.mirror(host_config, 300.0)

        def send(_session: Any, config: Any = None, **how: Any) -> None:
            if "queue" in how:  # as train does first: the run's new snapshot replaces the old one's folder
                snapshot.record(session, how["name"], project=how["project"], config=Path(config), options={})
            sent.append({"config": Path(config).read_text() if config else None, **how})

        monkeypatch.setattr(lifecycle, "teardown", lambda *_a, **_k: calls.append("teardown"))
        monkeypatch.setattr(lifecycle, "up", new_vm)
        monkeypatch.setattr(lifecycle, "configure", lambda *_a, **_k: calls.append("configure"))
        monkeypatch.setattr(lifecycle, "observe", lambda *_a, **_k: {
            VM: InstanceState(exists=True, zone="us-east1-b", status="RUNNING")})
        monkeypatch.setattr(zone_advice, "zones", no_advice)
        monkeypatch.setattr(training, "train", send)

        state = managed.WatchState(run="watched", zones=["us-east1-d", "us-east1-b"],
                                   train={"config": str(configs["watched"])})
        said: list[str] = []
        watcher = managed.Watcher(session, state, say=said.append)
        watcher.vm_name = VM
        watcher._move(GONE, managed.Decision("move", "the VM is gone", ("us-east1-b",)))

        assert calls == ["up", "configure"]
        # The watched run first (it resumes from the bucket), then the queue: what ran, then by priority.
        assert [s["name"] for s in sent] == ["watched", "beside", "urgent", "early"]
        assert "queue" not in sent[0]
        beside, urgent, early = sent[1:]
        assert (beside["queue"], beside["priority"], beside["gpu_memory"], beside["queue_timeout_s"]) == (
            True, 0, "4096MiB", 900)
        assert (urgent["priority"], urgent["gpu_memory"]) == (5, "6144MiB")
        assert (urgent["project"], urgent["config"]) == (project, "steps: 13\n")  # the snapshot's own copy
        assert "gpu_memory" not in early  # a planned peak is planned again by the new send, not declared
        # The waiting ones keep when they were queued (their wait goes on); a running one waits anew.
        assert (urgent["queued_at"], early["queued_at"]) == (104.0, 103.0) and "queued_at" not in beside
        assert early["config"] == "steps: 12\n"  # its own config (forja.snapshot.again finds it)
        assert (early["excludes"], early["extravars"], early["wait"]) == (["data/"], {"seed": 2}, False)
        restored = [e for e in history.events("watched") if e.kind == "queue_restored"]
        assert restored[0].data["runs"] == ["beside", "urgent", "early"]
        assert [e.data["was"] for e in history.events("beside") if e.kind == "queue_restored"] == ["running"]
        # The bucket now holds the new VM's queue: the old one was read before the move replaced it.
        assert json.loads(bucket.blob(f"checkpoints/.queue/{VM}.json").download_as_bytes())["entries"] == []
