"""The user's own code on Vertex AI: `forja train --script --project --backend vertex` and `--image`.

The project goes up as forja builds it (forja_bundle's archive in an sdist, the project's
requirements as its dependencies) to the Cloud Storage emulator, the Vertex emulator runs each
replica as local processes (trainer.vertex_launch: torchrun, the run contract), and trainer.runlib
mirrors checkpoints, logs and the summary to the bucket, from where forja fetches them. Google's
own clients read the bucket; forja's own Vertex client sends the job.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from trainer_helpers import subprocess_env

from forja.api import Forja
from forja.errors import ConfigError, ForjaError
from forja.history import History
from forja.vertex_job import VertexOptions
from forja_sandbox.vertex_emulator import VertexEmulator
from forja_sandbox.vertex_emulator.jobs import TERMINAL
from trainer import run_folder, vertex_launch

storage = pytest.importorskip("google.cloud.storage")
REPO = Path(__file__).resolve().parents[2]
OWN_LOOP = REPO / "examples" / "own-loop"
PARENT = "projects/forja-sandbox/locations/us-central1"
#: An image the emulator "has": its entrypoint, a few steps of trainer.runlib (see IMAGE_CODE).
IMAGE = "us-central1-docker.pkg.dev/forja-sandbox/train/own:1"
IMAGE_CODE = """
import os, sys
from trainer import runlib
with runlib.Run(total_steps=3, config={"args": sys.argv[1:]}, render_plots=False) as run:
    for step in range(run.start_step + 1, 4):
        run.log(step, loss=1.0 / step, lr=0.1, samples=8)
        run.save({"model": {}}, step)
print("image ran", os.environ["FORJA_RUN"], os.environ["FORJA_WORLD_SIZE"], *sys.argv[1:], flush=True)
"""


@pytest.fixture(scope="module")
def emulator() -> Any:
    """The Vertex emulator with one image it can "pull" (its entrypoint, run as a local process)."""
    with VertexEmulator(images={IMAGE: [sys.executable, "-c", IMAGE_CODE]}) as emu:
        yield emu


def new_bucket(name: str) -> Any:
    return storage.Client().create_bucket(name)


def blobs(bucket: Any, prefix: str = "") -> dict[str, int]:
    return {b.name: b.generation for b in bucket.client.list_blobs(bucket.name, prefix=prefix)}


def project_copy(tmp_path: Path) -> Path:
    project = tmp_path / "own-loop"
    shutil.copytree(OWN_LOOP, project, ignore=shutil.ignore_patterns("__pycache__", "forja-run*"))
    return project


def no_jobs(sandbox: VertexEmulator, *names: str) -> bool:
    return not [j for j in sandbox.store.list(PARENT) if j.proto.display_name in names]


def reference_run(run_dir: Path, deps: Path, *args: str) -> dict[str, Any]:
    """The example as forja's VM launcher runs it on one host: torchrun, 4 processes, the contract."""
    env = subprocess_env(FORJA_RUN=run_dir.name, FORJA_RUN_DIR=str(run_dir), FORJA_NPROC_PER_NODE="4",
                         FORJA_WORLD_SIZE="4", OMP_NUM_THREADS="1")  # fmt: skip
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{deps}"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
         "--max_restarts=0", "train.py", *args],
        cwd=OWN_LOOP, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return dict(json.loads((run_dir / run_folder.SUMMARY).read_text()))


