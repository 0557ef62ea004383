"""No forgotten disk (issue 28, part 3): the stopped-disk prune against the Compute and Storage emulators.

The drill: four stopped VMs of one inventory. Autostop's own code (the agent installed on the VM)
records each one's runs through the VM's metadata server just before the poweroff. One VM's newest
checkpoint and results are in the bucket: past its (test-shortened) autostop_delete_after it is deleted
and a disk_deleted event reaches the webhook. One VM's checkpoint never reached the bucket: it is kept,
with a warning naming its disk's monthly cost and the fix. One stopped too recently waits. One its user
stopped with `forja down` after autostop's stop is kept, though autostop's older record would pass. All of it
through `Forja.prune` -> ansible-runner -> playbooks/prune.yml -> gcp_gpu_prune, over real HTTP.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests
import yaml
from gcp_helpers import REPO, emulator_env
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from forja import events, module_utils
from forja.api import Forja
from forja.history import History
from forja_sandbox.compute_emulator.metadata_server import MetadataServer
from forja_sandbox.compute_emulator.operations import Loopback
from forja_sandbox.storage_emulator import StorageEmulator

PROJECT = "forja-sandbox"
ZONE = "us-east1-d"
BUCKET = "forja-drill"


def _agent() -> Any:
    """The autostop agent as the role installs it on the VM (a standalone script)."""
    spec = importlib.util.spec_from_file_location(
        "forja_autostop", REPO / "roles" / "autostop" / "files" / "forja_autostop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


agent = _agent()


@pytest.fixture(autouse=True)
def fresh_urllib_opener() -> Iterator[None]:
    """urllib's shared opener keeps the proxy settings of its first use: the drill's (a dead proxy for
    all but loopback, emulator_env) must not reach another test's webhook or metadata server."""
    urllib.request.install_opener(None)
    yield
    urllib.request.install_opener(None)




class Receiver(BaseHTTPRequestHandler):
    """A webhook: keeps each JSON body it is posted."""

    bodies: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    Receiver.bodies = []
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", Receiver.bodies
    server.shutdown()


def _call(emu: Any, method: str, path: str, body: dict[str, Any] | None = None) -> None:
    """One Compute API call that returns an operation, waited on until DONE."""
    auth = {"Authorization": f"Bearer {emu.issue_token()}"}
    zone_url = f"{emu.base_url}projects/{PROJECT}/zones/{ZONE}"
    op = requests.request(method, f"{zone_url}/{path}", json=body, headers=auth, timeout=30).json()
    done = requests.post(f"{zone_url}/operations/{op['name']}/wait", headers=auth, timeout=60).json()
    assert done["status"] == "DONE" and "error" not in done, done


