#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""Delete a GPU VM that stayed stopped past its limit, once its checkpoints are known to be in the bucket."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gcp_gpu_prune
short_description: Delete a GPU VM stopped too long, once its checkpoints are in the bucket
description:
  - A stopped (C(TERMINATED)) VM bills no compute, but its boot disk bills every month. Compute Engine
    cannot delete a VM after some time stopped, and a stopped VM runs nothing, so this module, run from
    the controller (playbooks/prune.yml, C(forja prune)), does it.
  - The VM is deleted, with its boot disk, when it has been stopped for longer than O(delete_after)
    (C(lastStopTimestamp)) AND each object that the autostop agent's record (the guest attribute
    C(forja/mirror), written just before it powered the VM off) lists for the runs on the disk (their
    newest checkpoint, its completion marker, their logs and summary) is in the checkpoint bucket O(bucket).
  - On any doubt the VM is kept and the task warns, naming the VM, how long it has been stopped, what its
    disk costs a month, why it is kept and the fix. Doubts are no O(bucket), no record, a record older
    than the VM's last start (stopped by something other than autostop since), a record cut short or
    listing no run, a missing object, or a bucket that cannot be read.
  - Runs on the controller (C(delegate_to=localhost)); needs C(google-auth), C(requests) and
    C(google-cloud-storage) there.
version_added: "0.5.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - forja.gpu.gcp_auth
  - forja.gpu.gcp_auth.modules
  - forja.gpu.gcp_auth.storage
