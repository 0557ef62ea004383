#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""Create, start, stop or delete one GPU VM on Compute Engine, idempotently."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gcp_gpu_instance
short_description: Manage one Compute Engine GPU VM (G2/L4, A2, A3, N1), with Spot, Flex-start, zone fallback
description:
  - Creates, starts, stops or deletes one Compute Engine VM with GPUs, the way forja needs it.
  - Checks the machine type against the GPU asked for before any call (C(g2-standard-8) comes with
    exactly one NVIDIA L4 attached by the machine type; A2 and A3 likewise; N1 takes attached T4, V100
    or P100 in fixed counts), then checks with the API that the zone, the machine type and the GPU exist
    there. Bad input fails with a message naming the field and the fix, and nothing is created.
  - GPU VMs cannot live-migrate, so C(onHostMaintenance=TERMINATE) is always set when a GPU is present.
  - On a stock-out (C(ZONE_RESOURCE_POOL_EXHAUSTED)) the next zone of O(fallback_zones) is tried; a VM
    left behind by a failed insert is deleted, so no half-made resources remain.
  - Idempotent. Values are compared after normalising (full versus partial URLs, server-filled
    defaults such as Spot's termination action), so a second run reports C(ok). Labels, metadata and
    network tags of an existing VM are updated in place with their fingerprints (a stale fingerprint,
    HTTP 412, is re-read and retried once). Machine type, GPUs, Spot and the boot disk are not changed on
    an existing VM; a difference fails with a message saying so.
  - Supports check mode and C(--diff). Metadata values appear in the diff only as digests (they hold SSH
    keys and scripts), and never in the return values.
  - Runs on the controller (C(delegate_to=localhost)); needs C(google-auth) and C(requests) there.
  - C(state=started) and C(state=stopped) never create a VM unless O(create_if_missing=true). A
    misspelt O(name), O(project) or O(zone) fails naming what was looked for, instead of
    creating (and billing) a new GPU VM.
  - This module states no VM of its own. The VM forja runs (its machine type, zone, image and
    disk) is stated once, in the C(forja.gpu.gcp_instance) role's defaults
    (C(roles/gcp_instance/defaults/main.yml)), which pass every option below; used directly, an
    option left unset takes the Compute API's own default when the VM is created, and is not
    compared on an existing VM.
version_added: "0.1.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - forja.gpu.gcp_auth
  - forja.gpu.gcp_auth.modules
options:
  name:
    description: Instance name (RFC 1035, 1 to 63 characters).
    type: str
    required: true
  state:
    description:
      - C(present) creates the VM (running) if it is missing and leaves the power state of an existing one.
      - C(started) and C(stopped) start or stop an existing VM; a missing one is an error unless
        O(create_if_missing=true). C(absent) deletes it with its boot disk.
    type: str
    choices: [present, absent, started, stopped]
    default: present
  create_if_missing:
    description:
      - With C(state=started) or C(state=stopped), create the VM when it does not exist (C(stopped)
        creates it, then stops it). Off, a missing VM fails naming the VM, the project and the zones
        looked at, and nothing is created.
      - C(state=present) always creates a missing VM; C(absent) never does.
    type: bool
    default: false
  zone:
    description:
      - Zone to create the VM in, and the first place to look for it. The gcp_instance role passes
        C(gcp_instance_zone).
    type: str
    required: true
  fallback_zones:
    description:
      - Zones tried when the zone is out of stock (in the order O(zone_order) says). An existing VM is
        also looked for there.
    type: list
    elements: str
    default: []
  zone_order:
    description:
      - The order the fallback zones are tried in on a stock-out. O(zone) is always tried first.
      - C(advice) asks Google's Capacity Advisor (C(advice.capacity), and C(advice.capacityHistory) for
        Spot) and tries the fallback zones by obtainability, then estimated uptime, then the 30-day
        Spot preemption rate; zones without a score keep the given order, after the scored ones.
        When the advisor says nothing (HTTP 400 "The service is not available for this project.",
        403, 5xx, unreachable) the given order is kept; that is never a failure. Needs the
        C(compute.advice.capacity) permission (in C(roles/compute.viewer)).
      - C(given) tries them in the order of O(fallback_zones), asking nothing.
      - Unset means C(advice). The gcp_instance role passes C(gcp_instance_zone_order), which is
        C(advice) unless changed.
    type: str
    choices: [advice, given]
  machine_type:
    description:
      - Machine type name. Required to create the VM; unset, an existing VM's type is not compared.
        The gcp_instance role passes C(gcp_instance_machine_type).
    type: str
  gpu_type:
    description:
      - GPU model. Leave unset for G2/A2/A3 (the machine type brings its GPUs); when set there, it must
        match. Required to attach GPUs to N1.
    type: str
  gpu_count:
    description: Number of GPUs; for G2/A2/A3 it must equal what the machine type carries.
    type: int
  image_family:
    description: Image family of O(image_project) to boot from (mutually exclusive with O(image)).
    type: str
  image:
    description: Image name or partial URL to boot from (mutually exclusive with O(image_family)).
    type: str
  image_project:
    description: Project owning the image or family; unset means O(project) itself (as for gcloud).
    type: str
  boot_disk_size_gb:
    description: Boot disk size in GB; unset means the image's size.
    type: int
  boot_disk_type:
    description: Boot disk type; unset means the API's default (C(pd-standard)).
    type: str
    choices: [pd-balanced, pd-ssd, pd-standard, pd-extreme, hyperdisk-balanced]
  boot_disk_interface:
    description: Boot disk interface; unset means the API's default (C(SCSI)).
    type: str
    choices: [NVME, SCSI]
  network:
    description: VPC network name or partial URL; unset means the API's default (the network C(default)).
    type: str
  subnetwork:
    description: Subnetwork name or partial URL (needed for custom-mode networks).
    type: str
  external_ip:
    description:
      - Give the VM an ephemeral public IP (needed for direct SSH; IAP does not need it). Unset means
        the API's default, none.
    type: bool
  nic_type:
    description:
      - Virtual NIC type. Unset lets the API choose (the DLVM images support gVNIC). Only used at creation.
    type: str
    choices: [GVNIC, VIRTIO_NET]
  tags:
    description: Network tags (firewall rules select VMs by them). Replaced as a whole on update.
    type: list
    elements: str
    default: []
  labels:
    description: Labels. C(forja=managed) is always added. Merged into existing labels unless O(purge_labels).
    type: dict
    default: {}
  purge_labels:
    description: Remove labels of an existing VM that are not in O(labels).
    type: bool
    default: false
  metadata:
    description:
      - Metadata key/values. Merged into existing metadata unless O(purge_metadata) (C(gcloud compute ssh)
        adds its own C(ssh-keys), which a purge would remove).
    type: dict
    default: {}
  purge_metadata:
    description: Remove metadata keys of an existing VM that are not in O(metadata) or O(ssh_keys).
    type: bool
    default: false
  ssh_keys:
    description: SSH public keys as C(USER:KEY) lines, stored in the C(ssh-keys) metadata entry.
    type: list
    elements: str
    default: []
  service_account_email:
    description: Service account the VM runs as; unset means the project's default compute account.
    type: str
  scopes:
    description:
      - OAuth scopes of the VM's service account. With neither this nor O(service_account_email) the
        VM gets no service account (the API's default). The gcp_instance role passes read-only
        storage plus logging and monitoring writes, so code in a notebook cannot change the project
        with the VM's credentials.
    type: list
    elements: str
  spot:
    description:
      - Create a Spot VM (C(provisioningModel=SPOT)); cheaper, may be preempted at any time. Unset
        means a standard VM at creation, and not compared on an existing VM.
      - The same as O(provisioning_model=spot) (C(false) as C(standard)); O(provisioning_model) replaces
        it, and the two may not disagree.
    type: bool
  provisioning_model:
    description:
      - How Google provides the VM. C(standard) runs until stopped; C(spot) is cheaper and may be
        preempted at any time; C(flex_start) (Dynamic Workload Scheduler) waits in Google's queue for
        capacity, then runs without preemption for at most O(max_run_duration), and Google then
        stops or deletes it (O(instance_termination_action), C(DELETE) unless set).
      - C(flex_start) takes the A2, A3, A4, G2 and H4D machine series only (not A4X or G4); another
        machine type fails before anything is created. A Flex-start VM's request is created at once
        with status C(PENDING) while it waits; with O(wait=true) the module returns then, reporting
        RV(pending), instead of waiting for the capacity (the gcp_instance role waits, with progress).
        A PENDING VM is never started; delete it to cancel the request.
      - Unset means what O(spot) says (and a standard VM when that is unset too).
    type: str
    choices: [standard, spot, flex_start]
  max_run_duration:
    description:
      - Flex-start only, and required there, the longest the VM runs once it has its capacity, as
        C(3d), C(36h), C(1d12h) or C(90m); at most C(7d). Google performs the termination action then.
    type: str
  request_valid_for_duration:
    description:
      - Flex-start only, how long the request may wait in Google's queue for capacity
        (C(params.requestValidForDuration)), at most C(2h); unset means Google's default. A request
        that finds no capacity by then fails, and the VM is gone.
    type: str
  instance_termination_action:
    description:
      - What preemption does to a Spot VM (the API default is STOP), or what the end of its run does to
        a Flex-start VM (forja's default, DELETE). Only valid for those two models.
    type: str
    choices: [STOP, DELETE]
  ip_preference:
    description: Order in which the public and private IP are tried for the returned C(ip).
    type: list
    elements: str
    default: [public_ip, private_ip]
  wait:
    description: Wait for every operation to finish (the facts returned are then final).
    type: bool
    default: true
  resource_policies:
    description:
      - Names of resource policies in the zone's region that the VM is created with (the cluster's
        compact placement policy, see M(forja.gpu.gcp_gpu_placement_policy)).
      - A VM cannot join or leave a policy while it exists here, so on an existing VM a different
        list fails, like the machine type. Unset, it is not compared.
    type: list
    elements: str
notes:
  - Supports C(check_mode) and C(diff).
  - Runs on the controller; use C(delegate_to=localhost) or C(connection=local).
seealso:
  - name: Compute Engine GPU machine types
    description: Which GPUs each machine family carries.
    link: https://cloud.google.com/compute/docs/gpus
  - name: Spot VMs
    description: provisioningModel SPOT and instanceTerminationAction.
    link: https://cloud.google.com/compute/docs/instances/spot
  - name: Flex-start VMs
    description: provisioningModel FLEX_START, maxRunDuration and the machine series that qualify.
    link: https://cloud.google.com/compute/docs/instances/about-flex-start-vms
"""

EXAMPLES = r"""
- name: Create the L4 training VM like the user's (g2-standard-8, us-east1-d, DLVM PyTorch 2.7 image)
  forja.gpu.gcp_gpu_instance:
    name: forja-l4
    project: my-project
    zone: us-east1-d
    machine_type: g2-standard-8
    image_family: pytorch-2-7-cu128-ubuntu-2204-nvidia-570
    boot_disk_size_gb: 300
  delegate_to: localhost
  register: vm

- name: Create a Spot VM, trying two more zones if us-east1-d is out of L4s
  forja.gpu.gcp_gpu_instance:
    name: forja-l4-spot
    project: my-project
    zone: us-east1-d
    fallback_zones: [us-east1-b, us-central1-a]
    machine_type: g2-standard-8
    image_family: pytorch-2-7-cu128-ubuntu-2204-nvidia-570
    image_project: deeplearning-platform-release
    spot: true
    instance_termination_action: STOP
    ssh_keys:
      - "ansible:ssh-ed25519 AAAAC3Nza... ansible@controller"
    labels:
      owner: alice
  delegate_to: localhost

- name: Ask for a Flex-start L4 VM that runs 3 days without preemption, queued up to 2 hours
  forja.gpu.gcp_gpu_instance:
    name: forja-l4-flex
    project: my-project
    zone: us-east1-d
    machine_type: g2-standard-8
    image_family: pytorch-2-7-cu128-ubuntu-2204-nvidia-570
    image_project: deeplearning-platform-release
    provisioning_model: flex_start
    max_run_duration: 3d
    request_valid_for_duration: 2h
  delegate_to: localhost
  register: flex

- name: Stop the VM (the disk stays, billing of the GPU stops); fails if there is no such VM
  forja.gpu.gcp_gpu_instance:
    name: forja-l4
    project: my-project
    zone: us-east1-d
    state: stopped
  delegate_to: localhost

- name: Start the VM, creating it first if it does not exist yet
  forja.gpu.gcp_gpu_instance:
    name: forja-l4
    project: my-project
    zone: us-east1-d
    state: started
    create_if_missing: true
    machine_type: g2-standard-8
    image_family: pytorch-2-7-cu128-ubuntu-2204-nvidia-570
    image_project: deeplearning-platform-release
  delegate_to: localhost

- name: Delete the VM and its boot disk
  forja.gpu.gcp_gpu_instance:
    name: forja-l4
    project: my-project
    zone: us-east1-d
    state: absent
  delegate_to: localhost
"""

RETURN = r"""
instance:
  description: Facts about the VM (the same short names the gcp_gpu inventory plugin sets as hostvars).
  returned: unless state is absent
  type: dict
  contains:
    name: {description: Instance name., type: str, sample: forja-l4}
    id: {description: Numeric ID., type: str}
    project: {description: Project ID., type: str}
    zone: {description: Zone (short name) the VM is in., type: str, sample: us-east1-d}
    status: {description: "RUNNING, TERMINATED (stopped), etc.", type: str, sample: RUNNING}
    machine_type: {description: Machine type (short name)., type: str, sample: g2-standard-8}
    gpu_type: {description: GPU model., type: str, sample: nvidia-l4}
    gpu_count: {description: Number of GPUs., type: int, sample: 1}
    provisioning_model: {description: "STANDARD, SPOT or FLEX_START.", type: str}
    preemptible: {description: Whether it is a Spot VM., type: bool}
    instance_termination_action:
      description: STOP or DELETE for Spot and Flex-start VMs; null for others.
      type: str
    max_run_duration_s: {description: The longest a Flex-start VM runs (seconds); null for others., type: int}
    ends_at:
      description: When Google ends a running Flex-start VM (RFC 3339); null before it runs, and for others.
      type: str
    ip: {description: The address to connect to (per ip_preference)., type: str}
    public_ip: {description: "Ephemeral public IP, if any.", type: str}
    private_ip: {description: Internal IP., type: str}
    network: {description: Network (short name)., type: str}
    labels: {description: Labels., type: dict}
    tags: {description: Network tags., type: list}
    metadata_keys: {description: Metadata keys (values are not returned)., type: list}
    boot_disk_size_gb: {description: Boot disk size in GB (billed while stopped)., type: int}
    service_account: {description: The VM's service account (what a bucket's IAM policy grants)., type: str}
    self_link: {description: Resource URL., type: str}
    creation_timestamp: {description: RFC 3339 creation time., type: str}
    last_start_timestamp: {description: RFC 3339 time of the last start., type: str}
    last_stop_timestamp: {description: RFC 3339 time of the last stop., type: str}
