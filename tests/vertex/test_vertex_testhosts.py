"""Replicas on test hosts: each replica of a job is a process on its own machine (th42, th43, the
Deep Learning VM image with its PyTorch), reached over SSH, as Vertex gives each replica a VM.

Jobs go through Google's own aiplatform client, the lines come back through Google's own
google-cloud-logging client, and what ran is checked on the hosts themselves.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1
from google.cloud.aiplatform_v1.types import JobState

from forja_sandbox import testhosts
from forja_sandbox.vertex_emulator import VertexEmulator

pytestmark = [pytest.mark.hosts, pytest.mark.slow]
cloud_logging = pytest.importorskip("google.cloud.logging")
INDICES = (42, 43)
PROJECT = "forja-sandbox"
PARENT = f"projects/{PROJECT}/locations/us-central1"
TASK_PACKAGE = Path(__file__).parent / "task_pkg"
FINAL = (JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED)
#: A replica that says it is up and then runs until stopped; the marker finds it on a host.
PROBE = "forja-vertex-cancel-probe"
FOREVER = f"import time  # {PROBE}\nprint('up', flush=True)\nwhile True: time.sleep(0.2)"


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[testhosts.Host, ...]]:
    if os.geteuid() != 0:
        pytest.skip("test hosts need root")
    try:
        yield tuple(testhosts.up(i, image="dlvm") for i in INDICES)
    finally:
        for index in INDICES:
            testhosts.down(index)


@pytest.fixture(scope="module")
def vertex(hosts: tuple[testhosts.Host, ...]) -> Iterator[VertexEmulator]:
    with VertexEmulator(hosts=hosts) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def jobs(vertex: VertexEmulator) -> aiplatform_v1.JobServiceClient:
    return aiplatform_v1.JobServiceClient(
        transport="rest", client_options={"api_endpoint": vertex.url}, credentials=AnonymousCredentials()
    )


def wait(jobs: aiplatform_v1.JobServiceClient, name: str, until: tuple, timeout: float = 120) -> object:
    deadline = time.monotonic() + timeout
    while (job := jobs.get_custom_job(name=name)).state not in until:
        assert time.monotonic() < deadline, f"{name} is still {job.state.name}"
        time.sleep(0.1)
    return job


def test_two_replicas_meet_across_two_hosts_and_succeed(vertex, jobs, hosts) -> None:
    out = f"/tmp/forja-vertex-out/{uuid.uuid4().hex[:8]}"  # a folder on each host
    pool = {
        "machine_spec": {"machine_type": "n1-standard-4"},
        "replica_count": 1,
        "python_package_spec": {
            "executor_image_uri": "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4.py310:latest",
            "package_uris": [str(TASK_PACKAGE)],
            "python_module": "forja_vertex_task.allreduce",
        },
    }
    spec = {"worker_pool_specs": [pool, pool], "base_output_directory": {"output_uri_prefix": out}}
    job = jobs.create_custom_job(parent=PARENT, custom_job={"display_name": "on-hosts", "job_spec": spec})
    job = wait(jobs, job.name, FINAL)
    logs = {r.label: r.log.read_text()[-1500:] for r in vertex.job(job.name).replicas}
    assert job.state == JobState.JOB_STATE_SUCCEEDED, (job.error, logs)

    addresses = [f"{h.address}:2222" for h in hosts]
    for rank, host in enumerate(hosts):  # rank r ran on host r, and wrote there
        record = json.loads(host.run_as_root(f"cat {out}/model/rank{rank}.json"))
        assert record["world_size"] == 2 and record["sum"] == 3.0, record
        assert record["cluster"] == {"workerpool0": addresses[:1], "workerpool1": addresses[1:]}, record
    assert not Path(out).exists(), "the replicas wrote on the hosts, not on this machine"


def test_cancel_stops_the_replicas_on_their_hosts(vertex, jobs, hosts) -> None:
    pool = {
        "machine_spec": {"machine_type": "n1-standard-4"},
        "replica_count": 1,
        "container_spec": {"image_uri": "python:3.10-slim", "command": ["python3", "-c", FOREVER]},
    }
    job = jobs.create_custom_job(
        parent=PARENT, custom_job={"display_name": "forever", "job_spec": {"worker_pool_specs": [pool, pool]}}
    )
    logs = cloud_logging.Client(
        project=PROJECT, credentials=AnonymousCredentials(), _use_grpc=False,
        client_options={"api_endpoint": vertex.url},
    )  # fmt: skip
    job_id = job.name.rsplit("/", 1)[1]
    query = f'resource.type="ml_job" AND resource.labels.job_id="{job_id}" AND textPayload="up"'
    deadline = time.monotonic() + 60
    while len(up := {e.resource.labels["task_name"] for e in logs.list_entries(filter_=query)}) < 2:
        assert time.monotonic() < deadline, f"replicas up: {up}"
        time.sleep(0.2)
    for host in hosts:
        assert PROBE in host.run_as_root(f"pgrep -af '{PROBE[:-1]}[{PROBE[-1]}]' || true"), host.name

    jobs.cancel_custom_job(name=job.name)
    job = wait(jobs, job.name, FINAL, timeout=30)
    assert job.state == JobState.JOB_STATE_CANCELLED, job
    for host in hosts:
        left = host.run_as_root(f"pgrep -af '{PROBE[:-1]}[{PROBE[-1]}]' || true")
        assert PROBE not in left, f"{host.name} still runs: {left}"
    assert all(r.proc is not None and r.proc.poll() is not None for r in vertex.job(job.name).replicas)
