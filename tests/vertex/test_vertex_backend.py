"""`Forja.train(backend="vertex")` / `forja train --backend vertex` on the sandbox: the Vertex
emulator runs the job's replica as a local process, which pip-installs the package forja built and
uploaded to the Cloud Storage emulator, and the trainer mirrors its results into the same bucket.
Everything goes over real HTTP through forja's own client (plugins/module_utils/forja_vertex.py)
and google-cloud-storage; nothing of forja's is stood in for.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainer_helpers import tiny_digits
from typer.testing import CliRunner

from forja import errors, vertex_job
from forja.api import Forja
from forja.cli import app
from forja.errors import ConfigError, ExitCode
from forja.history import History
from forja.vertex_job import VertexOptions
from forja_sandbox.vertex_emulator import VertexEmulator
from trainer import run_folder

storage = pytest.importorskip("google.cloud.storage")
PARENT = "projects/forja-sandbox/locations/us-central1"


def new_bucket(name: str) -> Any:
    return storage.Client().create_bucket(name)


def names(bucket: Any, prefix: str = "") -> list[str]:
    return sorted(b.name for b in bucket.client.list_blobs(bucket.name, prefix=prefix))


def generations(bucket: Any, prefix: str) -> dict[str, int]:
    return {b.name: b.generation for b in bucket.client.list_blobs(bucket.name, prefix=prefix)}


def config_file(tmp_path: Path, steps: int) -> Path:
    path = tmp_path / "tiny.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(tiny_digits(tmp_path, steps=steps)))
    return path


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_a_config_trains_as_a_vertex_job_and_its_results_land_in_the_bucket(
    sandbox: VertexEmulator, tmp_path: Path
) -> None:
    bucket = new_bucket("vertex-results")
    forja = Forja(project_dir=tmp_path, history=History(tmp_path / "history.db"))
    said: list[str] = []
    lines: list[tuple[str, str]] = []
    config = config_file(tmp_path, steps=12)

    def on_event(event: Any) -> None:
        said.append(getattr(event, "text", ""))
        lines.append((getattr(event, "host", ""), getattr(event, "text", "")))

    result = forja.train(
        config,
        name="tiny-vertex",
        backend="vertex",
        poll_s=0.1,
        vertex=VertexOptions(bucket="gs://vertex-results"),
        on_event=on_event,
    )

    job = sandbox.job(result.hosts[0])
    logs = {r.label: r.log.read_text()[-2000:] for r in job.replicas}
    assert result.status == "completed", logs
    spec = job.proto.job_spec.worker_pool_specs[0]
    assert spec.machine_spec.machine_type == "g2-standard-8"  # the project's VM, from roles/gcp_instance
    assert spec.machine_spec.accelerator_type.name == "NVIDIA_L4" and spec.machine_spec.accelerator_count == 1
    (package,) = spec.python_package_spec.package_uris
    assert package.startswith("gs://vertex-results/vertex/packages/") and package.endswith(".tar.gz")
    assert (
        job.proto.job_spec.base_output_directory.output_uri_prefix
        == "gs://vertex-results/vertex/runs/tiny-vertex/"
    )

    run = names(bucket, "vertex/runs/tiny-vertex/")
    prefix = "vertex/runs/tiny-vertex/"
    # where Vertex's AIP_CHECKPOINT_DIR and AIP_MODEL_DIR point: <baseOutputDirectory>/checkpoints/, /model/
    assert {f"{prefix}checkpoints/ckpt-12.pt", f"{prefix}checkpoints/ckpt-12.pt.complete.json"} <= set(run), (
        run
    )
    assert {
        f"{prefix}logs/metrics.jsonl",
        f"{prefix}logs/summary.json",  # the trainer's own summary, read back by forja
        f"{prefix}model/model.json",
        f"{prefix}model/model.safetensors",
    } <= set(run)
    assert result.summary["steps"] == 12 and result.summary["final_loss"] > 0, result.summary
    # Figures only the trainer's summary.json has (a summary rebuilt from metrics lines lacks them):
    assert result.summary["world_size"] == 1 and result.summary["samples_per_s"] > 0, result.summary
    written = json.loads((result.artifact_dir / run_folder.SUMMARY).read_text())
    # the trainer's own count is the part it is (training_usd), the run's cost is its settled one
    assert {**result.summary, "cost_usd": result.training_usd} == written
    assert result.cost_usd is not None and result.cost_usd == forja.history.get("tiny-vertex").cost_usd
    # The replica's own output came through Cloud Logging while forja waited, said by its task name,
    # every line of its log file and in the same order.
    streamed = [text for host, text in lines if host == "workerpool0-0"]
    assert streamed == job.replicas[0].log.read_text().splitlines(), streamed[-5:]
    assert any("step" in line for line in streamed), streamed[-5:]
    assert result.artifact_dir == tmp_path / "forja-runs" / "tiny-vertex" / "vertex"
    assert json.loads((result.artifact_dir / run_folder.MODEL_DIR / "model.json").read_text())["step"] == 12
    assert not (result.artifact_dir / run_folder.CHECKPOINTS_DIR).exists(), (
        "checkpoints stay in the bucket unless asked for"
    )
    states = [t.rsplit(": ", 1)[-1] for t in said if t.startswith("job ") and ": JOB_STATE" in t]
    assert states[-1] == "JOB_STATE_SUCCEEDED" and "JOB_STATE_RUNNING" in states, said
    record = forja.history.get("tiny-vertex")
    assert record.status == "completed" and record.hosts == [job.proto.name]

    # The same trainer and config again: the package is there under its hash, nothing is uploaded;
    # sent without waiting, then cancelled by the run's name.
    before = generations(bucket, "vertex/packages/")
    again = forja.train(
        config,
        name="tiny-again",
        backend="vertex",
        wait=False,
        vertex=VertexOptions(bucket="gs://vertex-results"),
    )
    after = generations(bucket, "vertex/packages/")
    assert again.detached == "detach" and after == before and len(after) == 1
    sent = sandbox.job(again.hosts[0]).proto.job_spec.worker_pool_specs[0].python_package_spec
    assert list(sent.package_uris) == [package]
    cancelled = forja.vertex_cancel("tiny-again")
    assert cancelled["state"] == "JOB_STATE_CANCELLED", cancelled
    assert all(r.proc is None or r.proc.poll() is not None for r in sandbox.job(again.hosts[0]).replicas)
    assert forja.history.get("tiny-again").status == "cancelled"


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_ctrl_c_stops_watching_and_follow_picks_the_job_up_to_its_end(
    sandbox: VertexEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    new_bucket("vertex-follow")
    forja = Forja(project_dir=tmp_path, history=History(tmp_path / "history.db"))
    interrupted = threading.Event()
    interrupted.set()  # what the CLI's Ctrl-C handler does: the job is sent, the watching stops
    options = VertexOptions(bucket="gs://vertex-follow")
    left = forja.train(config_file(tmp_path, steps=5), name="left", backend="vertex", vertex=options,
                       cancel=interrupted)  # fmt: skip
    assert left.detached == "interrupted" and left.status == "running"
    assert forja.history.get("left").status == "running"
    said: list[str] = []
    # Cloud Logging that answers 404: the lines cannot be read, which is said once; the job is
    # still followed to its end.
    monkeypatch.setenv("FORJA_LOGGING_API_URL", f"{sandbox.url}/no-logging-here/")
    done = forja.vertex_follow("left", options, poll_s=0.1, on_event=lambda e: said.append(e.text))
    assert done.status == "completed" and done.summary["steps"] == 5, done
    assert len([t for t in said if "logs cannot be read" in t]) == 1, said
    assert sandbox.job(done.hosts[0]).proto.name == left.hosts[0]
    assert forja.history.get("left").status == "completed"


def test_a_machine_without_that_accelerator_is_refused_before_anything_is_uploaded(
    sandbox: VertexEmulator, tmp_path: Path
) -> None:
    bucket = new_bucket("vertex-refused")
    forja = Forja(project_dir=tmp_path, history=History(tmp_path / "history.db"))
    bad = VertexOptions(bucket="gs://vertex-refused", accelerator_type="NVIDIA_TESLA_T4", accelerator_count=1)
    with pytest.raises(ConfigError) as refused:
        forja.train(config_file(tmp_path, steps=1), name="t4-on-g2", backend="vertex", vertex=bad)
    assert refused.value.field == "accelerator_type", refused.value.message
    assert "g2-standard-8" in refused.value.message and "--accelerator" in refused.value.message
    with pytest.raises(ConfigError) as no_bucket:
        forja.train(config_file(tmp_path, steps=1), name="no-bucket", backend="vertex")
    assert no_bucket.value.field == "bucket" and "--bucket gs://BUCKET" in no_bucket.value.message
    with pytest.raises(ConfigError, match="gs://vertex-nosuch does not exist; create it"):
        forja.train(config_file(tmp_path, steps=1), name="no-such-bucket", backend="vertex",
                    vertex=VertexOptions(bucket="gs://vertex-nosuch"))  # fmt: skip
    assert names(bucket) == [], "nothing was uploaded"
    assert [
        j
        for j in sandbox.store.list(PARENT)
        if j.proto.display_name in ("t4-on-g2", "no-bucket", "no-such-bucket")
    ] == []


def test_the_cli_sends_detached_cancels_and_refuses_bad_input(
    sandbox: VertexEmulator, tmp_path: Path
) -> None:
    runner = CliRunner()
    new_bucket("vertex-cli")
    config = str(config_file(tmp_path, steps=1))
    vertex = ["--backend", "vertex", "--bucket", "gs://vertex-cli"]
    refused = runner.invoke(
        app,
        ["--json", "train", config, *vertex, "--accelerator", "NVIDIA_TESLA_T4", "--accelerator-count", "1"],
    )
    assert refused.exit_code == ExitCode.USAGE, refused.output
    assert json.loads(refused.stdout)["field"] == "accelerator_type"

    sent = runner.invoke(app, ["train", config, *vertex, "--name", "cli-run", "--detach"])
    assert sent.exit_code == 0, sent.output
    assert sent.stdout.strip().splitlines()[-1] == "cli-run"
    assert "forja vertex cancel cli-run" in sent.output  # how to follow and cancel it, said at once
    cancelled = runner.invoke(app, ["vertex", "cancel", "cli-run"])
    assert cancelled.exit_code == 0 and "JOB_STATE_CANCELLED" in cancelled.stdout, cancelled.output

    unknown = runner.invoke(app, ["vertex", "cancel", "no-such-run"])
    assert unknown.exit_code == ExitCode.NOT_FOUND, unknown.output
    assert "no Vertex AI job of run 'no-such-run'" in unknown.output


def test_under_json_what_only_the_run_s_start_can_check_is_a_field(
    sandbox: VertexEmulator, tmp_path: Path
) -> None:
    """The line `forja train` prints (tests/api/test_config_judged.py) is the result's `unchecked`
    under --json, and not said on stderr there."""
    runner = CliRunner()
    new_bucket("vertex-unchecked")
    config = str(config_file(tmp_path, steps=1))
    sent = runner.invoke(app, ["--json", "train", config, "--backend", "vertex", "--bucket", "gs://vertex-unchecked",
                               "--name", "unchecked", "--detach"])  # fmt: skip
    assert sent.exit_code == 0, sent.output
    assert json.loads(sent.stdout)["unchecked"] == [
        "model trainer.demo:digits_cnn", "data trainer.demo:digits", "optimizer AdamW"]
    assert "Imported when the run starts" not in sent.stderr
    assert runner.invoke(app, ["vertex", "cancel", "unchecked"]).exit_code == 0


def test_the_package_is_named_by_what_goes_in(tmp_path: Path) -> None:
    one, other = config_file(tmp_path / "a", steps=1), config_file(tmp_path / "b", steps=2)
    same = vertex_job.content_hash(vertex_job.package_files(one))
    assert same == vertex_job.content_hash(vertex_job.package_files(one))
    assert same != vertex_job.content_hash(vertex_job.package_files(other))


def package_job(uri: str) -> dict[str, Any]:
    pool = {
        "machine_spec": {"machine_type": "n1-standard-4"},
        "replica_count": 1,
        "python_package_spec": {
            "executor_image_uri": vertex_job.EXECUTOR_IMAGE,
            "package_uris": [uri],
            "python_module": "trainer",
            "args": ["--help"],
        },
    }
    return {"display_name": "gs-package", "job_spec": {"worker_pool_specs": [pool]}}


def test_the_emulator_reads_gs_packages_only_from_the_storage_emulator(
    sandbox: VertexEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from google.api_core import exceptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform_v1
    from google.cloud.aiplatform_v1.types import JobState

    client = aiplatform_v1.JobServiceClient(
        transport="rest", client_options={"api_endpoint": sandbox.url}, credentials=AnonymousCredentials()
    )
    new_bucket("vertex-missing")
    job = client.create_custom_job(parent=PARENT, custom_job=package_job("gs://vertex-missing/p/none.tar.gz"))
    job = until_final(client, job.name)
    assert job.state == JobState.JOB_STATE_FAILED and "A replica could not start" in job.error.message, job
    assert "none.tar.gz" in job.error.message

    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    with pytest.raises(exceptions.BadRequest, match="STORAGE_EMULATOR_HOST"):
        client.create_custom_job(parent=PARENT, custom_job=package_job("gs://vertex-missing/p/none.tar.gz"))


def until_final(client: Any, name: str) -> Any:
    from trainer_helpers import until

    final = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")
    return until(lambda: (j := client.get_custom_job(name=name)).state.name in final and j, 30, name)


def exiting_job(run_id: str, bucket: str, code: int) -> dict[str, Any]:
    """A job of run `run_id` as forja sends one (display name, output under the run's prefix) whose
    replica exits with `code`, as the trainer does, without the trainer's start-up."""
    pool = {
        "machine_spec": {"machine_type": "n1-standard-4"},
        "replica_count": 1,
        "container_spec": {"image_uri": "python:3.11-slim",
                           "command": [sys.executable, "-c", f"raise SystemExit({code})"]},
    }
    output = f"gs://{bucket}/{vertex_job.RUNS_PREFIX}{run_id}/"
    return {"display_name": run_id, "job_spec": {"worker_pool_specs": [pool],
                                                 "base_output_directory": {"output_uri_prefix": output}}}


def test_a_job_whose_trainer_diverged_is_named_diverged_not_failed(
    sandbox: VertexEmulator, tmp_path: Path
) -> None:
    """Vertex says only JOB_STATE_FAILED; the trainer's summary.json (its mirror uploads it beside the
    logs) and its exit code 7 say why. A replica that crashed (exit 1) stays "failed"."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform_v1

    client = aiplatform_v1.JobServiceClient(
        transport="rest", client_options={"api_endpoint": sandbox.url}, credentials=AnonymousCredentials()
    )
    bucket = new_bucket("vertex-diverged")
    divergence = {"step": 10, "reason": "loss is NaN", "last_finite_step": 9, "last_finite_loss": 2.25,
                  "last_good_checkpoint": "ckpt-8.pt"}  # fmt: skip
    summary = {"status": "diverged", "steps": 10, "exit_code": 7, "divergence": divergence}
    bucket.blob(f"vertex/runs/nan-lr/{run_folder.LOGS_DIR}/{run_folder.SUMMARY}").upload_from_string(
        json.dumps(summary))
    forja = Forja(project_dir=tmp_path, history=History(tmp_path / "history.db"))
    for run_id, code in (("nan-lr", 7), ("no-summary", 7), ("crashed", 1)):
        forja.history.start(run_id, name=run_id)
        client.create_custom_job(parent=PARENT, custom_job=exiting_job(run_id, bucket.name, code))

    with pytest.raises(errors.RunDiverged) as diverged:
        forja.vertex_follow("nan-lr", poll_s=0.1)
    said = diverged.value.message
    assert diverged.value.exit_code == ExitCode.DIVERGED, said
    assert "of run nan-lr diverged at step 10: loss is NaN; last finite loss 2.25 at step 9; newest " \
           "checkpoint before it: ckpt-8.pt; nothing was exported" in said, said
    record = forja.history.get("nan-lr")
    assert record.status == "diverged" and record.steps == 10 and record.message == said, record

    with pytest.raises(errors.RunDiverged):  # the summary never reached the bucket: the exit code says it
        forja.vertex_follow("no-summary", poll_s=0.1)
    assert forja.history.get("no-summary").status == "diverged"

    with pytest.raises(errors.ForjaError) as crashed:
        forja.vertex_follow("crashed", poll_s=0.1)
    assert not isinstance(crashed.value, errors.RunDiverged), crashed.value
    assert "non-zero status of 1" in crashed.value.message
    assert forja.history.get("crashed").status == "failed"


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_vertex_follow_prints_the_replicas_lines_and_ctrl_c_leaves_the_job_running(
    sandbox: VertexEmulator, tmp_path: Path
) -> None:
    new_bucket("vertex-tail")
    config = str(config_file(tmp_path, steps=1_000_000))  # runs until cancelled
    sent = CliRunner().invoke(
        app,
        [
            "train",
            config,
            "--backend",
            "vertex",
            "--bucket",
            "gs://vertex-tail",
            "--name",
            "tail",
            "--detach",
        ],
    )
    assert sent.exit_code == 0, sent.output
    # `forja vertex follow` as a person runs it: its own process, so Ctrl-C is a real SIGINT.
    follow = subprocess.Popen(
        [str(Path(sys.executable).with_name("forja")), "vertex", "follow", "tail", "--poll", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in follow.stderr], daemon=True).start()  # type: ignore[union-attr]
    seen: list[str] = []
    try:
        while not any(
            line.startswith("workerpool0-0: ") and "[rank 0] INFO training" in line for line in seen
        ):
            seen.append(lines.get(timeout=60))  # the trainer's first line, read from Cloud Logging
        follow.send_signal(signal.SIGINT)
        follow.wait(timeout=30)
    finally:
        follow.kill()
    follow.wait(5)
    said = "".join(seen)
    while not lines.empty():
        said += lines.get_nowait()
    assert follow.returncode == ExitCode.STILL_RUNNING, said
    assert "Ctrl-C stopped following it, not the run" in said and "forja vertex follow tail" in said, said
    (job,) = [j for j in sandbox.store.list(PARENT) if j.proto.display_name == "tail"]
    assert job.snapshot().state.name == "JOB_STATE_RUNNING", "Ctrl-C stopped the watching, not the job"
    assert all(r.proc is not None and r.proc.poll() is None for r in job.replicas)

    cancelled = CliRunner().invoke(app, ["vertex", "cancel", "tail"])
    assert cancelled.exit_code == 0 and "JOB_STATE_CANCELLED" in cancelled.stdout, cancelled.output


def test_a_vm_run_is_sent_again_from_its_snapshot_as_a_vertex_job(
    sandbox: VertexEmulator, tmp_path: Path
) -> None:
    """`train_again(backend="vertex")` (forja train --again RUN --backend vertex): the snapshot's config
    goes as the job's, under a new name; a run sent with -e overrides is refused, since Vertex takes none."""
    from forja import snapshot
    from forja.runs import config_hash

    new_bucket("vertex-again")
    forja = Forja(project_dir=tmp_path, history=History(tmp_path / "history.db"))
    config = config_file(tmp_path, steps=1)
    sent_with = {"script": None, "args": [], "excludes": [], "procs": None, "hooks": {}}
    for run, extravars in (("on-vm", {}), ("with-e", {"steps": 5})):
        forja.history.start(run, name=run, config_path=str(config))
        snapshot.record(forja, run, project=None, config=config,
                        options={**sent_with, "extravars": extravars})
    config.write_text("steps: 1\n")  # the user's file moved on: the snapshot's copy is what goes
    options = VertexOptions(bucket="gs://vertex-again")

    said: list[str] = []
    sent = forja.train_again("on-vm", backend="vertex", vertex=options, wait=False, say=said.append)
    assert sent.status == "running" and sent.run_id.startswith("tiny-"), sent  # named for the config given
    assert said == ["run on-vm again: the same config, no project"]
    assert forja.history.get(sent.run_id).config_hash == config_hash(snapshot.folder("on-vm") / "config.yaml")
    assert [j.proto.display_name for j in sandbox.store.list(PARENT) if j.proto.name == sent.hosts[0]] == [
        sent.run_id]
    assert forja.vertex_cancel(sent.run_id, options)

    with pytest.raises(ConfigError) as refused:
        forja.train_again("with-e", backend="vertex", vertex=options, name="never-sent")
    assert refused.value.field == "--again" and "-e steps=5" in refused.value.message
    assert "drop --backend vertex" in refused.value.message
    assert no_job_named(sandbox, "never-sent")


def no_job_named(sandbox: VertexEmulator, name: str) -> bool:
    return not [j for j in sandbox.store.list(PARENT) if j.proto.display_name == name]