@pytest.mark.slow  # two replicas x two torch processes, started twice, and a reference: the host tier's
def test_the_own_loop_example_runs_on_two_replicas_of_two_gpus_and_resumes_after_a_replica_is_lost(
    sandbox: VertexEmulator, tmp_path: Path
) -> None:
    """The issue's goal: examples/own-loop with --script on 2 x g2-standard-24 (2 L4 each: two
    processes per replica, world size 4); replica 1's machine fails after the first checkpoint
    reached the bucket; Vertex restarts the job (restartJobOnWorkerRestart) on fresh disks, it
    resumes from the bucket, and ends with the same final loss as the same run on one host as forja's
    VM launcher runs it (torchrun, 4 processes, seed 0)."""
    bucket = new_bucket("vertex-own-loop")
    project = project_copy(tmp_path)
    forja = Forja(project_dir=project, history=History(tmp_path / "history.db"))
    options = VertexOptions(bucket="gs://vertex-own-loop", machine_type="g2-standard-24", replica_count=2)
    args = ["--steps", "20", "--log-every", "5", "--save-every", "5"]
    sent = forja.train(script="train.py", project=project, args=[*args, "--pause-s", "0.15"],
                       name="own-vertex", backend="vertex", vertex=options, wait=False)  # fmt: skip
    job = sandbox.job(sent.hosts[0])
    pool = job.proto.job_spec.worker_pool_specs[0]
    assert pool.machine_spec.accelerator_count == 2
    assert job.proto.job_spec.scheduling.restart_job_on_worker_restart
    spec = pool.python_package_spec
    assert spec.python_module == "trainer.vertex_launch"
    assert list(spec.args) == ["--nproc-per-node", "2", "--", "train.py", *args, "--pause-s", "0.15"]
    env = {e.name: e.value for e in spec.env}
    assert env["FORJA_CHECKPOINT_BUCKET"] == "gs://vertex-own-loop/vertex/runs"
    assert (env["FORJA_RUN"], env["FORJA_NNODES"], env["FORJA_WORLD_SIZE"]) == ("own-vertex", "2", "4")

    first = "vertex/runs/own-vertex/checkpoints/ckpt-5.pt.complete.json"
    deadline = time.monotonic() + 240
    while not bucket.blob(first).exists():
        assert job.proto.state not in TERMINAL, "the job ended before its first checkpoint"
        assert time.monotonic() < deadline, [r.log.read_text()[-1500:] for r in job.replicas]
        time.sleep(0.2)
    sandbox.fail_replica(sent.hosts[0], "workerpool1-0")
    said: list[str] = []
    result = forja.vertex_follow("own-vertex", options, poll_s=0.2, on_event=lambda e: said.append(e.text))

    logs = {r.label: r.log.read_text()[-3000:] for r in job.replicas}
    assert result.status == "completed", logs
    assert [r.restarts for r in job.replicas] == [1, 1], "the whole job restarted with the lost replica"
    summary = result.summary
    assert (summary["status"], summary["steps"], summary["world_size"]) == ("completed", 20, 4), summary
    resumed = summary["resumed_from_step"]
    assert resumed is not None and 5 <= resumed < 20 and summary["restarts"] == 1, summary
    assert "processes    4" in "\n".join(said), "the table printed by the project's own dependency (tabulate)"
    # Results came back as a VM run's do: in the bucket, and fetched into forja-runs/<run>/vertex/.
    names = blobs(bucket, "vertex/runs/own-vertex/")
    assert {"vertex/runs/own-vertex/logs/summary.json", "vertex/runs/own-vertex/logs/metrics.jsonl",
            "vertex/runs/own-vertex/checkpoints/ckpt-20.pt", "vertex/runs/own-vertex/model/model.pt",
            } <= set(names), sorted(names)  # fmt: skip
    folder = project / "forja-runs" / "own-vertex" / "vertex"
    fetched = json.loads((folder / run_folder.SUMMARY).read_text())
    # the trainer's own cost is the result's training_usd, a part of the run's cost (cost_usd), not in summary
    assert result.artifact_dir == folder and {**summary, "cost_usd": result.training_usd} == fetched
    assert (folder / run_folder.MODEL_DIR / "model.pt").is_file()
    steps = [json.loads(line)["step"] for line in (folder / run_folder.METRICS).read_text().splitlines()]
    assert steps == list(range(5, 21, 5)), "each step logged once: no restart from 0, no repeat"
    record = forja.history.get("own-vertex")  # what forja runs lists, and forja cost --run prices:
    assert (record.status, record.artifact_dir, record.steps, record.last_loss) == (
        "completed", str(folder), 20, summary["final_loss"])
    cost = forja.run_cost("own-vertex")
    assert cost.usd_per_hour > 0 and "config.yaml" in cost.rate_source, cost
    assert dict((p.name, p.seconds) for p in cost.parts)["compute"], cost.parts

    # The same run as forja's launcher runs it on one VM: world size 4, seed 0, never interrupted. Equal
    # to float32's last bits: unbroken, 2 x 2 on Vertex and 1 x 4 end bit-identical; resumed from an
    # interval checkpoint, both here and on one host, the mean loss was seen 1 ulp (1e-7) off the
    # unbroken run's, so the bound is 1e-6: a resume that lost state is off by far more.
    reference = reference_run(tmp_path / "reference", Path(job.folder) / "packages", *args)  # its tabulate
    assert summary["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-6, abs=0), (
        summary["final_loss"], reference["final_loss"])

    # A second submission of the unchanged project uploads nothing: the package is there by its hash.
    before = blobs(bucket, "vertex/packages/")
    again = forja.train(script="train.py", project=project, args=args, name="own-again", backend="vertex",
                        vertex=options, wait=False)  # fmt: skip
    assert blobs(bucket, "vertex/packages/") == before and len(before) == 1
    assert list(sandbox.job(again.hosts[0]).proto.job_spec.worker_pool_specs[0].python_package_spec
                .package_uris) == list(spec.package_uris)  # fmt: skip
    assert forja.vertex_cancel("own-again")["state"] == "JOB_STATE_CANCELLED"


