#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""Check a Google Cloud project for a GPU VM before anything is created, every problem at once."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gcp_gpu_preflight
short_description: Check a project before a GPU VM is created, reporting every problem with its fix
description:
  - Asks Google, read-only, what creating the VM that M(forja.gpu.gcp_gpu_instance) would make needs,
    and reports each finding with what to do. It creates and changes nothing.
  - "Credentials: which were found and whose they are, and that a token can be minted."
  - "Project: it exists (Compute Engine tells a missing project from one you may not use) and billing is
    enabled (Cloud Billing)."
  - "APIs: Compute Engine, and IAP for the iap SSH path, Cloud Storage with a bucket, Vertex AI for Vertex
    jobs (Service Usage); a disabled one comes with its activation link."
  - "Permissions: those that creating the VM, its firewall rule, the IAP tunnel, a bucket or a Vertex job
    needs, through Resource Manager's testIamPermissions, with the role that grants each missing one."
  - "Placement: each zone exists and offers the machine type (and an attached GPU); the image family
    resolves to an image that carries the driver and CUDA versions its name pins."
  - "Quota: the region's GPU quota for the provisioning model (Spot uses PREEMPTIBLE_ quotas when the
    project has them), CPUs, disk, and the project's GPUS_ALL_REGIONS, against what the VMs not yet
    running need."
  - "This machine: the SSH key (forja up makes one when there is none), and the IAP command on PATH."
  - "Price: the VM's hourly rate, a month left running, and the disk's month while stopped."
  - A check that could not be asked (an API of Google's own that is off in the credentials' project) is
    a warning, never a failure. RV(blocking) says whether any finding must be fixed first; the module
    itself fails only on bad options, so a play decides what to do with the findings.
  - Runs on the controller (C(delegate_to=localhost)); needs C(google-auth) and C(requests) there.
version_added: "0.3.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - forja.gpu.gcp_auth
  - forja.gpu.gcp_auth.modules
options:
  name:
    description: The VM's name (of a cluster, its members are named V(<name>-0) to V(<name>-<count-1>)).
    type: str
    default: forja-l4
  count:
    description: How many VMs.
    type: int
    default: 1
  zone:
    description: The zone the VM is created in.
    type: str
    required: true
  fallback_zones:
    description: Zones tried in order on a stock-out; each is checked too.
    type: list
    elements: str
    default: []
  machine_type:
    description: The machine type.
    type: str
    default: g2-standard-8
  gpu_type:
    description: A GPU to attach (N1 machine types); empty for machine types whose GPUs come with them.
    type: str
    default: ""
  gpu_count:
    description: How many of O(gpu_type).
    type: int
    default: 0
  spot:
    description: Spot VMs (their own quotas, their own price).
    type: bool
    default: false
  image_family:
    description: The boot image family.
    type: str
    default: pytorch-2-7-cu128-ubuntu-2204-nvidia-570
  image:
    description: A boot image by name, instead of O(image_family).
    type: str
    default: ""
  image_project:
    description: The project that holds the image.
    type: str
    default: deeplearning-platform-release
  boot_disk_size_gb:
    description: The boot disk's size.
    type: int
    default: 300
  boot_disk_type:
    description: The boot disk's type.
    type: str
    default: pd-balanced
  external_ip:
    description: Whether the VM gets an external address.
    type: bool
    default: true
  ssh_mode:
    description: How Ansible reaches the VM; C(iap) needs the IAP API, the tunnel permission and gcloud.
    type: str
    choices: [iap, direct, own_rule]
    default: iap
  ssh_key_file:
    description: The SSH private key Ansible logs in with (forja up creates it when missing).
    type: path
  iap_command:
    description: The command the iap path runs; its first word must be on PATH.
    type: str
    default: gcloud compute start-iap-tunnel
  os_login:
    description: Whether the VM uses OS Login.
    type: bool
    default: false
  features:
    description:
      - What else forja will do in the project, so its API and permissions are checked too.
      - C(bucket) a checkpoint bucket; C(vertex) Vertex AI custom jobs.
    type: list
    elements: str
    choices: [bucket, vertex]
    default: []
"""

EXAMPLES = r"""
- name: Check the project before creating the GPU VM
  forja.gpu.gcp_gpu_preflight:
    zone: us-east1-d
    fallback_zones: [us-east1-b]
    spot: true
    features: [bucket]
  delegate_to: localhost
  register: preflight

- name: Stop when something blocks
  ansible.builtin.fail:
    msg: "{{ preflight.summary }}"
  when: preflight.blocking
