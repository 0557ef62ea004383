"""forja.gpu.vertex_custom_job run for real (ansible-playbook on localhost) against the sandbox's
Vertex emulator: submit and follow, re-run without a second job, cancel, and bad input refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from gcp_helpers import offline_env, run_module_tasks

from forja_sandbox.vertex_emulator import VertexEmulator

MODULE = "forja.gpu.vertex_custom_job"
TASK_PACKAGE = Path(__file__).parent / "task_pkg"
PARENT = "projects/forja-sandbox/locations/us-central1"
EXECUTOR = "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4.py310:latest"


def env_for(emulator: VertexEmulator) -> dict[str, str]:
    return offline_env({
        "FORJA_VERTEX_API_URL": f"{emulator.url}/v1/",
        "FORJA_GCP_PROJECT": "forja-sandbox",
        "FORJA_GCP_ACCESS_TOKEN": "sandbox-token",  # the emulator takes any bearer token
    })  # fmt: skip


def package_pool(**machine: object) -> dict:
    return {
        "machine_type": "n1-standard-4",
        **machine,
        "python_package": {
            "executor_image_uri": EXECUTOR,
            "package_uris": [str(TASK_PACKAGE)],
            "python_module": "forja_vertex_task.allreduce",
        },
    }


def command_pool(code: str) -> dict:
    return {
        "machine_type": "n1-standard-4",
        "container": {"image_uri": "us-docker.pkg.dev/forja-sandbox/images/python:3.11",
                      "command": [sys.executable, "-c", code]},
    }


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_submit_follow_rerun_cancel_and_refuse(emulator: VertexEmulator, tmp_path: Path) -> None:
    train = {
        "region": "us-central1",
        "display_name": "ddp-module",
        "base_output_dir": str(tmp_path / "out"),
        "env": {"RUN_NAME": "from-the-module"},
        "worker_pools": [package_pool(), package_pool()],
        "poll_interval": 0.1,
    }
    v100 = package_pool(
        machine_type="n1-standard-8", accelerator_type="NVIDIA_TESLA_V100", accelerator_count=1
    )
    sleeper = {"region": "us-central1", "display_name": "sleeper", "poll_interval": 0.1}
    results = run_module_tasks(tmp_path, env_for(emulator), [
        {MODULE: train, "check_mode": True, "register": "check"},
        {MODULE: train, "register": "trained"},
        {MODULE: train, "register": "again"},
        {MODULE: {**sleeper, "wait": False, "worker_pools": [command_pool("import time; time.sleep(600)")]},
         "register": "submitted"},
        {MODULE: {**sleeper, "state": "cancelled"}, "register": "cancelled"},
        {MODULE: {**sleeper, "state": "cancelled"}, "register": "cancelled_again"},
        {MODULE: {**train, "display_name": "fails", "worker_pools": [command_pool("raise SystemExit(3)")]},
         "register": "failed"},
        {MODULE: {**train, "display_name": "l4-on-n1",
                  "worker_pools": [package_pool(accelerator_type="NVIDIA_L4", accelerator_count=1)]},
         "register": "bad_machine"},
        {MODULE: {**train, "display_name": "v100", "region": "us-east1", "worker_pools": [v100]},
         "register": "bad_region"},
    ])  # fmt: skip

    check = results["check"]
    assert check["changed"] is True and "job" not in check, check
    assert check["body"]["jobSpec"]["workerPoolSpecs"][1]["pythonPackageSpec"]["env"] == [
        {"name": "RUN_NAME", "value": "from-the-module"}
    ]
    trained = results["trained"]
    assert trained["changed"] is True and trained["state"] == "JOB_STATE_SUCCEEDED", trained
    assert sorted(p.name for p in (tmp_path / "out" / "model").iterdir()) == ["rank0.json", "rank1.json"]
    assert results["again"]["changed"] is False and results["again"]["name"] == trained["name"]
    # check mode submitted nothing, the re-run nothing either: one job of that name
    assert [j.proto.display_name for j in emulator.store.list(PARENT)].count("ddp-module") == 1

    submitted = results["submitted"]
    assert submitted["changed"] is True and submitted["state"] in ("JOB_STATE_QUEUED", "JOB_STATE_PENDING")
    cancelled = results["cancelled"]
    assert cancelled["changed"] is True and cancelled["cancelled"] == [submitted["name"]], cancelled
    assert cancelled["state"] == "JOB_STATE_CANCELLED"
    assert all(r.proc.poll() is not None for r in emulator.job(submitted["name"]).replicas)
    assert results["cancelled_again"]["changed"] is False

    assert results["failed"]["failed"] is True
    assert "exited with a non-zero status of 3" in results["failed"]["msg"]

    bad_machine = results["bad_machine"]
    assert bad_machine["failed"] is True and bad_machine["msg"].startswith(
        "worker_pools[0].accelerator_type: "
    )
    assert "G2" in bad_machine["msg"]
    bad_region = results["bad_region"]
    assert bad_region["failed"] is True and bad_region["http_status"] == 400
    assert 'Accelerator "NVIDIA_TESLA_V100" is not supported in region "us-east1".' in bad_region["msg"]
    names = [j.proto.display_name for j in emulator.store.list("projects/forja-sandbox/locations/us-east1")]
    assert names == []  # refused before anything was created