def test_bad_input_is_refused_before_anything_is_uploaded(sandbox: VertexEmulator, tmp_path: Path) -> None:
    """A script outside the project, a requirements file that does not resolve (or that pip options
    fill), a machine that cannot take the accelerator count, an image Vertex cannot pull: each is a
    ConfigError naming the field, with nothing in the bucket and no job."""
    bucket = new_bucket("vertex-own-refused")
    project = project_copy(tmp_path)
    forja = Forja(project_dir=project, history=History(tmp_path / "history.db"))
    options = VertexOptions(bucket="gs://vertex-own-refused")

    def refused(field: str, **how: Any) -> str:
        vertex = how.pop("vertex", options)
        with pytest.raises(ConfigError) as caught:
            forja.train(name="refused", backend="vertex", vertex=vertex, **how)
        assert caught.value.field == field, caught.value.message
        return caught.value.message

    (tmp_path / "elsewhere.py").write_text("print('hi')\n")
    said = refused("script", script=str(tmp_path / "elsewhere.py"), project=project)
    assert "is not inside the project" in said
    (project / "requirements.txt").write_text("tabulate>=0.9\nno-such-package-forja-test==1.0\n")
    said = refused("requirements", script="train.py", project=project)
    assert "does not resolve" in said and "no-such-package-forja-test" in said, said
    (project / "requirements.txt").write_text("-e ../lib\n")
    assert "line 1" in refused("requirements", script="train.py", project=project)
    (project / "requirements.txt").write_text("tabulate>=0.9\n")
    said = refused("accelerator_count", script="train.py", project=project,
                   vertex=VertexOptions(bucket=options.bucket, accelerator_count=2))  # g2-standard-8: one L4
    assert "g2-standard-8" in said and "--accelerator-count" in said, said
    said = refused("image", args=["--lr", "1"], vertex=VertexOptions(bucket=options.bucket,
                                                                      image="docker.io/library/python:3.11"))
    assert "cannot pull from" in said and "docker.pkg.dev" in said, said
    refused("image", vertex=VertexOptions(bucket=options.bucket, image="us-docker.pkg.dev/only-project:1"))
    with_image = VertexOptions(bucket=options.bucket, image=IMAGE)
    refused("script", script="train.py", project=project, vertex=with_image)
    refused("procs", script="train.py", project=project, procs=0)
    assert blobs(bucket) == {}, "nothing was uploaded"
    assert no_jobs(sandbox, "refused")