"""

RETURN = r"""
findings:
  description:
    - Every finding in order (credentials, project, billing, api, permissions, placement, image, quota,
      this machine, price).
    - "Each has C(check), C(subject), C(status) (one of V(ok), V(warn), V(fail), V(skip)), C(detail),
      C(fix) and C(link)."
  returned: always
  type: list
  elements: dict
  sample:
    - check: quota
      subject: NVIDIA_L4_GPUS (us-east1)
      status: fail
      detail: limit 0, in use 0, forja-l4 needs 1
      fix: request NVIDIA_L4_GPUS of at least 1 in us-east1
      link: https://console.cloud.google.com/iam-admin/quotas?project=my-project&metric=NVIDIA_L4_GPUS
blocking:
  description: Whether any finding failed, so the VM cannot be created until it is fixed.
  returned: always
  type: bool
problems:
  description: Each failed finding as one line for people, with its fix and link.
  returned: always
  type: list
  elements: str
summary:
  description: RV(problems) joined by C(; ), for a task's message.
  returned: always
  type: str
project:
  description: The project checked.
  returned: always
  type: str
elapsed_s:
  description: Seconds the checks took.
  returned: always
  type: float
"""

from typing import Any

from ansible_collections.forja.gpu.plugins.module_utils.forja_call import Call, ModuleFailure, run_as_module
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    AUTH_ARGUMENT_SPEC,
    ENV_PROJECT,
    GcpClient,
    GcpError,
    config_from_params,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_preflight import Plan, Preflight, report

SPEC: dict[str, Any] = {
    "argument_spec": {
        "name": {"type": "str", "default": "forja-l4"},
        "count": {"type": "int", "default": 1},
        "zone": {"type": "str", "required": True},
        "fallback_zones": {"type": "list", "elements": "str", "default": []},
        "machine_type": {"type": "str", "default": "g2-standard-8"},
        "gpu_type": {"type": "str", "default": ""},
        "gpu_count": {"type": "int", "default": 0},
        "spot": {"type": "bool", "default": False},
        "image_family": {"type": "str", "default": "pytorch-2-7-cu128-ubuntu-2204-nvidia-570"},
        "image": {"type": "str", "default": ""},
        "image_project": {"type": "str", "default": "deeplearning-platform-release"},
        "boot_disk_size_gb": {"type": "int", "default": 300},
        "boot_disk_type": {"type": "str", "default": "pd-balanced"},
        "external_ip": {"type": "bool", "default": True},
        "ssh_mode": {"type": "str", "default": "iap", "choices": ["iap", "direct", "own_rule"]},
        "ssh_key_file": {"type": "path"},
        "iap_command": {"type": "str", "default": "gcloud compute start-iap-tunnel"},
        "os_login": {"type": "bool", "default": False},
        "features": {"type": "list", "elements": "str", "default": [], "choices": ["bucket", "vertex"]},
        **AUTH_ARGUMENT_SPEC,
    },
    "mutually_exclusive": [("credentials_file", "credentials_json")],
}


def run(call: Call) -> dict[str, Any]:
    """Every finding, and whether one blocks; ModuleFailure only for bad options or an unreachable API."""
    params = call.params
    config = config_from_params(params, "forja-gcp-gpu-preflight/0.3")
    project = config.resolved_project()
    if not project:
        raise ModuleFailure(
            f"project: not set; set gcp_instance_project (or {ENV_PROJECT}) to the GCP project ID"
        )
    if params["count"] < 1:
        raise ModuleFailure(f"count: {params['count']} VMs; set it to 1 or more")
    plan = Plan(
        project=project, name=params["name"], count=params["count"], zone=params["zone"],
        fallback_zones=params["fallback_zones"], machine_type=params["machine_type"],
        gpu_type=params["gpu_type"], gpu_count=params["gpu_count"], spot=params["spot"],
        image_family=params["image_family"], image=params["image"], image_project=params["image_project"],
        disk_size_gb=params["boot_disk_size_gb"], disk_type=params["boot_disk_type"],
        external_ip=params["external_ip"], ssh_mode=params["ssh_mode"],
        ssh_key_file=params["ssh_key_file"] or "", iap_command=params["iap_command"],
        os_login=params["os_login"], features=params["features"],
    )
    try:
        checks = Preflight(GcpClient(config), plan)
        findings = checks.run()
    except GcpError as exc:  # what no check expects (the API unreachable): the task's own failure
        raise ModuleFailure(exc.message, http_status=exc.status, reason=exc.reason) from None
    return {"changed": False, "project": project, "elapsed_s": checks.elapsed_s, **report(findings)}


def main() -> None:
    run_as_module(SPEC, run)


if __name__ == "__main__":
    main()
