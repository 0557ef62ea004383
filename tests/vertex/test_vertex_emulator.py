"""The sandbox's Vertex AI emulator, driven by Google's own client (google-cloud-aiplatform, REST).

The client builds the URLs, serializes the CustomJob and reads the errors exactly as against
Vertex (over REST, google-api-core raises by HTTP status: a 400 is ``BadRequest``, whatever its
google.rpc status); only ``api_endpoint`` (the emulator's ``http://`` URL, which the REST transport keeps as
given) and anonymous credentials differ. Replicas are real local processes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import requests
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1
from google.cloud.aiplatform_v1.types import CustomJob, JobState

from forja_sandbox.vertex_emulator import VertexEmulator

TASK_PACKAGE = Path(__file__).parent / "task_pkg"
PARENT = "projects/forja-sandbox/locations/us-central1"
#: A prebuilt PyTorch training image: Vertex requires it, the emulator runs this Python instead.
EXECUTOR = "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4.py310:latest"
FINAL = (JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED)


@pytest.fixture(scope="module")
def client(emulator: VertexEmulator) -> aiplatform_v1.JobServiceClient:
    return aiplatform_v1.JobServiceClient(
        transport="rest",
        client_options={"api_endpoint": emulator.url},
        credentials=AnonymousCredentials(),
    )


def package_pool(module: str, **machine: object) -> dict:
    return {
        "machine_spec": {"machine_type": "n1-standard-4", **machine},
        "replica_count": 1,
        "python_package_spec": {
            "executor_image_uri": EXECUTOR,
            "package_uris": [str(TASK_PACKAGE)],
            "python_module": module,
            "env": [{"name": "RUN_NAME", "value": "tiny-allreduce"}],
        },
    }


def command_pool(code: str, replicas: int = 1) -> dict:
    return {
        "machine_spec": {"machine_type": "n1-standard-4"},
        "replica_count": replicas,
        "container_spec": {"image_uri": "python:3.11-slim", "command": [sys.executable, "-c", code]},
    }


def wait_for(
    client: aiplatform_v1.JobServiceClient, name: str, states: tuple, timeout: float = 60
) -> CustomJob:
    """Poll get_custom_job as a user's script would, until the job is in one of ``states``."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get_custom_job(name=name)
        if not seen or seen[-1] != job.state:
            seen.append(job.state)
        if job.state in states:
            return job
        time.sleep(0.05)
    raise AssertionError(f"{name} never reached {states}; states seen: {[JobState(s).name for s in seen]}")