def test_an_image_runs_its_entrypoint_with_the_contract_and_its_results_come_back(
    sandbox: VertexEmulator, tmp_path: Path
) -> None:
    bucket = new_bucket("vertex-own-image")
    forja = Forja(project_dir=tmp_path, history=History(tmp_path / "history.db"))
    result = forja.train(args=["--lr", "3e-4"], name="own-image", backend="vertex", poll_s=0.1,
                         vertex=VertexOptions(bucket="gs://vertex-own-image", image=IMAGE))  # fmt: skip
    job = sandbox.job(result.hosts[0])
    assert result.status == "completed", [r.log.read_text()[-2000:] for r in job.replicas]
    container = job.proto.job_spec.worker_pool_specs[0].container_spec
    assert (container.image_uri, list(container.command)) == (IMAGE, [])
    assert list(container.args) == ["--lr", "3e-4"]
    assert "image ran own-image 1 --lr 3e-4" in job.replicas[0].log.read_text()
    assert result.summary["steps"] == 3 and result.summary["final_loss"] == pytest.approx(1 / 3)
    assert "vertex/runs/own-image/checkpoints/ckpt-3.pt" in blobs(bucket, "vertex/runs/own-image/")
    assert (tmp_path / "forja-runs" / "own-image" / "vertex" / run_folder.METRICS).is_file()


def test_an_image_the_emulator_does_not_have_fails_the_job_as_an_image_vertex_cannot_pull(
    sandbox: VertexEmulator, tmp_path: Path
) -> None:
    new_bucket("vertex-own-nopull")
    forja = Forja(project_dir=tmp_path, history=History(tmp_path / "history.db"))
    image = "us-docker.pkg.dev/forja-sandbox/train/none:1"
    with pytest.raises(ForjaError, match=re.escape(f"Unable to pull the image {image}")):
        forja.train(name="no-pull", backend="vertex", poll_s=0.1,
                    vertex=VertexOptions(bucket="gs://vertex-own-nopull", image=image))
    assert forja.history.get("no-pull").status == "failed"


@pytest.mark.parametrize(
    ("spec", "env", "node"),
    [
        ({}, {}, (1, 0, "127.0.0.1", 29500)),
        ({"cluster": {"workerpool0": ["a:2222"], "workerpool1": ["b:2222", "c:2222"]},
          "task": {"type": "workerpool1", "index": 1}}, {}, (3, 2, "a", 2222)),
        ({"cluster": {"workerpool0": ["a:2222"], "workerpool1": ["b:2222"]},
          "task": {"type": "workerpool0", "index": 0}}, {"MASTER_ADDR": "m", "MASTER_PORT": "1234"},
         (2, 0, "m", 1234)),
    ],
)  # fmt: skip
def test_a_replica_finds_its_node_rank_and_node_0_in_vertex_s_cluster_spec(
    spec: dict[str, Any], env: dict[str, str], node: tuple[int, int, str, int]
) -> None:
    assert vertex_launch.node_of({"CLUSTER_SPEC": json.dumps(spec), **env}) == node


