"""The replicas' output as Cloud Logging entries, read with Google's own google-cloud-logging client.

The client (HTTP/JSON transport, ``_use_grpc=False``) builds the ``POST v2/entries:list`` body,
pages and parses the entries exactly as against logging.googleapis.com; only ``api_endpoint``
(the emulator's URL, which serves Vertex and Logging on one port) and anonymous credentials differ.
The jobs are made with Google's aiplatform client; their replicas are real local processes.
"""

from __future__ import annotations

import sys
import time

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1
from google.cloud.aiplatform_v1.types import JobState

from forja_sandbox.vertex_emulator import VertexEmulator

cloud_logging = pytest.importorskip("google.cloud.logging")
PROJECT = "forja-sandbox"
PARENT = f"projects/{PROJECT}/locations/us-central1"
#: Each replica: two stdout lines around one stderr line, named by its rank.
CHATTY = (
    "import os, sys; r = os.environ['RANK']; print(f'first {r}', flush=True); "
    "print(f'warning {r}', file=sys.stderr, flush=True); print(f'last {r}', flush=True)"
)


@pytest.fixture(scope="module")
def jobs(emulator: VertexEmulator) -> aiplatform_v1.JobServiceClient:
    return aiplatform_v1.JobServiceClient(
        transport="rest", client_options={"api_endpoint": emulator.url}, credentials=AnonymousCredentials()
    )


@pytest.fixture(scope="module")
def logs(emulator: VertexEmulator) -> cloud_logging.Client:
    return cloud_logging.Client(
        project=PROJECT,
        credentials=AnonymousCredentials(),
        _use_grpc=False,
        client_options={"api_endpoint": emulator.url},
    )


def run_job(jobs: aiplatform_v1.JobServiceClient, code: str, replicas: int) -> str:
    """A job of ``replicas`` processes running ``code``, to its end; its id."""
    pool = {
        "machine_spec": {"machine_type": "n1-standard-4"},
        "replica_count": 1,
        "container_spec": {"image_uri": "python:3.11-slim", "command": [sys.executable, "-c", code]},
    }
    spec = {"worker_pool_specs": [pool, *([{**pool, "replica_count": replicas - 1}] if replicas > 1 else [])]}
    job = jobs.create_custom_job(parent=PARENT, custom_job={"display_name": "chatty", "job_spec": spec})
    deadline = time.monotonic() + 60
    final = (JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED)
    while (job := jobs.get_custom_job(name=job.name)).state not in final:
        assert time.monotonic() < deadline, f"{job.name} is still {job.state.name}"
        time.sleep(0.05)
    assert job.state == JobState.JOB_STATE_SUCCEEDED, job.error
    return job.name.rsplit("/", 1)[1]


def of_job(job_id: str, more: str = "") -> str:
    return f'resource.type="ml_job" AND resource.labels.job_id="{job_id}"' + (f" AND {more}" if more else "")


def test_each_replica_line_is_an_ml_job_entry_once_the_job_is_over(jobs, logs) -> None:
    job_id = run_job(jobs, CHATTY, replicas=2)
    other = run_job(jobs, "print('another job')", replicas=1)

    # No timestamp in the filter: the client adds its own last-24-hours bound, as against Google.
    entries = list(logs.list_entries(filter_=of_job(job_id)))
    got = [(e.resource.labels["task_name"], e.severity, e.payload) for e in entries]
    for rank, task in enumerate(("workerpool0-0", "workerpool1-0")):
        mine = [g for g in got if g[0] == task]
        assert [m[2] for m in mine if m[1] == "INFO"] == [f"first {rank}", f"last {rank}"], got
        assert (task, "ERROR", f"warning {rank}") in mine, got
    assert len(got) == 6 and all(e.resource.type == "ml_job" for e in entries)
    assert {e.resource.labels["job_id"] for e in entries} == {job_id}, "another job's lines are not in"
    assert entries[0].log_name == f"projects/{PROJECT}/logs/{entries[0].resource.labels['task_name']}"
    keys = [(e.timestamp, e.insert_id) for e in entries]
    assert keys == sorted(keys), "oldest first, equal timestamps by insertId"
    assert len(set(e.insert_id for e in entries)) == 6

    newest_first = list(logs.list_entries(filter_=of_job(job_id), order_by=cloud_logging.DESCENDING))
    assert [e.insert_id for e in newest_first] == [e.insert_id for e in reversed(entries)]

    one = list(logs.list_entries(filter_=of_job(job_id, 'resource.labels.task_name="workerpool1-0"')))
    assert [e.payload for e in one if e.severity == "INFO"] == ["first 1", "last 1"]
    errors_only = list(logs.list_entries(filter_=of_job(job_id, "severity>=ERROR")))
    assert sorted(e.payload for e in errors_only) == ["warning 0", "warning 1"]
    assert [e.payload for e in logs.list_entries(filter_=of_job(other))] == ["another job"]


def test_pages_and_timestamp_bounds_follow_googles_rules(jobs, logs) -> None:
    job_id = run_job(jobs, "for i in range(5): print(f'line {i}', flush=True)", replicas=1)
    paged = list(logs.list_entries(filter_=of_job(job_id), page_size=2))  # three requests
    assert [e.payload for e in paged] == [f"line {i}" for i in range(5)]

    third = paged[2].timestamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    later = list(logs.list_entries(filter_=of_job(job_id, f'timestamp>="{third}"')))
    assert [e.payload for e in later] == ["line 2", "line 3", "line 4"]
    after = list(logs.list_entries(filter_=of_job(job_id, f'timestamp>"{third}"')))
    assert [e.payload for e in after] == ["line 3", "line 4"]


def test_what_the_subset_cannot_read_is_refused_not_ignored(jobs, logs) -> None:
    with pytest.raises(exceptions.BadRequest, match="joined by AND"):
        list(logs.list_entries(filter_='resource.labels.job_id="1" OR resource.labels.job_id="2"'))
    with pytest.raises(exceptions.BadRequest, match="pageSize"):
        list(logs.list_entries(filter_=of_job("1"), page_size=1001))
