#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""A Vertex AI custom training job: submitted once, followed to its end, or cancelled."""

from __future__ import annotations

DOCUMENTATION = r"""
module: vertex_custom_job
short_description: Submit, follow or cancel a Vertex AI custom training job
description:
  - Submits one Vertex AI CustomJob (C(projects/P/locations/REGION/customJobs)) built from
    O(worker_pools), follows it until it ends (O(wait)), or cancels it (O(state=cancelled)).
  - The job is known by O(display_name). With O(state=present), a job of that name that is queued,
    pending, running or succeeded is the one asked for and nothing is submitted (a re-run does not
    start a second job); a failed or cancelled one is followed by a new submission.
  - Bad input fails before any call, naming the option and the fix - an accelerator the machine type
    cannot take or a GPU count it does not have (forja's machine catalog), a type without a count,
    a pool that runs nothing. What only Vertex knows (the region's accelerators, quotas) comes back
    in Google's words.
  - Submission is one request, never retried, because Vertex's create call has no request id and a
    retried one could start a second job.
  - Supports check mode. Runs on the controller.
  - Of the shared GCP options, O(api_url) and O(operation_timeout) are the Compute API's and unused
    here; Vertex's endpoint is O(vertex_api_url).
version_added: "0.1.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - forja.gpu.gcp_auth
  - forja.gpu.gcp_auth.modules
options:
  display_name:
    description: The job's name in Vertex; how this module finds it again.
    type: str
    required: true
  region:
    description: The Vertex AI region (for example C(us-central1)); its endpoint serves the job.
    type: str
    required: true
  state:
    description:
      - C(present) submits the job unless it exists.
      - C(cancelled) cancels every running job of that name.
    type: str
    choices: [present, cancelled]
    default: present
  worker_pools:
    description:
      - The worker pools, as Vertex's C(workerPoolSpecs). The first is the primary replica (exactly one);
        the second holds the other workers. Required with O(state=present).
    type: list
    elements: dict
    suboptions:
      machine_type:
        description: The machine type of each replica (C(n1-standard-8), C(g2-standard-24) ...).
        type: str
        required: true
      accelerator_type:
        description: Vertex's accelerator name (C(NVIDIA_L4), C(NVIDIA_TESLA_T4), C(NVIDIA_H100_80GB) ...).
        type: str
      accelerator_count:
        description: GPUs per replica; must be what the machine type carries (G2/A2/A3) or accepts (N1).
        type: int
        default: 0
      replica_count:
        description: How many replicas this pool runs.
        type: int
        default: 1
      boot_disk_size_gb:
        description: Boot disk of each replica in GB (pd-ssd); Vertex's default when unset.
        type: int
      env:
        description: Environment variables of this pool's replicas (added to O(env)).
        type: dict
      python_package:
        description: A Python package run with a prebuilt training image (C(pythonPackageSpec)).
        type: dict
        suboptions:
          executor_image_uri:
            description: The prebuilt training image (for example a PyTorch GPU image).
            type: str
            required: true
          package_uris:
            description: The package's sdist or wheel, usually C(gs://BUCKET/...).
            type: list
            elements: str
            required: true
          python_module:
            description: The module to run (C(python -m MODULE)).
            type: str
            required: true
          args:
            description: Its arguments.
            type: list
            elements: str
      container:
        description: A custom container (C(containerSpec)).
        type: dict
        suboptions:
          image_uri:
            description:
              - The image, in Artifact Registry (C(REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE[:TAG])) or
                Container Registry (C(gcr.io/PROJECT/IMAGE), C(us.gcr.io/...)), the registries Vertex AI
                pulls from; any other form or registry is refused before the job is sent.
            type: str
            required: true
          command:
            description: Its entrypoint, replaced.
            type: list
            elements: str
          args:
            description: Its arguments.
            type: list
            elements: str
  env:
    description: Environment variables of every replica.
    type: dict
  service_account:
    description: The service account the replicas run as; Vertex's default when unset.
    type: str
  base_output_dir:
    description:
      - Where results land (C(gs://BUCKET/PREFIX)); Vertex gives replicas AIP_MODEL_DIR,
        AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR under it.
    type: str
  timeout:
    description: Seconds the job may run before Vertex stops it; Vertex's default (7 days) when unset.
    type: int
  restart_job_on_worker_restart:
    description: Restart every replica when one restarts (Vertex's C(scheduling.restartJobOnWorkerRestart)).
    type: bool
    default: false
  labels:
    description: Labels of the job.
    type: dict
  wait:
    description:
      - Follow the job until it ends (with O(state=cancelled), until it is cancelled).
      - A job that fails then fails the task.
    type: bool
    default: true
  wait_timeout:
    description: Seconds to follow the job; when they run out, the module returns the job as it is then.
    type: float
    default: 86400.0
  poll_interval:
    description: Seconds between two looks at the job's state.
    type: float
    default: 15.0
  vertex_api_url:
    description:
      - Vertex AI's base URL; defaults to E(FORJA_VERTEX_API_URL), else C(https://REGION-aiplatform.googleapis.com/v1/).
      - Point it at the sandbox's Vertex emulator for tests.
    type: str
notes:
  - Supports C(check_mode).
  - The credentials need C(roles/aiplatform.user) on the project.
  - Logs are in Cloud Logging (C(resource.type="ml_job")); this module reports states, not log lines.
seealso:
  - name: Create custom training jobs
    description: Worker pools, machine and accelerator specs.
    link: https://cloud.google.com/vertex-ai/docs/training/create-custom-job
  - name: Vertex AI locations
    description: Which accelerators each region offers.
    link: https://cloud.google.com/vertex-ai/docs/general/locations#accelerators
"""