options:
  name:
    description: The VM's name.
    type: str
    required: true
  zone:
    description: The VM's zone.
    type: str
    required: true
  delete_after:
    description:
      - How long the VM must have been stopped before it is deleted, a number and a unit (C(s), C(m),
        C(h), C(d)), for example C(7d), C(36h) or C(90m). An empty string never deletes (reported as C(off)).
    type: str
    default: ""
  bucket:
    description:
      - The checkpoint bucket, C(gs://BUCKET/PREFIX) (the trainer's C(trainer_run_checkpoint_bucket)); each
        run's objects are under C(PREFIX/<run>/). Empty means no bucket, and the VM is never deleted.
    type: str
    default: ""
  dry_run:
    description: Decide and report (C(delete) means "would delete"), delete nothing. Check mode does the same.
    type: bool
    default: false
notes:
  - Supports C(check_mode) (nothing is deleted).
  - The credentials need C(compute.instances.delete) and C(compute.instances.getGuestAttributes) on the
    project, and read access (C(storage.objects.get)) to the bucket.
"""

EXAMPLES = r"""
- name: Delete the VM when it has stayed stopped for a week and its checkpoints are in the bucket
  forja.gpu.gcp_gpu_prune:
    name: forja-l4
    zone: us-east1-d
    delete_after: 7d
    bucket: gs://my-checkpoints/checkpoints
  delegate_to: localhost
  register: pruned
"""

RETURN = r"""
vm:
  description: The VM's name.
  returned: always
  type: str
action:
  description:
    - C(delete) (deleted; in a dry run, would be), C(keep) (due but kept for a doubt, see RV(reason)),
      C(wait) (stopped, not long enough yet), C(not-stopped) (running or between states), C(off) (no
      O(delete_after)) or C(absent) (no such VM).
  returned: always
  type: str
  sample: keep
reason:
  description: Why, in a line for people.
  returned: always
  type: str
deleted:
  description: Whether the VM was deleted by this call.
  returned: always
  type: bool
warning:
  description: For C(keep), the warning (the VM, time stopped, the disk's monthly cost, why, the fix).
  returned: always
  type: str
status:
  description: Compute Engine's status of the VM (before any deletion).
  returned: always
  type: str
last_stop:
  description: When it stopped (C(lastStopTimestamp)); empty when unknown.
  returned: always
  type: str
stopped_for_s:
  description: Seconds it has been stopped (null when not stopped).
  returned: always
  type: float
delete_after_s:
  description: O(delete_after) in seconds (null when off).
  returned: always
  type: float
boot_disk_size_gb:
  description: Its boot disk's size (null when unknown).
  returned: always
  type: int
disk_usd_per_month:
  description: What its disks cost a month at forja's price table (null when unpriced).
  returned: always
  type: float
checked:
  description: The bucket objects looked for (C(PREFIX/<run>/...)).
  returned: always
  type: list
  elements: str
"""

from datetime import datetime, timezone
from typing import Any

from ansible_collections.forja.gpu.plugins.module_utils.forja_call import Call, ModuleFailure, run_as_module
from ansible_collections.forja.gpu.plugins.module_utils.forja_cost import (
    DEFAULT_DISK_TYPE,
    PriceError,
    load_prices,
    region_of,
    short,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    AUTH_ARGUMENT_SPEC,
    GcpClient,
    GcpError,
    config_from_params,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import SpecError, boot_disk_size_of
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_prune import (
    DELETE,
    KEEP,
    MIRROR_ATTRIBUTE,
    judge,
    kept_warning,
    parse_duration,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_storage import (
    CLIENT_ERRORS,
    api_message,
    call_options,
    emulator_host,
    make_client,
)

SPEC: dict[str, Any] = {
    "argument_spec": {
        "name": {"type": "str", "required": True},
        "zone": {"type": "str", "required": True},
        "delete_after": {"type": "str", "default": ""},
        "bucket": {"type": "str", "default": ""},
        "storage_emulator_host": {"type": "str"},
        "dry_run": {"type": "bool", "default": False},
        **AUTH_ARGUMENT_SPEC,
    },
    "mutually_exclusive": [("credentials_file", "credentials_json")],
}
#: Seconds each Cloud Storage call may take, retries included.
STORAGE_TIMEOUT_S = 30.0


def disk_usd_per_month(instance: dict[str, Any]) -> float | None:
    """The instance's disks a month at forja's table (the emulator and GCP name no type on an attached
    disk: forja's default, pd-balanced, is assumed, as forja.cost does)."""
    try:
        prices = load_prices()
        region = region_of(short(instance.get("zone")))
        total = 0.0
        for disk in instance.get("disks") or []:
            size = disk.get("diskSizeGb")
            if size in (None, ""):
                return None
            kind = short(disk.get("diskType") or (disk.get("initializeParams") or {}).get("diskType"))
            total += prices.disk_price(kind or DEFAULT_DISK_TYPE, region).usd_per_gb_month * float(size)
        return round(total, 4)
    except (PriceError, OSError, ValueError, KeyError):
        return None


def guest_record(client: GcpClient, project: str, zone: str, name: str) -> str | None:
    """The autostop agent's forja/mirror guest attribute, None when it never wrote one."""
    found = client.get(f"projects/{project}/zones/{zone}/instances/{name}/getGuestAttributes",
                       params={"variableKey": MIRROR_ATTRIBUTE}, allow_404=True)
    return None if found is None else str(found.get("variableValue") or "") or None


def storage_lookup(params: dict[str, Any], config: Any) -> Any:
    """`missing(bucket, names)` for judge: the names not in Cloud Storage (RuntimeError: cannot say)."""

    def missing(bucket: str, names: list[str]) -> list[str]:
        emulator = emulator_host(params, dict(config.env))
        try:
            client = make_client(config, emulator)
            request = call_options(STORAGE_TIMEOUT_S)
            handle = client.bucket(bucket)
            return [name for name in names if not handle.blob(name).exists(**request)]
        except SpecError as exc:
            raise RuntimeError(str(exc)) from None
        except CLIENT_ERRORS as exc:
            cause = getattr(exc, "cause", None) or exc
            raise RuntimeError(f"{type(cause).__name__}: {api_message(cause)}") from None

    return missing


def run(call: Call) -> dict[str, Any]:
    params = call.params
    try:
        delete_after_s = parse_duration(params["delete_after"])
    except ValueError as exc:
        raise ModuleFailure(f"delete_after: {exc}") from None
    config = config_from_params(params, "forja-gcp-gpu-prune/0.5")
    project = config.resolved_project()
    if not project:
        raise ModuleFailure("project: not set; set gcp_instance_project (or FORJA_GCP_PROJECT), the project")
    name, zone = params["name"], params["zone"]
    result: dict[str, Any] = {
        "changed": False, "vm": name, "action": "absent", "reason": f"no VM {name} in {zone}",
        "deleted": False, "warning": "", "status": "", "last_stop": "", "stopped_for_s": None,
        "delete_after_s": delete_after_s,
        "boot_disk_size_gb": None, "disk_usd_per_month": None, "checked": [],
    }
    try:
        client = GcpClient(config)
        instance = client.get_instance(project, zone, name)
        if instance is None:
            return result
        status = str(instance.get("status") or "")
        due_to_check = delete_after_s is not None and status == "TERMINATED"
        record = guest_record(client, project, zone, name) if due_to_check and params["bucket"] else None
        verdict = judge(
            status=status, last_start=instance.get("lastStartTimestamp"),
            last_stop=instance.get("lastStopTimestamp"),
            now=datetime.now(timezone.utc), delete_after_s=delete_after_s, bucket_url=params["bucket"],
            record_text=record, missing=storage_lookup(params, config))
        result.update(
            action=verdict.action, reason=verdict.reason, status=status,
            last_stop=str(instance.get("lastStopTimestamp") or ""), stopped_for_s=verdict.stopped_for_s,
            boot_disk_size_gb=boot_disk_size_of(instance), disk_usd_per_month=disk_usd_per_month(instance),
            checked=verdict.checked)
        if verdict.action == KEEP:
            result["warning"] = kept_warning(
                name, verdict, result["boot_disk_size_gb"], result["disk_usd_per_month"])
            call.warn(result["warning"])
        if verdict.action == DELETE and not (params["dry_run"] or call.check_mode):
            operation = client.request("DELETE", f"projects/{project}/zones/{zone}/instances/{name}") or {}
            client.wait_operation(operation, project=project, timeout_s=float(params["operation_timeout"]))
            result.update(changed=True, deleted=True)
    except GcpError as exc:
        raise ModuleFailure(exc.message, http_status=exc.status, reason=exc.reason) from None
    return result


def main() -> None:
    run_as_module(SPEC, run)


if __name__ == "__main__":
    main()
