"""forja's own trainer as a Vertex custom job: two replicas, set up only by what Vertex gives them.

The trainer knows nothing of Vertex; it reads torch.distributed's env:// variables (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), which the emulator sets as Vertex's PyTorch images do. The
job goes through Google's own client, so this is the path a user's `CustomJob` takes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1
from google.cloud.aiplatform_v1.types import JobState
from trainer_helpers import REPO, tiny_digits

from forja_sandbox.vertex_emulator import VertexEmulator
from trainer import run_folder

FINAL = (JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED)


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_the_trainer_runs_ddp_across_two_replicas(emulator: VertexEmulator, tmp_path: Path) -> None:
    config = tmp_path / "digits.yaml"
    config.write_text(yaml.safe_dump(tiny_digits(tmp_path, steps=20)))
    pool = {
        "machine_spec": {"machine_type": "n1-standard-4"},
        "replica_count": 1,
        "python_package_spec": {
            "executor_image_uri": "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4.py310:latest",
            "package_uris": [str(REPO)],  # the checkout, whose top level holds the trainer package
            "python_module": "trainer",
            "args": ["train", "--config", str(config)],
            "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
        },
    }
    client = aiplatform_v1.JobServiceClient(
        transport="rest", client_options={"api_endpoint": emulator.url}, credentials=AnonymousCredentials()
    )
    job = client.create_custom_job(
        parent="projects/forja-sandbox/locations/us-central1",
        custom_job={"display_name": "trainer-ddp", "job_spec": {"worker_pool_specs": [pool, pool]}},
    )
    deadline = time.monotonic() + 120
    while (job := client.get_custom_job(name=job.name)).state not in FINAL:
        assert time.monotonic() < deadline, f"the job is still {job.state.name}"
        time.sleep(0.1)

    logs = {r.label: r.log.read_text()[-2000:] for r in emulator.job(job.name).replicas}
    assert job.state == JobState.JOB_STATE_SUCCEEDED, logs
    summary = json.loads((tmp_path / "run" / run_folder.SUMMARY).read_text())
    assert summary["world_size"] == 2, summary
    assert summary["status"] == "completed"