zone:
  description: The zone the VM is in (after fallback), or was deleted from.
  returned: always
  type: str
  sample: us-east1-d
zones_tried:
  description: Zones where an insert was attempted, with the error code of each failed one.
  returned: when a VM was created
  type: list
  elements: dict
  sample: [{zone: us-east1-d, error: ZONE_RESOURCE_POOL_EXHAUSTED}, {zone: us-east1-b, error: null}]
zone_advice:
  description:
    - What the capacity advisor said of each fallback zone (O(zone_order=advice), when a VM was
      created with two fallback zones or more), in the order given; C(no_signal) says why a zone has
      no scores.
  returned: when the advice was asked
  type: list
  elements: dict
  sample: [{zone: us-east1-b, obtainability: 0.2, estimated_uptime_s: 60, preemption_rate_30d: 0.4,
            list_price_usd_hour: 0.31, no_signal: ""}]
pending:
  description:
    - The Flex-start VM's request waits in Google's queue for capacity (status PENDING); the
      module did not wait for it. Poll M(forja.gpu.gcp_gpu_instance_info) until it runs.
  returned: when a Flex-start VM is PENDING
  type: bool
  sample: true
request_valid_for_s:
  description:
    - How long, at most, the pending request waits in the queue (O(request_valid_for_duration), else
      Google's longest, 7200 s); after that it fails and the VM is gone.
  returned: when a Flex-start VM is PENDING
  type: int
  sample: 7200
preempted_at:
  description:
    - When Google last preempted this Spot VM (RFC 3339), if that is why it was TERMINATED and this
      run starts it again. The trainer unit resumes from its last checkpoint when the VM boots.
  returned: when a preempted Spot VM is started again
  type: str
  sample: "2026-11-23T06:12:41.000-08:00"
actions:
  description: What was done (or would be done in check mode), in order.
  returned: always
  type: list
  elements: str
  sample: ["insert in us-east1-d", "setLabels"]
"""

import time
from typing import Any

from ansible_collections.forja.gpu.plugins.module_utils.forja_call import Call, ModuleFailure, run_as_module
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    AUTH_ARGUMENT_SPEC,
    GcpApiError,
    GcpClient,
    GcpError,
    GcpOperationError,
    config_from_params,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_advice import order_zones
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import (
    FLEX_START_MAX_WAIT_S,
    PENDING_STATUS,
    STOPPED_STATES,
    InstanceSpec,
    SpecError,
    check_flex_start_machine,
    comparable_view,
    immutable_differences,
    insert_body,
    instance_facts,
    last_preemption,
    metadata_dict,
    predicted_facts,
    validate_spec,
    wanted_labels,
    wanted_metadata,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_machines import (
    SETTLING_STATES,
    STOCKOUT_CODES,
    MachineSpecError,
    resolve_gpus,
)

ARGUMENT_SPEC: dict[str, Any] = {
    "name": {"type": "str", "required": True},
    "state": {"type": "str", "default": "present", "choices": ["present", "absent", "started", "stopped"]},
    "create_if_missing": {"type": "bool", "default": False},
    "zone": {"type": "str", "required": True},
    "fallback_zones": {"type": "list", "elements": "str", "default": []},
    "zone_order": {"type": "str", "choices": ["advice", "given"]},
    "machine_type": {"type": "str"},
    "gpu_type": {"type": "str"},
    "gpu_count": {"type": "int"},
    "image_family": {"type": "str"},
    "image": {"type": "str"},
    "image_project": {"type": "str"},
    "boot_disk_size_gb": {"type": "int"},
    "boot_disk_type": {
        "type": "str",
        "choices": ["pd-balanced", "pd-ssd", "pd-standard", "pd-extreme", "hyperdisk-balanced"],
    },
    "boot_disk_interface": {"type": "str", "choices": ["NVME", "SCSI"]},
    "network": {"type": "str"},
    "subnetwork": {"type": "str"},
    "external_ip": {"type": "bool"},
    "nic_type": {"type": "str", "choices": ["GVNIC", "VIRTIO_NET"]},
    "tags": {"type": "list", "elements": "str", "default": []},
    "labels": {"type": "dict", "default": {}},
    "purge_labels": {"type": "bool", "default": False},
    "metadata": {"type": "dict", "default": {}},
    "purge_metadata": {"type": "bool", "default": False},
    "ssh_keys": {"type": "list", "elements": "str", "default": [], "no_log": False},
    "service_account_email": {"type": "str"},
    "scopes": {"type": "list", "elements": "str"},
    "spot": {"type": "bool"},
    "provisioning_model": {"type": "str", "choices": ["standard", "spot", "flex_start"]},
    "max_run_duration": {"type": "str"},
    "request_valid_for_duration": {"type": "str"},
    "instance_termination_action": {"type": "str", "choices": ["STOP", "DELETE"]},
    "ip_preference": {"type": "list", "elements": "str", "default": ["public_ip", "private_ip"]},
    "wait": {"type": "bool", "default": True},
    "resource_policies": {"type": "list", "elements": "str"},
    **AUTH_ARGUMENT_SPEC,
}


class InstanceManager:
    """One run of the module: find the VM, then converge it to the asked state."""

    def __init__(self, call: Call, client: GcpClient, project: str) -> None:
        self.call = call
        self.client = client
        self.project = project
        self.params = call.params
        self.check = call.check_mode
        self.actions: list[str] = []
        self.zones_tried: list[dict[str, Any]] = []
        self.zone_advice: list[dict[str, Any]] = []
        self.preempted_at: str | None = None
        self.request_valid_for_s = FLEX_START_MAX_WAIT_S
        # Whether something was changed for good; a failed insert whose leftover we deleted is not.
        self.applied = False
        self.op_timeout = float(self.params["operation_timeout"])
        self.ip_preference = tuple(self.params["ip_preference"])

    # --- API helpers ------------------------------------------------------------------------------

    def path(self, zone: str, suffix: str = "") -> str:
        return f"projects/{self.project}/zones/{zone}/instances/{self.params['name']}{suffix}"

    def run_op(self, method: str, path: str, body: dict[str, Any] | None = None) -> None:
        op = self.client.request(method, path, body=body) or {}
        if self.params["wait"]:
            self.client.wait_operation(op, project=self.project, timeout_s=self.op_timeout)
        if not path.endswith("/instances"):  # an insert counts only once it succeeded (see create)
            self.applied = True

    def find(self, zones: list[str]) -> tuple[str | None, dict[str, Any] | None]:
        for zone in zones:
            found = self.client.get_instance(self.project, zone, self.params["name"])
            if found:
                return zone, found
        return None, None

    def settle(self, zone: str, instance: dict[str, Any]) -> dict[str, Any]:
        """Wait while the VM is between states (STOPPING, STAGING...) so start/stop act on a stable one."""
        deadline = time.monotonic() + self.op_timeout
        while instance.get("status") in SETTLING_STATES and time.monotonic() < deadline:
            time.sleep(1.0)
            instance = self.client.get_instance(self.project, zone, self.params["name"]) or {}
        return instance

    def preflight(self, spec: InstanceSpec, zone: str) -> None:
        """Ask the API whether the zone, the GPU and the machine type exist there, before creating.

        The GPU is checked before the machine type: a G2 type is missing exactly where the L4 is.
        """
        field = "zone" if zone == spec.zone else "fallback_zones"
        if not self.client.get(f"projects/{self.project}/zones/{zone}", allow_404=True):
            raise SpecError(
                f"{field}: zone '{zone}' does not exist in project '{self.project}'; list its zones with "
                "'gcloud compute zones list'"
            )
        gpu = spec.gpus.gpu_type
        if gpu and not self.client.get(
            f"projects/{self.project}/zones/{zone}/acceleratorTypes/{gpu}", allow_404=True
        ):
            raise SpecError(
                f"{field}: GPU {gpu} is not offered in zone {zone}; pick a zone that has it "
                f"('gcloud compute accelerator-types list --filter=name={gpu}')"
            )
        if not self.client.get(
            f"projects/{self.project}/zones/{zone}/machineTypes/{spec.machine_type}", allow_404=True
        ):
            raise SpecError(
                f"machine_type: '{spec.machine_type}' is not offered in {zone}; list them with "
                f"'gcloud compute machine-types list --zones {zone}'"
            )

    # --- converging -------------------------------------------------------------------------------

    def zone_order(self, spec: InstanceSpec) -> list[str]:
        """The zone, then the fallback zones: ranked by Google's capacity advice (zone_order=advice,
        when it answers), else in the order given. The advice reorders, it never drops a zone."""
        zones = spec.zones
        if (self.params["zone_order"] or "advice") != "advice" or len(zones) < 3:
            return zones  # nothing to reorder: the zone is always tried first
        gpu_type = spec.gpus.gpu_type if spec.gpus and spec.gpus.attach else ""
        gpu_count = spec.gpus.gpu_count if spec.gpus and spec.gpus.attach else 0
        ordered, advice = order_zones(self.client, self.project, zones[1:], spec.machine_type or "",
                                      spec.provisioning_model or "STANDARD", gpu_type or "", gpu_count or 0)
        self.zone_advice = [a.as_dict() for a in advice]
        return [zones[0], *ordered]

    def create(self, spec: InstanceSpec) -> str:
        """Insert in the zone, then each fallback zone on stock-out; clean up after any failed insert."""
        for zone in spec.zones:
            self.preflight(spec, zone)
        if self.check:
            self.actions.append(f"insert in {spec.zones[0]}")
            return spec.zones[0]
        last_error: GcpOperationError | None = None
        for zone in self.zone_order(spec):
            self.actions.append(f"insert in {zone}")
            try:
                path = f"projects/{self.project}/zones/{zone}/instances"
                if spec.flex_start:
                    self.insert_flex_start(zone, path, insert_body(spec, zone, self.project))
                else:
                    self.run_op("POST", path, insert_body(spec, zone, self.project))
            except GcpOperationError as exc:
                self.zones_tried.append({"zone": zone, "error": exc.code})
                self.remove_leftover(zone)
                if exc.code in STOCKOUT_CODES:
                    last_error = exc
                    continue
                raise
            self.zones_tried.append({"zone": zone, "error": None})
            self.applied = True
            skipped = [f"{z['zone']} ({z['error']})" for z in self.zones_tried if z["error"]]
            if skipped:
                self.call.warn(f"created in the fallback zone {zone}: out of stock in {', '.join(skipped)}")
            return zone
        tried = ", ".join(z["zone"] for z in self.zones_tried)
        raise GcpOperationError(
            f"no capacity for {spec.machine_type} in any zone tried ({tried}); nothing was "
            f"left behind. Last error: {last_error.message}",
            code=last_error.code,
        )

    def insert_flex_start(self, zone: str, path: str, body: dict[str, Any]) -> None:
        """Insert a Flex-start VM; return once it is queued (PENDING) or made, whichever comes first.

        Its insert operation stays RUNNING while Google looks for capacity (up to the request's
        validity, two hours at most), longer than any task should block without a word: the role
        waits for it with progress, and a Ctrl-C there leaves the request queued at Google.
        """
        op = self.client.request("POST", path, body=body) or {}
        if not self.params["wait"]:
            return
        deadline = time.monotonic() + self.op_timeout
        while True:
            found = self.client.get_instance(self.project, zone, self.params["name"]) or {}
            if found.get("status") == PENDING_STATUS:
                return
            try:
                self.client.wait_operation(op, project=self.project,
                                           timeout_s=max(0.1, min(1.0, deadline - time.monotonic())))
                return
            except GcpOperationError as exc:
                if exc.code != "TIMEOUT" or time.monotonic() >= deadline:
                    raise

    def remove_leftover(self, zone: str) -> None:
        """A failed insert can leave a TERMINATED shell behind for a moment; delete it, leave nothing."""
        leftover = self.client.get_instance(self.project, zone, self.params["name"])
        if leftover:
            self.actions.append(f"delete leftover in {zone}")
            applied = self.applied
            try:
                self.run_op("DELETE", self.path(zone))
            except GcpApiError as exc:
                if exc.status != 404:
                    raise
            self.applied = applied

    def update_fingerprinted(self, zone: str, kind: str, wanted: Any) -> None:
        """setLabels / setMetadata / setTags with the current fingerprint; on 412 re-read once and retry."""
        for attempt in (1, 2):
            current = self.client.get_instance(self.project, zone, self.params["name"]) or {}
            if kind == "setLabels":
                body = {"labels": wanted, "labelFingerprint": current.get("labelFingerprint")}
            elif kind == "setMetadata":
                body = {
                    "items": [{"key": k, "value": v} for k, v in sorted(wanted.items())],
                    "fingerprint": (current.get("metadata") or {}).get("fingerprint"),
                }
            else:
                body = {"items": wanted, "fingerprint": (current.get("tags") or {}).get("fingerprint")}
            try:
                self.run_op("POST", self.path(zone, f"/{kind}"), body)
                return
            except GcpApiError as exc:
                if exc.status != 412 or attempt == 2:
                    raise

    def converge_existing(self, spec: InstanceSpec | None, zone: str, instance: dict[str, Any]) -> None:
        """Update labels/metadata/tags, then the power state. Immutable differences are an error."""
        state = self.params["state"]
        if spec is not None:
            differences = immutable_differences(spec, instance)
            if differences:
                raise SpecError(
                    f"instance '{spec.name}' in {zone} differs in what this module does not change: "
                    f"{'; '.join(differences)}. Either set these options to match the VM, or delete it "
                    "(state: absent, or teardown with -e forja_teardown_delete=true) and create it again"
                )
            labels_now = dict(instance.get("labels") or {})
            labels = wanted_labels(spec, labels_now, self.params["purge_labels"])
            if labels != labels_now:
                self.actions.append("setLabels")
                if not self.check:
                    self.update_fingerprinted(zone, "setLabels", labels)
            meta_now = metadata_dict(instance)
            meta = wanted_metadata(spec, meta_now, self.params["purge_metadata"])
            if meta != meta_now:
                self.actions.append("setMetadata")
                if not self.check:
                    self.update_fingerprinted(zone, "setMetadata", meta)
            tags_now = sorted((instance.get("tags") or {}).get("items") or [])
            if spec.tags != tags_now:
                self.actions.append("setTags")
                if not self.check:
                    self.update_fingerprinted(zone, "setTags", spec.tags)
        if not self.check and instance.get("status") != PENDING_STATUS:  # a queued request: no op to wait for
            instance = self.settle(zone, instance)
        status = instance.get("status")
        if status == PENDING_STATUS:
            # A Flex-start request still queued for capacity: it starts by itself when Google has it.
            if state == "stopped":
                self.call.warn(f"{self.params['name']} is a Flex-start request still waiting for capacity "
                               "(PENDING); it cannot be stopped: delete it (state: absent) to cancel it")
        elif state == "started" and status != "RUNNING":
            self.actions.append("start")
            self.preempted_at = self.last_preemption(zone, instance)
            if self.preempted_at:
                self.call.warn(
                    f"{spec.name} is a Spot VM that Google preempted at {self.preempted_at}; starting it "
                    "again (the training unit resumes from its last checkpoint at boot)"
                )
            if not self.check:
                self.run_op("POST", self.path(zone, "/start"))
        elif state == "stopped" and status not in STOPPED_STATES:
            self.actions.append("stop")
            if not self.check:
                self.run_op("POST", self.path(zone, "/stop"))

    def last_preemption(self, zone: str, instance: dict[str, Any]) -> str | None:
        """When a stopped Spot VM was preempted (see `forja_gcp_instance.last_preemption`)."""
        return last_preemption(self.client, self.project, zone, instance)

    def may_create(self) -> bool:
        """present creates a missing VM; started/stopped only when asked to (create_if_missing)."""
        state = self.params["state"]
        return state == "present" or (state in ("started", "stopped") and self.params["create_if_missing"])

    def spec(self) -> InstanceSpec:
        """The validated request; the machine type and image are required only if we may create."""
        params = self.params
        creating = self.may_create()
        gpus = None
        if params["machine_type"] or creating:
            if not params["machine_type"]:
                raise SpecError(
                    "machine_type: required to create the VM (e.g. g2-standard-8); the gcp_instance "
                    "role passes gcp_instance_machine_type"
                )
            gpus = resolve_gpus(params["machine_type"], params["gpu_type"], params["gpu_count"])
        elif params["gpu_type"] or params["gpu_count"]:
            raise SpecError("machine_type: gpu_type and gpu_count are checked against it; set it too")
        spec = validate_spec(params, self.project, gpus, creating=creating)
        check_flex_start_machine(spec)
        self.request_valid_for_s = spec.request_valid_for_s or FLEX_START_MAX_WAIT_S
        return spec

    def refuse_missing(self, zones: list[str]) -> None:
        """started/stopped on a VM that does not exist: say what was looked for; create nothing."""
        params = self.params
        where = f"zone {zones[0]}" if len(zones) == 1 else f"zones {', '.join(zones)}"
        raise SpecError(
            f"name: no VM '{params['name']}' in project '{self.project}' ({where}), so there is "
            f"nothing to {'start' if params['state'] == 'started' else 'stop'}; nothing was created. "
            "Check name, project and zone; to create the VM, set create_if_missing: true (the "
            "gcp_instance role: gcp_instance_create_if_missing=true, as playbooks/provision.yml does) "
            "or use state: present"
        )

    def run(self) -> dict[str, Any]:
        params = self.params
        state = params["state"]
        spec: InstanceSpec | None = None
        search = [params["zone"], *params["fallback_zones"]]
        if state != "absent":
            spec = self.spec()
            search = spec.zones
        zone, instance = self.find(search)
        if instance is None:
            # Not found anywhere: a wrong project reads the same as a missing VM, so tell them apart.
            self.client.require_project(self.project)
            if state in ("started", "stopped") and not self.may_create():
                self.refuse_missing(search)
        before_facts = instance_facts(instance, self.ip_preference) if instance else None
        before = comparable_view(before_facts, metadata_dict(instance) if instance else None)

        if state == "absent":
            if instance:
                self.actions.append(f"delete in {zone}")
                if not self.check:
                    self.run_op("DELETE", self.path(zone))
            return self.result(zone or params["zone"], before, {}, None)

        if instance is None:
            zone = self.create(spec)
            if state == "stopped":
                self.actions.append("stop")
                if not self.check:
                    self.run_op("POST", self.path(zone, "/stop"))
            if self.check:
                status = "TERMINATED" if state == "stopped" else "RUNNING"
                final = predicted_facts(spec, zone, self.project, status)
            else:
                made = self.client.get_instance(self.project, zone, spec.name) or {}
                final = instance_facts(made, self.ip_preference)
            after = comparable_view(final, spec.metadata)
            return self.result(zone, before, after, final)

        self.converge_existing(spec, zone, instance)
        if self.check:
            final = dict(before_facts or {})
            final["labels"] = wanted_labels(spec, final.get("labels") or {}, params["purge_labels"])
            final["tags"] = list(spec.tags)
            if "start" in self.actions:
                final["status"] = "RUNNING"
            if "stop" in self.actions:
                final["status"] = "TERMINATED"
            meta = wanted_metadata(spec, metadata_dict(instance), params["purge_metadata"])
            final["metadata_keys"] = sorted(meta)
        else:
            refreshed = self.client.get_instance(self.project, zone, spec.name) or {}
            final = instance_facts(refreshed, self.ip_preference)
            meta = metadata_dict(refreshed)
        return self.result(zone, before, comparable_view(final, meta), final)

    def result(
        self, zone: str, before: dict[str, Any], after: dict[str, Any], facts: dict[str, Any] | None
    ) -> dict[str, Any]:
        result: dict[str, Any] = {"changed": bool(self.actions), "zone": zone, "actions": self.actions}
        if facts is not None:
            result["instance"] = facts
        if self.zones_tried:
            result["zones_tried"] = self.zones_tried
        if self.zone_advice:
            result["zone_advice"] = self.zone_advice
        if self.preempted_at:
            result["preempted_at"] = self.preempted_at
        if facts is not None and facts.get("status") == PENDING_STATUS:
            result["pending"] = True
            result["request_valid_for_s"] = self.request_valid_for_s
        header = f"instance {self.params['name']}"
        return self.call.with_diff(result, before, after, before_header=header, after_header=header)


# AnsibleModule's arguments: the module validates with them, and so does its action plugin.
SPEC: dict[str, Any] = {
    "argument_spec": ARGUMENT_SPEC,
    "mutually_exclusive": [("image", "image_family"), ("credentials_file", "credentials_json")],
}


def progress(manager: InstanceManager | None) -> dict[str, Any]:
    """What a failed run had done before it failed: its actions, and whether any was applied."""
    return {"actions": manager.actions if manager else [], "changed": bool(manager and manager.applied)}


def run(call: Call) -> dict[str, Any]:
    """Bring the VM (or the cluster's members) to the asked state; the result, or ModuleFailure."""
    for entry in call.params["ip_preference"]:
        if entry not in ("public_ip", "private_ip"):
            raise ModuleFailure(f"ip_preference: '{entry}' must be public_ip or private_ip")
    manager: InstanceManager | None = None
    try:
        config = config_from_params(call.params, "forja-gcp-gpu-instance/0.1")
        project = config.resolved_project()
        if not project:
            raise ModuleFailure("project: not set; set project or FORJA_GCP_PROJECT to the GCP project ID")
        manager = InstanceManager(call, GcpClient(config), project)
        return manager.run()
    except (SpecError, MachineSpecError) as exc:
        raise ModuleFailure(str(exc), changed=False) from exc
    except GcpOperationError as exc:
        raise ModuleFailure(
            exc.message,
            error_code=exc.code,
            zone=exc.zone,
            zones_tried=manager.zones_tried if manager else [],
            **progress(manager),
        ) from exc
    except GcpError as exc:
        raise ModuleFailure(exc.message, http_status=exc.status, reason=exc.reason,
                            **progress(manager)) from exc


def main() -> None:
    run_as_module(SPEC, run)


if __name__ == "__main__":
    main()