def test_a_lost_replica_restarts_alone_unless_the_job_restarts_every_worker(
    sandbox: VertexEmulator, tmp_path: Path
) -> None:
    """The emulator's stand-in for a failed machine: without restartJobOnWorkerRestart only that
    replica starts again (on an empty working folder); the other one's process is left alone."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform_v1

    client = aiplatform_v1.JobServiceClient(transport="rest", client_options={"api_endpoint": sandbox.url},
                                            credentials=AnonymousCredentials())  # fmt: skip
    code = ("import os, pathlib, time; print(sorted(os.listdir('.')), flush=True); "
            "pathlib.Path('mark').touch(); time.sleep(60)")
    pool = {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
            "container_spec": {"image_uri": IMAGE, "command": [sys.executable, "-c", code]}}  # fmt: skip
    job = client.create_custom_job(parent=PARENT, custom_job={
        "display_name": "lost-one", "job_spec": {"worker_pool_specs": [pool, pool]}})  # fmt: skip
    record = sandbox.job(job.name)
    deadline = time.monotonic() + 30
    while len(record.replicas) < 2 or not all(r.cwd and (r.cwd / "mark").exists() for r in record.replicas):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    kept, lost = record.replicas[0].proc.pid, record.replicas[1].proc.pid
    sandbox.fail_replica(job.name, "workerpool1-0")
    while record.replicas[1].proc.pid == lost or not (record.replicas[1].cwd / "mark").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert record.replicas[0].proc.pid == kept and record.replicas[0].proc.poll() is None
    assert [r.restarts for r in record.replicas] == [0, 1]
    # Each run lists its folder before it leaves its mark: the second listing is empty too.
    while len(record.replicas[1].log.read_text().splitlines()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    listed = record.replicas[1].log.read_text().splitlines()
    assert listed == ["[]", "[]"], "a restarted replica's folder is empty"
    client.cancel_custom_job(name=job.name)


def test_the_cli_refuses_an_image_from_a_registry_vertex_cannot_pull_and_an_image_without_vertex(
    sandbox: VertexEmulator, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from forja.cli import app
    from forja.errors import ExitCode

    runner = CliRunner()
    vertex = ["--backend", "vertex", "--bucket", "gs://vertex-own-cli"]
    hub = runner.invoke(app, ["--json", "train", *vertex, "--image", "python:3.11", "--", "--lr", "1"])
    assert hub.exit_code == ExitCode.USAGE, hub.output
    refused = json.loads(hub.stdout)
    assert refused["field"] == "image" and "in the registry docker.io" in refused["message"], refused
    vm = runner.invoke(app, ["--json", "train", "--image", IMAGE])
    assert vm.exit_code == ExitCode.USAGE and json.loads(vm.stdout)["field"] == "--image", vm.output
    assert not [j for j in sandbox.store.list(PARENT) if "python:3.11" in str(j.proto.job_spec)]


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("us-central1-docker.pkg.dev/p/repo/train:1", None),
        ("europe-docker.pkg.dev/p/repo/team/train@sha256:" + "a" * 64, None),
        ("gcr.io/p/train", None),
        ("eu.gcr.io/p/train:v2", None),
        ("python:3.11", "in the registry docker.io"),
        ("ghcr.io/me/train:1", "in the registry ghcr.io"),
        ("us-docker.pkg.dev/p/train:1", "PROJECT/REPOSITORY/IMAGE"),
        ("gcr.io/train", "PROJECT/IMAGE"),
        ("us-docker.pkg.dev/P/Repo/Train", "is not an image reference"),
        ("", "is not an image reference"),
    ],
)  # fmt: skip
def test_an_image_uri_is_judged_by_its_form_and_its_registry(uri: str, why: str | None) -> None:
    from forja.vertex_job import vertex_module

    vertex = vertex_module()
    if why is None:
        vertex.check_image_uri(uri, "image")
        return
    with pytest.raises(vertex.VertexSpecError, match=re.escape(why)):
        vertex.check_image_uri(uri, "image")


def test_procs_sets_the_processes_per_replica_and_the_contract_s_world_size(tmp_path: Path) -> None:
    from forja.vertex_job import OwnCode, job_body

    code = OwnCode(tmp_path, "train.py", ("--lr", "1"), (), procs=3)
    body = job_body("r", VertexOptions(replica_count=2), "gs://b/p.tar.gz", "gs://b/vertex/runs", code)
    primary, rest = body["jobSpec"]["workerPoolSpecs"]
    assert (primary["replicaCount"], rest["replicaCount"]) == (1, 1)
    spec = primary["pythonPackageSpec"]
    assert spec["args"] == ["--nproc-per-node", "3", "--", "train.py", "--lr", "1"]
    env = {e["name"]: e["value"] for e in spec["env"]}
    assert (env["FORJA_NPROC_PER_NODE"], env["FORJA_NNODES"], env["FORJA_WORLD_SIZE"]) == ("3", "2", "6")
    assert primary["machineSpec"] == {"machineType": "g2-standard-8", "acceleratorType": "NVIDIA_L4",
                                      "acceleratorCount": 1}  # fmt: skip
