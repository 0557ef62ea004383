#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""The Cloud Storage bucket a GPU VM mirrors its checkpoints to, and the VM's access to it alone."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gcp_gpu_bucket
short_description: A Cloud Storage bucket for a GPU VM's checkpoints, private, with old checkpoints expiring
description:
  - Creates or updates one bucket so that it is, and stays, what a Spot VM's checkpoints need, the
    durable store they outlive the VM and its zone in. Through Google's own client, google-cloud-storage.
  - Its O(location) is the one given (a bucket's location cannot change; a bucket elsewhere is refused).
  - Uniform bucket-level access is on and public access prevention is C(enforced), always; access is
    by IAM only, and nothing in it can become public. There is no option to turn either off.
  - A lifecycle rule deletes objects under O(checkpoint_prefix) older than O(checkpoint_retention_days)
    days. Lifecycle rules of the bucket's other prefixes are kept as they are.
  - O(service_account_email) (the VM's service account) gets C(roles/storage.objectAdmin) in the
    bucket's IAM policy, on this bucket only; never in the project's policy. Other members are kept.
  - Bad input fails before anything changes, naming the field and the fix - an invalid bucket name,
    a bucket of another project or one these credentials may not read, a location that is not one.
  - Idempotent, with check mode and C(--diff). Runs on the controller.
  - Of the shared GCP options, O(api_url) and O(operation_timeout) are the Compute API's and unused
    here; Cloud Storage is Google's endpoint, or O(storage_emulator_host).
version_added: "0.1.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - forja.gpu.gcp_auth
  - forja.gpu.gcp_auth.modules
  - forja.gpu.gcp_auth.storage
options:
  name:
    description:
      - The bucket's name, global across Cloud Storage (3-63 lower-case letters, digits, C(-), C(_),
        C(.); not starting with C(goog)).
    type: str
    required: true
  state:
    description: Whether the bucket exists. C(absent) deletes it, only when it is empty unless O(force).
    type: str
    choices: [present, absent]
    default: present
  location:
    description:
      - Where the bucket lives; required with O(state=present). Give the VM's region (for example
        C(us-central1)), so that checkpoints neither cross regions nor pay for it. Multi-regions
        (C(US), C(EU), C(ASIA)) and predefined dual-regions are accepted too.
    type: str
  checkpoint_prefix:
    description:
      - The folder under which checkpoints live; the lifecycle rule applies there only. With the trainer's
        C(checkpoint_bucket) set to C(gs://BUCKET/checkpoints) its objects land under C(checkpoints/).
    type: str
    default: checkpoints/
  checkpoint_retention_days:
    description:
      - Objects under O(checkpoint_prefix) older than this many days (since each was written) are deleted
        by Cloud Storage. A run's newest checkpoints are recent and stay; those of runs untouched this long
        go. C(0) removes forja's rule and keeps checkpoints forever.
    type: int
    default: 30
  service_account_email:
    description:
      - The VM's service account (C(NAME@PROJECT.iam.gserviceaccount.com)); it gets
        C(roles/storage.objectAdmin) on this bucket only. Empty grants nothing.
    type: str
  force:
    description: With O(state=absent), delete the bucket's objects too (at most 256; more fails).
    type: bool
    default: false
notes:
  - Supports C(check_mode) and C(diff).
  - Needs the Python library google-cloud-storage on the controller (a dependency of forja).
  - The credentials need C(roles/storage.admin) on the project (create a bucket, set its IAM policy).
seealso:
  - name: Bucket naming rules
    description: What a bucket name may be.
    link: https://cloud.google.com/storage/docs/buckets#naming
  - name: Object Lifecycle Management
    description: How the C(age) and C(matchesPrefix) conditions select objects.
    link: https://cloud.google.com/storage/docs/lifecycle
"""

EXAMPLES = r"""
- name: Create the checkpoint bucket next to the VM, writable by the VM's service account only
  forja.gpu.gcp_gpu_bucket:
    project: my-project
    name: my-project-forja-checkpoints
    location: us-central1
    service_account_email: forja-vm@my-project.iam.gserviceaccount.com
  delegate_to: localhost

- name: Keep checkpoints a week instead of a month
  forja.gpu.gcp_gpu_bucket:
    project: my-project
    name: my-project-forja-checkpoints
    location: us-central1
    checkpoint_retention_days: 7
  delegate_to: localhost

- name: Remove the bucket and what is in it
  forja.gpu.gcp_gpu_bucket:
    project: my-project
    name: my-project-forja-checkpoints
    state: absent
    force: true
  delegate_to: localhost
"""

RETURN = r"""
bucket:
  description: What forja manages on the bucket, as it is (or would be, in check mode) after the run.
  returned: when state is present
  type: dict
  contains:
    name: {description: The bucket's name., type: str}
    location: {description: "Its location, upper-case as the API gives it.", type: str}
    uniform_bucket_level_access: {description: Always true., type: bool}
    public_access_prevention: {description: Always C(enforced)., type: str}
    checkpoint_lifecycle_rule:
      description: forja's rule (C(Delete) on C(age) and C(matchesPrefix)); null when kept forever.
      type: dict
    object_admins: {description: Members holding roles/storage.objectAdmin on the bucket., type: list}
url:
  description: The bucket as a C(gs://) URL, for the trainer's checkpoint_bucket.
  returned: when state is present
  type: str
  sample: gs://my-project-forja-checkpoints
"""

from typing import Any

from ansible_collections.forja.gpu.plugins.module_utils.forja_call import Call, ModuleFailure, run_as_module
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    AUTH_ARGUMENT_SPEC,
    GcpError,
    config_from_params,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import SpecError
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_storage import (
    CLIENT_ERRORS,
    OBJECT_ROLE,
    Wanted,
    api_message,
    call_options,
    create,
    emulator_host,
    lifecycle_after,
    lookup,
    make_client,
    policy_members,
    validate,
    view,
    wanted_view,
)


def ensure_present(client: Any, bucket: Any, wanted: Wanted, params: dict[str, Any],
                   check_mode: bool, call: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Create or correct the bucket; (before, after) views. Nothing is written in check mode."""
    prefix = params["checkpoint_prefix"]
    policy = bucket.get_iam_policy(requested_policy_version=3, **call) if bucket else None
    members = policy_members(policy, OBJECT_ROLE) if policy is not None else set()
    before = view(bucket, members, prefix)
    after = wanted_view(wanted, members)
    if bucket is not None and before["location"] != wanted.location:
        raise SpecError(
            f"location: bucket '{wanted.name}' is in {before['location']}, not {wanted.location}, and a "
            f"bucket's location cannot change; set location to {before['location']}, or choose another name")
    if before == after or check_mode:
        return before, after
    if bucket is None:
        bucket = client.bucket(wanted.name)
        bucket.iam_configuration.uniform_bucket_level_access_enabled = True
        bucket.iam_configuration.public_access_prevention = "enforced"
        bucket.lifecycle_rules = lifecycle_after([], wanted.lifecycle_rule, prefix)
        bucket = create(client, bucket, wanted.location, call)
    else:
        access_drifted = (not before["uniform_bucket_level_access"]
                          or before["public_access_prevention"] != "enforced")
        rule_drifted = before["checkpoint_lifecycle_rule"] != after["checkpoint_lifecycle_rule"]
        if access_drifted:
            bucket.iam_configuration.uniform_bucket_level_access_enabled = True
            bucket.iam_configuration.public_access_prevention = "enforced"
        if rule_drifted:
            rules = list(bucket.lifecycle_rules or [])
            bucket.lifecycle_rules = lifecycle_after(rules, wanted.lifecycle_rule, prefix)
        if access_drifted or rule_drifted:
            bucket.patch(**call)
    if after["object_admins"] != before.get("object_admins", []):
        policy = bucket.get_iam_policy(requested_policy_version=3, **call)
        member = f"serviceAccount:{wanted.service_account_email}"
        bindings = (b for b in policy.bindings if b.get("role") == OBJECT_ROLE and not b.get("condition"))
        binding = next(bindings, None)
        if binding is None:
            policy.bindings.append({"role": OBJECT_ROLE, "members": {member}})
        else:
            binding["members"] = set(binding.get("members") or ()) | {member}
        bucket.set_iam_policy(policy, **call)  # the policy's etag refuses a concurrent change
    return before, after


def ensure_absent(bucket: Any, params: dict[str, Any], check_mode: bool, call: dict[str, Any]) -> bool:
    if bucket is None:
        return False
    holds_objects = next(iter(bucket.list_blobs(max_results=1, **call)), None) is not None
    if holds_objects and not params["force"]:
        raise SpecError(f"force: bucket '{bucket.name}' still holds objects; set force: true to delete them "
                        "with it, or empty it first")
    if not check_mode:
        bucket.delete(force=params["force"], **call)
    return True


# AnsibleModule's arguments: the module validates with them, and so does its action plugin.
SPEC: dict[str, Any] = {
    "argument_spec": {
        "name": {"type": "str", "required": True},
        "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
        "location": {"type": "str"},
        "checkpoint_prefix": {"type": "str", "default": "checkpoints/"},
        "checkpoint_retention_days": {"type": "int", "default": 30},
        "service_account_email": {"type": "str"},
        "force": {"type": "bool", "default": False},
        "storage_emulator_host": {"type": "str"},
        **AUTH_ARGUMENT_SPEC,
    },
    "mutually_exclusive": [("credentials_file", "credentials_json")],
}


def run(call: Call) -> dict[str, Any]:
    """Keep the bucket as asked; the result, or ModuleFailure naming the problem."""
    params = call.params
    result: dict[str, Any] = {"changed": False}
    emulator: str | None = None
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    try:
        validate(params)
        config = config_from_params(params, "forja-gcp-gpu-bucket/0.1")
        project = config.resolved_project()
        if not project:
            raise SpecError("project: not set; set project or FORJA_GCP_PROJECT")
        request = call_options(float(params["request_timeout"]))
        emulator = emulator_host(params, dict(config.env))
        client = make_client(config, emulator)
        bucket = lookup(client, params["name"], project, request)
        if params["state"] == "absent":
            result["changed"] = ensure_absent(bucket, params, call.check_mode, request)
            before, after = (view(bucket, None, params["checkpoint_prefix"]) if bucket else {}), {}
        else:
            before, after = ensure_present(client, bucket, Wanted.from_params(params), params,
                                           call.check_mode, request)
            result.update(changed=before != after, bucket=after, url=f"gs://{params['name']}")
    except SpecError as exc:
        raise ModuleFailure(str(exc), changed=False) from exc
    except GcpError as exc:
        raise ModuleFailure(exc.message, http_status=exc.status, reason=exc.reason) from exc
    except CLIENT_ERRORS as exc:
        where = f"the emulator at {emulator}" if emulator else "Cloud Storage"
        cause = getattr(exc, "cause", None) or exc  # a RetryError carries the last failure
        raise ModuleFailure(f"{where}: {type(cause).__name__}: {api_message(cause)}; check "
                            f"{'storage_emulator_host' if emulator else 'the credentials and the network'}",
                            changed=False) from exc
    return call.with_diff(result, before, after)


def main() -> None:
    run_as_module(SPEC, run)


if __name__ == "__main__":
    main()