def _run_folder(root: Path, run: str, step: int, summary: bool) -> Path:
    """A run folder as the trainer leaves it: checkpoints and logs."""
    folder = root / run
    (folder / "checkpoints").mkdir(parents=True)
    for older in (step // 2, step):
        (folder / "checkpoints" / f"ckpt-{older}.pt").write_bytes(b"weights")
    for name in ("events.jsonl", "metrics.jsonl", *(["summary.json"] if summary else [])):
        (folder / name).write_text("{}\n")
    return root


def _create_vm(emu: Any, name: str) -> None:
    """The role's VM as forja makes it: an L4 with a 300 GB boot disk, guest attributes on."""
    _call(emu, "POST", "instances", {
        "name": name, "machineType": f"zones/{ZONE}/machineTypes/g2-standard-8",
        "scheduling": {"onHostMaintenance": "TERMINATE"}, "labels": {"forja": "managed"},
        "disks": [{"boot": True, "initializeParams": {
            "diskSizeGb": "300",
            "sourceImage": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"}}],
        "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}],
        "metadata": {"items": [{"key": "enable-guest-attributes", "value": "TRUE"}]},
    })


def _vm_stopped_by_autostop(emu: Any, metadata: MetadataServer, name: str, run_dir: Path | None,
                            ago_s: float = 0.0) -> None:
    """Create the VM, let the agent leave its record (as its stop does, after the units checkpointed),
    then stop it. `ago_s`: the record's time that long ago (a stop before the VM's last start)."""
    _create_vm(emu, name)
    if run_dir is not None:
        config = {**agent.DEFAULTS, "metadata_url": metadata.url, "run_dir": str(run_dir)}
        agent.record_mirror(config, time.time() - ago_s)
    _call(emu, "POST", f"instances/{name}/stop")


def test_the_agents_names_are_the_mirrors() -> None:
    """The record names what trainer/mirror.py uploads: checkpoint names and the completion marker."""
    from trainer.checkpoint import CKPT_RE
    from trainer.mirror import MARKER_SUFFIX

    assert agent.CHECKPOINT_RE.pattern == CKPT_RE.pattern and agent.MARKER_SUFFIX == MARKER_SUFFIX


def test_the_record_lists_each_runs_newest_checkpoint_and_results_and_says_when_runs_were_left_out(
    tmp_path: Path,
) -> None:
    _run_folder(tmp_path, "digits", 40, summary=True)
    _run_folder(tmp_path, "other", 8, summary=False)
    (tmp_path / "empty").mkdir()  # nothing a bucket would keep: not listed
    record = agent.mirror_record(str(tmp_path), 1_800_000_000.0)
    by_run = {r["run"]: r for r in record["runs"]}
    assert record["v"] == 1 and record["more"] is False and set(by_run) == {"digits", "other"}
    assert by_run["digits"] == {"run": "digits", "step": 40, "objects": [
        "checkpoints/ckpt-40.pt", "checkpoints/ckpt-40.pt.complete.json",
        "logs/events.jsonl", "logs/metrics.jsonl", "logs/summary.json"]}
    size = len(json.dumps(record, separators=(",", ":")))
    assert agent.mirror_record(str(tmp_path), 1_800_000_000.0, limit=size)["more"] is False
    cut = agent.mirror_record(str(tmp_path), 1_800_000_000.0, limit=size - 1)
    assert cut["more"] is True and len(cut["runs"]) == 1


def test_drill_a_mirrored_vm_is_deleted_and_an_unmirrored_one_is_kept_with_a_warning(
    emulator: Any, key_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, webhook: Any,
) -> None:
    url, posted = webhook
    for name, value in emulator_env(emulator, key_file).items():
        monkeypatch.setenv(name, value)
    emulator.backend = Loopback()
    with MetadataServer(emulator.api, "127.0.0.1", 0) as metadata:
        _vm_stopped_by_autostop(emulator, metadata, "vm-mirrored",
                                _run_folder(tmp_path / "a", "digits", 40, summary=True))
        _vm_stopped_by_autostop(emulator, metadata, "vm-unmirrored",
                                _run_folder(tmp_path / "b", "lost", 10, summary=False))
        _vm_stopped_by_autostop(emulator, metadata, "vm-recent", None)
        # Stopped by autostop with all of it in the bucket; then its user started it and stopped it
        # with `forja down` (the Compute API's stop: no new record). The prune keeps what its user stopped.
        _vm_stopped_by_autostop(emulator, metadata, "vm-downed",
                                _run_folder(tmp_path / "c", "digits", 40, summary=True), ago_s=60)
        _call(emulator, "POST", "instances/vm-downed/start")
        _call(emulator, "POST", "instances/vm-downed/stop")
    stopped = time.monotonic()

    with StorageEmulator(data_dir=tmp_path / "gcs") as gcs:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.url)
        bucket = storage.Client(project=PROJECT, credentials=AnonymousCredentials()).create_bucket(BUCKET)
        for name in ("ckpt-40.pt", "ckpt-40.pt.complete.json"):
            bucket.blob(f"checkpoints/digits/checkpoints/{name}").upload_from_string(b"x")
        for name in ("events.jsonl", "metrics.jsonl", "summary.json"):
            bucket.blob(f"checkpoints/digits/logs/{name}").upload_from_string(b"{}\n")
        bucket.blob("checkpoints/lost/logs/events.jsonl").upload_from_string(b"{}\n")  # no checkpoint

        inventory = tmp_path / "inventory"
        (inventory / "group_vars" / "all").mkdir(parents=True)
        (inventory / "host_vars").mkdir()
        (inventory / "forja.gcp_gpu.yml").write_text(yaml.safe_dump({
            "plugin": "forja.gpu.gcp_gpu", "projects": [PROJECT], "api_url": emulator.base_url,
            "credentials_file": str(key_file), "cache": False}))
        (inventory / "group_vars" / "all" / "prune.yml").write_text(yaml.safe_dump({
            "autostop_delete_after": "1s",  # the drill's shortened week
            "trainer_run_checkpoint_bucket": f"gs://{BUCKET}/checkpoints",
            "gcp_bucket_storage_emulator_host": gcs.url}))
        recent_vars = yaml.safe_dump({"autostop_delete_after": "1d"})
        (inventory / "host_vars" / "vm-recent.yml").write_text(recent_vars)
        forja = Forja(tmp_path, inventory=inventory, private_data_dir=tmp_path / "runner",
                      history=History(tmp_path / "history.sqlite"))
        time.sleep(max(0.0, 1.2 - (time.monotonic() - stopped)))

        dry = forja.prune(dry_run=True)
        assert [v.vm for v in dry.would_delete] == ["vm-mirrored"] and dry.deleted == []
        assert emulator.instance(PROJECT, ZONE, "vm-mirrored") is not None, "a dry run deletes nothing"

        report = forja.prune(notify=url)

    assert emulator.instance(PROJECT, ZONE, "vm-mirrored") is None
    assert emulator.instance(PROJECT, ZONE, "vm-unmirrored")["status"] == "TERMINATED"
    assert emulator.instance(PROJECT, ZONE, "vm-recent")["status"] == "TERMINATED"
    mirrored, unmirrored, recent = (report.verdicts[n] for n in ("vm-mirrored", "vm-unmirrored", "vm-recent"))
    assert mirrored.deleted and "digits step 40" in mirrored.reason
    assert "checkpoints/digits/logs/summary.json" in mirrored.checked
    assert unmirrored.action == "keep" and not unmirrored.deleted
    assert unmirrored.reason.startswith("not all of it is in the bucket: "
                                        "gs://forja-drill/checkpoints/lost/checkpoints/ckpt-10.pt, ")
    warning = unmirrored.warning
    assert warning.startswith("vm-unmirrored: stopped ") and "300 GB disk still bills $" in warning
    assert "/month" in warning and "forja down --delete" in warning and "finish mirroring" in warning
    assert recent.action == "wait" and "of autostop_delete_after 1 d" in recent.reason
    downed = report.verdicts["vm-downed"]
    assert emulator.instance(PROJECT, ZONE, "vm-downed")["status"] == "TERMINATED"
    assert downed.action == "keep" and "older than its last start" in downed.reason
    assert "forja down --delete" in downed.warning and "/month" in downed.warning
    [event] = posted
    assert event["event"] == "disk_deleted" and event["vm"] == "vm-mirrored"
    assert event["details"]["disk_usd_per_month_saved"] == pytest.approx(mirrored.disk_usd_per_month)
    assert mirrored.disk_usd_per_month > 0 and "saving $" in event["text"]


# --- The rules on their own (plugins/module_utils/forja_gcp_prune.py): every doubt keeps the VM ----------

module_utils.load("forja_durations")  # its sibling, loaded first by its own name
rules = module_utils.load("forja_gcp_prune")
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
WEEK = 7 * 86400.0


def _record(**over: Any) -> str:
    runs = [{"run": "digits", "step": 40, "objects": ["checkpoints/ckpt-40.pt"]}]
    return json.dumps({"v": 1, "time": "2026-11-20T10:00:00+00:00", "more": False, "runs": runs, **over})


def _judge(*, missing: Any = lambda bucket, names: [], **over: Any) -> Any:
    given = {"status": "TERMINATED", "last_start": "2026-11-20T09:00:00.500-00:00",
             "last_stop": "2026-11-20T11:00:00Z", "now": NOW, "delete_after_s": WEEK,
             "bucket_url": "gs://b/ckpt", "record_text": _record(), **over}
    return rules.judge(missing=missing, **given)


def _unreadable(bucket: str, names: list[str]) -> list[str]:
    raise RuntimeError("Forbidden: 403")


@pytest.mark.parametrize(("over", "action", "said"), [
    ({}, "delete", "in the bucket: digits step 40"),
    ({"delete_after_s": None}, "off", "off"),
    ({"status": "RUNNING"}, "not-stopped", "it is RUNNING"),
    ({"last_stop": "2026-11-29T12:00:00Z"}, "wait", "stopped 1 d of autostop_delete_after 7 d"),
    ({"last_stop": None}, "keep", "no time it stopped"),
    ({"bucket_url": ""}, "keep", "no checkpoint bucket"),
    ({"record_text": None}, "keep", "autostop left no record"),
    ({"record_text": "not json"}, "keep", "cannot be read"),
    ({"record_text": _record(v=2)}, "keep", "not a version 1 record"),
    ({"last_start": "2026-11-20T10:30:00Z"}, "keep", "older than its last start"),
    ({"record_text": _record(more=True)}, "keep", "more runs than the checkpoint record could list"),
    ({"record_text": _record(runs=[])}, "keep", "nothing on it was mirrored"),
    ({"missing": _unreadable}, "keep", "could not be checked (Forbidden: 403)"),
    ({"missing": lambda bucket, names: names}, "keep", "gs://b/ckpt/digits/checkpoints/ckpt-40.pt missing"),
])
def test_only_a_vm_stopped_long_enough_with_everything_in_the_bucket_is_deleted(over, action, said) -> None:
    verdict = _judge(**over)
    assert verdict.action == action and said in verdict.reason


@pytest.mark.parametrize(("text", "seconds"), [
    ("7d", WEEK), ("36h", 129600.0), ("90m", 5400.0), ("30s", 30.0), ("1.5d", 129600.0), ("", None)])
def test_durations_read_as_people_write_them(text: str, seconds: float | None) -> None:
    assert rules.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7", "7 days", "0d", "-1h", "1w"])
def test_a_duration_without_a_known_unit_is_refused_with_the_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"autostop_delete_after: .*e\.g\. 7d, 36h, 1d12h, 90m"):
        rules.parse_duration(text)


# --- `forja down --delete` says what goes and what stays, before it deletes ------------------------------


def test_the_deletion_plan_names_each_vm_its_disk_and_monthly_cost_and_the_bucket_that_stays(
    emulator: Any, key_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from forja import deletion

    for name, value in emulator_env(emulator, key_file).items():
        monkeypatch.setenv(name, value)
    _create_vm(emulator, "forja-l4")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
        "[forja_gpu]\nforja-l4 gcp_bucket_name=forja-ckpts trainer_run_checkpoint_bucket=gs://forja-ckpts/ckpt\n")
    said: list[Any] = []
    forja = Forja(tmp_path, inventory=inventory, private_data_dir=tmp_path / "runner",
                  history=History(tmp_path / "history.sqlite"), on_event=said.append)

    plan = deletion.plan(forja)

    [vm] = plan.removes
    assert (vm.vm, vm.zone, vm.boot_disk_size_gb) == ("forja-l4", ZONE, 300) and vm.disk_usd_per_month == 30.0
    assert plan.keeps == ["gs://forja-ckpts/ckpt", "gs://forja-ckpts"]
    assert plan.text() == (
        "down --delete deletes forja-l4 (us-east1-d, RUNNING) with its 300 GB boot disk, $30.00/month: "
        "$30.00/month of disk no longer billed, and anything on those disks that is not in a bucket is gone; "
        "keeps gs://forja-ckpts/ckpt, gs://forja-ckpts and what is in it")
    assert emulator.instance(PROJECT, ZONE, "forja-l4") is not None, "the plan deletes nothing"

    # forja down --delete says the plan first, then deletes (the down hooks' play passes over a host
    # that does not answer: this one has no SSH at all)
    result = forja.down(delete=True)
    assert result.ok, result
    told = [e.text for e in said if isinstance(e, events.Announcement) and e.host == "forja"]
    assert told == [plan.text()], told
    assert emulator.instance(PROJECT, ZONE, "forja-l4") is None, "deleted after it was said"


def test_without_a_bucket_the_warning_names_the_bucket_as_the_fix() -> None:
    verdict = _judge(bucket_url="")
    warning = rules.kept_warning("forja-l4", verdict, 300, 30.0)
    assert warning == (
        "forja-l4: stopped 10 d 1 h, past autostop_delete_after, but kept: no checkpoint bucket "
        "(trainer_run_checkpoint_bucket) holds its checkpoints; its 300 GB disk still bills "
        "$30.00/month. Fix: set a checkpoint bucket (trainer_run_checkpoint_bucket) so the runs are "
        "mirrored there, or delete it yourself: forja down --delete (ansible-playbook "
        "playbooks/teardown.yml -e forja_teardown_delete=true)")


class MetadataStandIn(BaseHTTPRequestHandler):
    """A metadata server that keeps each guest attribute written to it."""

    written: ClassVar[dict[str, str]] = {}

    def do_PUT(self) -> None:
        self.written[self.path] = self.rfile.read(int(self.headers["Content-Length"])).decode()
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


def test_record_mirror_alone_leaves_the_record_for_a_stop_that_is_not_autostops(tmp_path: Path) -> None:
    """`forja_autostop.py --record-mirror`: the record without deciding or stopping anything."""
    MetadataStandIn.written = {}
    server = HTTPServer(("127.0.0.1", 0), MetadataStandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    runs = _run_folder(tmp_path / "runs", "digits", 40, summary=True)
    config = tmp_path / "autostop.json"
    config.write_text(json.dumps({
        "jupyter_url": "http://127.0.0.1:9", "jupyter_token_file": str(tmp_path / "token"),
        "train_unit_pattern": "forja-train@*.service", "run_dir": str(runs),
        "state_dir": str(tmp_path / "state"),
        "metadata_url": f"http://127.0.0.1:{server.server_port}/computeMetadata/v1"}))
    try:
        assert agent.main(["--config", str(config), "--record-mirror"]) == 0
    finally:
        server.shutdown()
    [(path, value)] = MetadataStandIn.written.items()
    assert path == "/computeMetadata/v1/instance/guest-attributes/forja/mirror"
    assert [r["step"] for r in json.loads(value)["runs"]] == [40]
    assert not (tmp_path / "state").exists(), "nothing was decided"
