#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""Report one GPU VM as Compute Engine sees it, with its preemptions; changes nothing."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gcp_gpu_instance_info
short_description: Report one Compute Engine GPU VM and its preemptions, for a watcher
description:
  - Finds the VM named O(name) in O(zone), then in each of O(fallback_zones), and reports its status,
    its zone and its preemptions. It never changes anything, so it is safe to run every minute.
  - A stopped Spot VM reads C(TERMINATED) whether Google preempted it or its user stopped it. The
    zone's C(compute.instances.preempted) operations tell the two apart; RV(preempted_at) is set only
    when such a preemption is newer than the VM's last start, which is what forja's managed-run
    watcher acts on.
  - Runs on the controller (C(delegate_to=localhost)); needs C(google-auth) and C(requests) there.
version_added: "0.2.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - forja.gpu.gcp_auth
  - forja.gpu.gcp_auth.modules
options:
  name:
    description: Instance name.
    type: str
    required: true
  zone:
    description: The zone to look in first.
    type: str
    required: true
  fallback_zones:
    description: Further zones to look in, in order (where a watcher may have moved the VM).
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Look at the GPU VM and its preemptions
  forja.gpu.gcp_gpu_instance_info:
    name: forja-l4
    zone: us-east1-d
    fallback_zones: [us-east1-b, us-central1-a]
  delegate_to: localhost
  register: vm
"""

RETURN = r"""
exists:
  description: Whether a VM of that name is in one of the zones.
  returned: always
  type: bool
zone:
  description: The zone it is in; empty when it exists nowhere.
  returned: always
  type: str
  sample: us-east1-d
instance:
  description:
    - The VM's facts (those of M(forja.gpu.gcp_gpu_instance)'s RV(instance)); empty when it does not exist.
  returned: always
  type: dict
preempted_at:
  description:
    - When Google preempted this Spot VM, if that is why it is stopped now (RFC 3339); empty otherwise.
  returned: always
  type: str
  sample: "2026-11-23T06:12:41.000-08:00"
preemptions:
  description:
    - Every preemption of the VM in its current zone that the zone's operations still list, oldest first.
  returned: always
  type: list
  elements: str
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    AUTH_ARGUMENT_SPEC,
    GcpClient,
    GcpError,
    config_from_params,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import (
    instance_facts,
    last_preemption,
    preemptions,
)

ARGUMENT_SPEC: dict[str, Any] = {
    "name": {"type": "str", "required": True},
    "zone": {"type": "str", "required": True},
    "fallback_zones": {"type": "list", "elements": "str", "default": []},
    **AUTH_ARGUMENT_SPEC,
}


def observe(client: GcpClient, project: str, name: str, zones: list[str]) -> dict[str, Any]:
    """The first zone that holds the VM, its facts and its preemptions there."""
    for zone in dict.fromkeys(zones):  # each zone once, in order
        instance = client.get_instance(project, zone, name)
        if instance:
            return {
                "exists": True,
                "zone": zone,
                "instance": instance_facts(instance),
                "preempted_at": last_preemption(client, project, zone, instance) or "",
                "preemptions": preemptions(client, project, zone, instance),
            }
    return {"exists": False, "zone": "", "instance": {}, "preempted_at": "", "preemptions": []}


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        mutually_exclusive=[("credentials_file", "credentials_json")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        config = config_from_params(params, "forja-gcp-gpu-instance-info/0.2")
        project = config.resolved_project()
        if not project:
            module.fail_json(msg="project: not set; set project or FORJA_GCP_PROJECT to the GCP project ID")
        client = GcpClient(config)
        result = observe(client, project, params["name"], [params["zone"], *params["fallback_zones"]])
        if not result["exists"]:
            client.require_project(project)  # a wrong project must not read as a VM that is gone
    except GcpError as exc:
        module.fail_json(msg=exc.message, http_status=exc.status, reason=exc.reason)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