EXAMPLES = r"""
- name: Train on two G2 machines (one L4 each), a primary and one worker, and wait for the result
  forja.gpu.vertex_custom_job:
    project: my-project
    region: us-central1
    display_name: digits-ddp-2x-l4
    base_output_dir: gs://my-project-forja/runs/digits-ddp
    worker_pools:
      - &pool
        machine_type: g2-standard-8
        accelerator_type: NVIDIA_L4
        accelerator_count: 1
        python_package:
          executor_image_uri: us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest
          package_uris: [gs://my-project-forja/packages/trainer-0.1.0.tar.gz]
          python_module: trainer
          args: [--config, digits.yaml]
      - *pool
  delegate_to: localhost
  register: job

- name: Submit a container job and return at once
  forja.gpu.vertex_custom_job:
    project: my-project
    region: europe-west4
    display_name: eval-nightly
    wait: false
    worker_pools:
      - machine_type: n1-standard-8
        accelerator_type: NVIDIA_TESLA_T4
        accelerator_count: 1
        container:
          image_uri: europe-docker.pkg.dev/my-project/train/eval:1.2
          command: [python, -m, eval]
  delegate_to: localhost

- name: Cancel it
  forja.gpu.vertex_custom_job:
    project: my-project
    region: europe-west4
    display_name: eval-nightly
    state: cancelled
  delegate_to: localhost
"""