def test_two_replicas_run_torch_distributed_to_success(client, emulator, tmp_path: Path) -> None:
    pool = package_pool("forja_vertex_task.allreduce")
    created = client.create_custom_job(
        parent=PARENT,
        custom_job={
            "display_name": "tiny-allreduce",
            "job_spec": {
                "worker_pool_specs": [pool, pool],
                "base_output_directory": {"output_uri_prefix": str(tmp_path)},
            },
        },
    )
    assert created.state == JobState.JOB_STATE_QUEUED
    assert created.name.startswith(f"{PARENT}/customJobs/")

    done = wait_for(client, created.name, FINAL)

    logs = {r.label: r.log.read_text() for r in emulator.job(created.name).replicas}
    assert done.state == JobState.JOB_STATE_SUCCEEDED, logs
    assert done.start_time and done.end_time >= done.start_time
    records = [json.loads((tmp_path / "model" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["sum"] for r in records] == [3.0, 3.0]  # 1 + 2: both replicas met in one process group
    assert [r["task"] for r in records] == [
        {"type": "workerpool0", "index": 0},
        {"type": "workerpool1", "index": 0},
    ]
    assert records[0]["cluster"] == records[1]["cluster"] and set(records[0]["cluster"]) == {
        "workerpool0",
        "workerpool1",
    }
    assert records[0]["checkpoint_dir"] == f"{tmp_path}/checkpoints/"
    assert records[0]["tensorboard_dir"] == f"{tmp_path}/logs/"
    assert records[0]["job_id"] == created.name.rsplit("/", 1)[1]
    assert records[0]["run_name"] == "tiny-allreduce"  # the pool's own env reached the replica
    listed = [j.name for j in client.list_custom_jobs(parent=PARENT)]
    assert created.name in listed


def test_cancel_stops_every_replica(client, emulator) -> None:
    sleeper = command_pool("import time; time.sleep(600)")
    created = client.create_custom_job(
        parent=PARENT,
        custom_job={"display_name": "sleeper", "job_spec": {"worker_pool_specs": [sleeper, sleeper]}},
    )
    wait_for(client, created.name, (JobState.JOB_STATE_RUNNING,))
    pids = [r.proc.pid for r in emulator.job(created.name).replicas]
    assert len(pids) == 2 and all(Path(f"/proc/{pid}").exists() for pid in pids)

    client.cancel_custom_job(name=created.name)

    job = wait_for(client, created.name, FINAL, timeout=15)
    assert job.state == JobState.JOB_STATE_CANCELLED
    assert (job.error.code, job.error.message) == (1, "CANCELED")
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def test_cancel_of_a_finished_job_is_refused(client) -> None:
    created = client.create_custom_job(
        parent=PARENT,
        custom_job={"display_name": "quick", "job_spec": {"worker_pool_specs": [command_pool("pass")]}},
    )
    wait_for(client, created.name, FINAL)
    with pytest.raises(exceptions.BadRequest, match="JOB_STATE_SUCCEEDED"):
        client.cancel_custom_job(name=created.name)


def test_a_replica_that_fails_fails_the_job_and_stops_the_others(client, emulator) -> None:
    pools = [command_pool("import time; time.sleep(600)"), command_pool("import sys; sys.exit(3)")]
    created = client.create_custom_job(
        parent=PARENT, custom_job={"display_name": "fails", "job_spec": {"worker_pool_specs": pools}}
    )
    job = wait_for(client, created.name, FINAL, timeout=15)
    assert job.state == JobState.JOB_STATE_FAILED
    assert job.error.message == "The replica workerpool1-0 exited with a non-zero status of 3."
    assert all(r.proc.poll() is not None for r in emulator.job(created.name).replicas)


@pytest.mark.parametrize(
    ("machine", "message"),
    [
        (
            {"machine_type": "n1-standard-4", "accelerator_type": "NVIDIA_L4", "accelerator_count": 1},
            'Accelerator "NVIDIA_L4" is not supported for machine type "n1-standard-4".',
        ),
        (
            {"machine_type": "g2-standard-8", "accelerator_type": "NVIDIA_L4", "accelerator_count": 2},
            'Accelerator "NVIDIA_L4" is not supported for machine type "g2-standard-8".',
        ),
        (
            {"machine_type": "e2-standard-4", "accelerator_type": "NVIDIA_TESLA_T4", "accelerator_count": 1},
            'Accelerator "NVIDIA_TESLA_T4" is not supported for machine type "e2-standard-4".',
        ),
    ],
)
def test_a_bad_machine_and_accelerator_is_refused_with_googles_message(
    client, emulator, machine, message
) -> None:
    before = len(emulator.store.list(PARENT))
    pool = package_pool("forja_vertex_task.allreduce", **machine)
    with pytest.raises(exceptions.BadRequest) as refused:
        client.create_custom_job(
            parent=PARENT, custom_job={"display_name": "bad", "job_spec": {"worker_pool_specs": [pool]}}
        )
    assert refused.value.message.split(": ", 1)[1].startswith(message)  # "POST <url>: <Google's message>"
    error = refused.value.response.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert error["details"][0]["fieldViolations"][0]["field"].startswith(
        "job_spec.worker_pool_specs[0].machine_spec."
    )
    assert len(emulator.store.list(PARENT)) == before  # nothing was created


def test_a_region_without_the_accelerator_is_refused(client) -> None:
    pool = package_pool(
        "forja_vertex_task.allreduce", accelerator_type="NVIDIA_TESLA_V100", accelerator_count=1
    )
    with pytest.raises(
        exceptions.BadRequest, match='"NVIDIA_TESLA_V100" is not supported in region "us-east1"'
    ):
        client.create_custom_job(
            parent="projects/forja-sandbox/locations/us-east1",
            custom_job={"display_name": "v100", "job_spec": {"worker_pool_specs": [pool]}},
        )


def test_accelerator_type_without_a_count_is_refused_as_vertex_does(client) -> None:
    pool = package_pool("forja_vertex_task.allreduce", accelerator_type="NVIDIA_TESLA_T4")
    with pytest.raises(exceptions.BadRequest) as refused:
        client.create_custom_job(
            parent=PARENT, custom_job={"display_name": "t4", "job_spec": {"worker_pool_specs": [pool]}}
        )
    assert (
        "1.Field: job_spec.worker_pool_specs[0].machine_spec.accelerator_type; "
        "Message: Both `accelerator_type` and `accelerator_count` should be specified or none."
    ) in refused.value.message


def test_a_body_with_an_unknown_field_is_refused(emulator) -> None:
    body = {
        "displayName": "typo",
        "jobSpec": {"workerPoolSpecs": [{"machineSpec": {"machineType": "n1-standard-4", "gpuCount": 1}}]},
    }
    url = f"{emulator.url}/v1/{PARENT}/customJobs"
    answer = requests.post(url, json=body, timeout=10)
    error = exceptions.from_http_response(answer)  # google-api-core reads the answer as for Vertex
    assert isinstance(error, exceptions.BadRequest)
    assert error.message.endswith(
        'Invalid JSON payload received. Unknown name "gpuCount" at '
        "'custom_job.job_spec.worker_pool_specs[0].machine_spec': Cannot find field."
    )
    assert answer.json()["error"]["details"][0]["fieldViolations"][0]["field"] == (
        "custom_job.job_spec.worker_pool_specs[0].machine_spec"
    )


def test_get_of_an_unknown_job_is_not_found(client) -> None:
    with pytest.raises(exceptions.NotFound):
        client.get_custom_job(name=f"{PARENT}/customJobs/42")


def test_replicas_are_gone_when_the_emulator_stops(tmp_path: Path) -> None:
    emu = VertexEmulator(work_dir=tmp_path).start()
    client = aiplatform_v1.JobServiceClient(
        transport="rest", client_options={"api_endpoint": emu.url}, credentials=AnonymousCredentials()
    )
    created = client.create_custom_job(
        parent=PARENT,
        custom_job={
            "display_name": "orphan",
            "job_spec": {"worker_pool_specs": [command_pool("import time; time.sleep(600)")]},
        },
    )
    wait_for(client, created.name, (JobState.JOB_STATE_RUNNING,))
    pid = emu.job(created.name).replicas[0].proc.pid
    emu.stop()
    assert not Path(f"/proc/{pid}").exists()
    assert os.listdir(tmp_path)  # a given work_dir keeps the replicas' logs
