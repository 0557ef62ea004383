#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""A compact placement policy for the VMs of one forja cluster, so Compute Engine puts them close."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gcp_gpu_placement_policy
short_description: Keep a compact placement policy for one cluster of forja's GPU VMs
description:
  - Manages one regional resource policy with C(groupPlacementPolicy.collocation=COLLOCATED). VMs
    that name it in their C(resourcePolicies) are placed close together in the zone (lower latency
    between the nodes of a C(torchrun) job).
  - With O(machine_type) set, a machine series that Compute Engine refuses a compact placement for
    (E2, N1, ...) fails before anything is created, naming the series that take one.
  - C(state=absent) deletes it; Compute Engine refuses while a VM still uses it, so delete the VMs
    first (the C(forja.gpu.gcp_instance) role does).
  - Idempotent, with check mode. Runs on the controller.
version_added: "0.1.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - forja.gpu.gcp_auth
  - forja.gpu.gcp_auth.modules
options:
  name:
    description: Policy name (RFC 1035).
    type: str
    required: true
  state:
    description: Whether the policy exists.
    type: str
    choices: [present, absent]
    default: present
  zone:
    description: The cluster's zone; the policy lives in its region.
    type: str
    required: true
  machine_type:
    description: The cluster's machine type, checked against the series that accept a compact placement.
    type: str
  unsupported:
    description:
      - What to do when O(machine_type)'s series takes no compact placement. C(fail) (before any
        call), or C(skip), which makes no policy and returns RV(supported=false), so the caller
        creates its VMs without one (the gcp_instance role's "where the machine type allows it").
    type: str
    choices: [fail, skip]
    default: fail
notes:
  - Supports C(check_mode).
seealso:
  - name: Placement policies overview
    description: What a compact placement policy does, and the machine series that support it.
    link: https://cloud.google.com/compute/docs/instances/placement-policies-overview
"""

EXAMPLES = r"""
- name: Keep the cluster's compact placement policy
  forja.gpu.gcp_gpu_placement_policy:
    name: forja-l4-compact
    zone: us-east1-d
    machine_type: g2-standard-24
  delegate_to: localhost
"""

RETURN = r"""
supported:
  description: Whether O(machine_type)'s series takes a compact placement (true when it is not given).
  returned: always
  type: bool
policy:
  description: The policy's self link.
  returned: when state is present and the machine type takes a compact placement
  type: str
  sample: https://compute.googleapis.com/compute/v1/projects/p/regions/us-east1/resourcePolicies/forja-l4-compact
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    AUTH_ARGUMENT_SPEC,
    GcpClient,
    GcpError,
    config_from_params,
    region_of,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import NAME_RE, ZONE_RE, SpecError
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_machines import (
    COMPACT_PLACEMENT_FAMILIES,
    supports_compact_placement,
)


def policy_body(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": "forja: the VMs of one cluster, placed close together",
        "groupPlacementPolicy": {"collocation": "COLLOCATED"},
    }


def check(params: dict[str, Any]) -> bool:
    """Bad input, before any call: names and the machine series. Whether the series takes a policy."""
    if not NAME_RE.match(params["name"]):
        raise SpecError(f"name: '{params['name']}' must be 1-63 lowercase letters, digits or '-'")
    if not ZONE_RE.match(params["zone"]):
        raise SpecError(f"zone: '{params['zone']}' is not a zone name such as us-east1-d")
    machine_type = params.get("machine_type") or ""
    supported = not machine_type or supports_compact_placement(machine_type)
    if params["state"] == "present" and not supported and params["unsupported"] == "fail":
        raise SpecError(
            f"machine_type: Compute Engine takes no compact placement policy for '{machine_type}' "
            f"(series {machine_type.split('-', 1)[0].upper()}); the series that do are "
            f"{', '.join(f.upper() for f in COMPACT_PLACEMENT_FAMILIES)}. Pick one of them, or turn the "
            "policy off (the gcp_instance role: gcp_instance_compact_placement=false)"
        )
    return supported


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
            "zone": {"type": "str", "required": True},
            "machine_type": {"type": "str"},
            "unsupported": {"type": "str", "default": "fail", "choices": ["fail", "skip"]},
            **AUTH_ARGUMENT_SPEC,
        },
        mutually_exclusive=[("credentials_file", "credentials_json")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        supported = check(params)
        if params["state"] == "present" and not supported:
            module.exit_json(changed=False, supported=False)
        config = config_from_params(params, "forja-gcp-gpu-placement-policy/0.1")
        project = config.resolved_project()
        if not project:
            raise SpecError("project: not set; set project or FORJA_GCP_PROJECT")
        client = GcpClient(config)
        region = region_of(params["zone"])
        base = f"projects/{project}/regions/{region}/resourcePolicies"
        current = client.get(f"{base}/{params['name']}", allow_404=True)
        if current is None:
            client.require_project(project)
        collocation = ((current or {}).get("groupPlacementPolicy") or {}).get("collocation")
        if current and params["state"] == "present" and collocation != "COLLOCATED":
            raise SpecError(
                f"name: resource policy '{params['name']}' in {region} exists but is not a compact "
                "placement policy; pick another name or delete it"
            )
        changed = (current is None) == (params["state"] == "present")
        if changed and not module.check_mode:
            if params["state"] == "present":
                op = client.request("POST", base, body=policy_body(params["name"]))
            else:
                op = client.request("DELETE", f"{base}/{params['name']}")
            client.wait_operation(op or {}, project=project, timeout_s=float(params["operation_timeout"]))
    except SpecError as exc:
        module.fail_json(msg=str(exc), changed=False)
    except GcpError as exc:
        module.fail_json(msg=exc.message, http_status=exc.status, reason=exc.reason)
    result: dict[str, Any] = {"changed": changed, "supported": supported}
    if params["state"] == "present":
        result["policy"] = client.url(f"{base}/{params['name']}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