RETURN = r"""
job:
  description: The CustomJob as Vertex answered it last (REST JSON); absent in check mode before submission.
  returned: when a job exists or was submitted
  type: dict
  sample: {"name": "projects/my-project/locations/us-central1/customJobs/123", "state": "JOB_STATE_SUCCEEDED"}
name:
  description: The job's resource name.
  returned: when a job exists or was submitted
  type: str
state:
  description: The job's last state (C(JOB_STATE_RUNNING), C(JOB_STATE_SUCCEEDED) ...).
  returned: when a job exists or was submitted
  type: str
cancelled:
  description: The resource names of the jobs this run cancelled.
  returned: with O(state=cancelled)
  type: list
  elements: str
body:
  description: The CustomJob body submitted, or that would be in check mode.
  returned: when a job was (or would be) submitted
  type: dict
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    AUTH_ARGUMENT_SPEC,
    GcpClient,
    GcpError,
    config_from_params,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_vertex import (
    FINAL_STATES,
    PRESENT_STATES,
    RUNNING_STATES,
    SCOPES,
    VertexJobs,
    VertexSpecError,
    api_url,
    custom_job,
)


def present(jobs: VertexJobs, params: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    body = custom_job(params)
    existing = [j for j in jobs.find(params["display_name"]) if j.get("state") in PRESENT_STATES]
    result: dict[str, Any] = {"changed": not existing}
    if existing:
        job = existing[-1]
    elif check_mode:
        return {**result, "body": body}
    else:
        job = jobs.create(body)
        result["body"] = body
    if params["wait"] and not check_mode:
        job = jobs.wait(job["name"], params["wait_timeout"], params["poll_interval"])
    return {**result, "job": job, "name": job["name"], "state": job.get("state")}


def cancelled(jobs: VertexJobs, params: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    going = [j for j in jobs.find(params["display_name"]) if j.get("state") in RUNNING_STATES]
    if not check_mode:
        for job in going:
            jobs.cancel(job["name"])
        if params["wait"]:
            going = [
                jobs.wait(j["name"], params["wait_timeout"], params["poll_interval"], FINAL_STATES)
                for j in going
            ]
    result: dict[str, Any] = {"changed": bool(going), "cancelled": [j["name"] for j in going]}
    if going:
        result.update(job=going[-1], name=going[-1]["name"], state=going[-1].get("state"))
    return result


def main() -> None:
    pool_options = {
        "machine_type": {"type": "str", "required": True},
        "accelerator_type": {"type": "str"},
        "accelerator_count": {"type": "int", "default": 0},
        "replica_count": {"type": "int", "default": 1},
        "boot_disk_size_gb": {"type": "int"},
        "env": {"type": "dict"},
        "python_package": {
            "type": "dict",
            "options": {
                "executor_image_uri": {"type": "str", "required": True},
                "package_uris": {"type": "list", "elements": "str", "required": True},
                "python_module": {"type": "str", "required": True},
                "args": {"type": "list", "elements": "str"},
            },
        },
        "container": {
            "type": "dict",
            "options": {
                "image_uri": {"type": "str", "required": True},
                "command": {"type": "list", "elements": "str"},
                "args": {"type": "list", "elements": "str"},
            },
        },
    }
    module = AnsibleModule(
        argument_spec={
            "display_name": {"type": "str", "required": True},
            "region": {"type": "str", "required": True},
            "state": {"type": "str", "default": "present", "choices": ["present", "cancelled"]},
            "worker_pools": {"type": "list", "elements": "dict", "options": pool_options},
            "env": {"type": "dict"},
            "service_account": {"type": "str"},
            "base_output_dir": {"type": "str"},
            "timeout": {"type": "int"},
            "restart_job_on_worker_restart": {"type": "bool", "default": False},
            "labels": {"type": "dict"},
            "wait": {"type": "bool", "default": True},
            "wait_timeout": {"type": "float", "default": 86400.0},
            "poll_interval": {"type": "float", "default": 15.0},
            "vertex_api_url": {"type": "str"},
            **AUTH_ARGUMENT_SPEC,
        },
        required_if=[("state", "present", ("worker_pools",))],
        mutually_exclusive=[("credentials_file", "credentials_json")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        config = config_from_params(params, "forja-vertex-custom-job/0.1")
        config.scopes = SCOPES
        project = config.resolved_project()
        if not project:
            raise VertexSpecError("project: not set; set project or FORJA_GCP_PROJECT")
        config.api_url = api_url(params["region"], params["vertex_api_url"], dict(config.env))
        jobs = VertexJobs(GcpClient(config), project, params["region"])
        if params["state"] == "cancelled":
            result = cancelled(jobs, params, module.check_mode)
        else:
            result = present(jobs, params, module.check_mode)
    except VertexSpecError as exc:
        module.fail_json(msg=str(exc), changed=False)
    except GcpError as exc:
        module.fail_json(msg=exc.message, http_status=exc.status, reason=exc.reason)
    job = result.get("job") or {}
    if params["state"] == "present" and params["wait"] and job.get("state") == "JOB_STATE_FAILED":
        error = job.get("error", {}).get("message", "no message")
        module.fail_json(msg=f"Vertex AI job {job['name']} failed: {error}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
