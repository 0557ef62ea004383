#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""An SSH-only ingress firewall rule for forja's GPU VMs, and a check that SSH's path is admitted."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gcp_gpu_firewall
short_description: Allow SSH to forja's GPU VMs only from Google's IAP range or listed addresses
description:
  - Manages one VPC ingress rule that allows C(tcp:22) to VMs carrying O(target_tags).
  - The source is Google's IAP TCP-forwarding range C(35.235.240.0/20) by default
    (C(gcloud compute ssh --tunnel-through-iap)), or the addresses you list. C(0.0.0.0/0) is refused.
  - It never opens any other port to any address. Jupyter listens on 127.0.0.1 on the VM and is
    reached through the SSH tunnel, so no rule for its port exists, by design; there is no option to
    add one.
  - With O(cluster_tag), the rule is instead a cluster's. It opens torch.distributed's ports (the
    c10d rendezvous port 29400, and the kernel's ephemeral range 32768-60999 that NCCL and gloo
    bind their sockets to) only from VMs carrying that tag to VMs carrying it (source tags = target
    tags), never from an address range.
  - With O(admit_source), it then reads every ingress rule of the network and fails, naming the rules
    it saw, unless they admit C(tcp:22) from every address of that source to a VM with O(target_tags),
    as Compute Engine decides (lowest priority number first, a deny wins a tie, else implied deny).
    That is how forja checks that the SSH path Ansible uses (IAP's range, or the controller's address)
    and the rules agree, also with O(state=absent) when the user keeps their own rule.
  - Idempotent, with check mode and C(--diff). Runs on the controller.
version_added: "0.1.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - forja.gpu.gcp_auth
  - forja.gpu.gcp_auth.modules
options:
  name:
    description: Firewall rule name.
    type: str
    default: forja-allow-ssh
  state:
    description: Whether the rule exists.
    type: str
    choices: [present, absent]
    default: present
  network:
    description: VPC network name.
    type: str
    default: default
  source_ranges:
    description: CIDRs allowed to reach port 22. A prefix length of 0 (the whole internet) is refused.
    type: list
    elements: str
    default: [35.235.240.0/20]
  target_tags:
    description: Network tags of the VMs the rule applies to.
    type: list
    elements: str
    default: [forja-ssh]
  priority:
    description: Rule priority (lower wins).
    type: int
    default: 1000
  admit_source:
    description:
      - Address or CIDR that SSH connects from; when set, the network's rules (after this run's change)
        must admit C(tcp:22) from it to O(target_tags), or the module fails. Empty means no check.
    type: str
    default: ""
  ssh_path:
    description: How Ansible connects (iap, direct, own_rule), named in the failure message.
    type: str
    default: ""
  cluster_tag:
    description:
      - The network tag every member of one cluster carries. When set, the rule opens the cluster's
        ports between those VMs only, and O(source_ranges), O(target_tags) and O(admit_source) are
        not used. Empty means the SSH rule.
    type: str
    default: ""
notes:
  - Supports C(check_mode) and C(diff).
seealso:
  - name: IAP TCP forwarding
    description: The 35.235.240.0/20 range and C(gcloud compute ssh --tunnel-through-iap).
    link: https://cloud.google.com/iap/docs/using-tcp-forwarding
"""

EXAMPLES = r"""
- name: Allow SSH through IAP only
  forja.gpu.gcp_gpu_firewall:
    project: my-project
  delegate_to: localhost

- name: Allow SSH from one office address as well
  forja.gpu.gcp_gpu_firewall:
    project: my-project
    source_ranges: [35.235.240.0/20, 203.0.113.7/32]
  delegate_to: localhost
"""

RETURN = r"""
firewall:
  description: The rule as it is (or would be) after the run.
  returned: when state is present
  type: dict
  contains:
    name: {description: Rule name., type: str}
    network: {description: Network (short name)., type: str}
    source_ranges: {description: Allowed sources., type: list}
    target_tags: {description: Target tags., type: list}
    source_tags: {description: A cluster rule's source tag (absent for the SSH rule)., type: list}
    ports: {description: "Port 22, or a cluster rule's ports.", type: list}
admitted_by:
  description: The rule that admits SSH from O(admit_source).
  returned: when admit_source is set
  type: str
"""

from typing import Any

from ansible_collections.forja.gpu.plugins.module_utils.forja_call import Call, ModuleFailure, run_as_module
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    AUTH_ARGUMENT_SPEC,
    GcpClient,
    GcpError,
    config_from_params,
    short_name,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_firewall import decide, refusal
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import (
    CLUSTER_PORTS,
    NAME_RE,
    SpecError,
    validate_source_ranges,
)

SSH_PORT = "22"


def rule_view(rule: dict[str, Any] | None) -> dict[str, Any]:
    """The fields we manage, normalised (short network name, sorted lists)."""
    if not rule:
        return {}
    ports = sorted({p for a in rule.get("allowed") or [] for p in a.get("ports") or []})
    view = {
        "name": rule.get("name"),
        "network": short_name(rule.get("network")),
        "source_ranges": sorted(rule.get("sourceRanges") or []),
        "target_tags": sorted(rule.get("targetTags") or []),
        "ports": ports,
        "priority": int(rule.get("priority", 1000)),
    }
    if rule.get("sourceTags"):  # a cluster rule's; the SSH rule's view stays as it always was
        view["source_tags"] = sorted(rule["sourceTags"])
    return view


def rule_body(params: dict[str, Any], ranges: list[str]) -> dict[str, Any]:
    tag = params["cluster_tag"]
    if tag:
        return {
            "name": params["name"],
            "network": f"global/networks/{params['network']}",
            "direction": "INGRESS",
            "priority": params["priority"],
            "sourceTags": [tag],
            "targetTags": [tag],
            "allowed": [{"IPProtocol": "tcp", "ports": list(CLUSTER_PORTS)}],
            "description": "forja: torch.distributed rendezvous and NCCL/gloo, between one cluster's VMs",
        }
    return {
        "name": params["name"],
        "network": f"global/networks/{params['network']}",
        "direction": "INGRESS",
        "priority": params["priority"],
        "sourceRanges": sorted(ranges),
        "targetTags": sorted(params["target_tags"]),
        "allowed": [{"IPProtocol": "tcp", "ports": [SSH_PORT]}],
        "description": "forja: SSH only (Jupyter is reached through the SSH tunnel)",
    }


def check_path(client: GcpClient, project: str, params: dict[str, Any],
               ours: dict[str, Any] | None) -> str:
    """The rule admitting SSH from admit_source ('' when unchecked); SpecError when none does.

    Reads the network's rules and puts this run's own rule in as it is after the run (also in check
    mode, where nothing changed yet).
    """
    source = params["admit_source"]
    if not source:
        return ""
    listing = client.get(f"projects/{project}/global/firewalls") or {}
    rules = [r for r in listing.get("items") or []
             if short_name(r.get("network")) == params["network"] and r.get("name") != params["name"]
             and not r.get("disabled") and (r.get("direction") or "INGRESS") == "INGRESS"]
    if ours is not None:
        rules.append(ours)
    decider = decide(rules, source, params["target_tags"], int(SSH_PORT))
    if decider is None or decider.get("denied"):
        raise SpecError(refusal(rules, decider, params["network"], source, params["target_tags"],
                                int(SSH_PORT), params["ssh_path"]))
    return str(decider["name"])


# AnsibleModule's arguments: the module validates with them, and so does its action plugin.
SPEC: dict[str, Any] = {
    "argument_spec": {
        "name": {"type": "str", "default": "forja-allow-ssh"},
        "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
        "network": {"type": "str", "default": "default"},
        "source_ranges": {"type": "list", "elements": "str", "default": ["35.235.240.0/20"]},
        "target_tags": {"type": "list", "elements": "str", "default": ["forja-ssh"]},
        "priority": {"type": "int", "default": 1000},
        "admit_source": {"type": "str", "default": ""},
        "ssh_path": {"type": "str", "default": ""},
        "cluster_tag": {"type": "str", "default": ""},
        **AUTH_ARGUMENT_SPEC,
    },
    "mutually_exclusive": [("credentials_file", "credentials_json")],
}


def run(call: Call) -> dict[str, Any]:
    """Keep the rule as asked and check the SSH path; the result, or ModuleFailure naming the problem."""
    params = call.params
    try:
        if not NAME_RE.match(params["name"]):
            raise SpecError(f"name: '{params['name']}' must be lowercase letters, digits or '-'")
        if params["cluster_tag"] and not NAME_RE.match(params["cluster_tag"]):
            raise SpecError(
                f"cluster_tag: '{params['cluster_tag']}' must be lowercase letters, digits or '-'"
            )
        if params["cluster_tag"] and params["admit_source"]:
            raise SpecError(
                "admit_source: a cluster rule admits no address; drop admit_source or cluster_tag"
            )
        if not params["target_tags"]:
            raise SpecError(
                "target_tags: give at least one tag, or the rule would apply to every VM of the network"
            )
        ranges = validate_source_ranges(params["source_ranges"])
        if params["admit_source"]:
            validate_source_ranges([params["admit_source"]])
        if not ranges:
            raise SpecError("source_ranges: give at least one CIDR (35.235.240.0/20 is Google's IAP range)")
        config = config_from_params(params, "forja-gcp-gpu-firewall/0.1")
        project = config.resolved_project()
        if not project:
            raise SpecError("project: not set; set project or FORJA_GCP_PROJECT")
        client = GcpClient(config)
        path = f"projects/{project}/global/firewalls/{params['name']}"
        current = client.get(path, allow_404=True)
        if current is None:  # a wrong project answers 404 too: name it instead of failing the insert
            client.require_project(project)
        want = rule_body(params, ranges)
        before, after = rule_view(current), rule_view(want) if params["state"] == "present" else {}
        changed = before != after
        if changed and not call.check_mode:
            if params["state"] == "absent":
                op = client.request("DELETE", path)
            elif current:
                op = client.request("PATCH", path, body=want)
            else:
                op = client.request("POST", f"projects/{project}/global/firewalls", body=want)
            client.wait_operation(op or {}, project=project, timeout_s=float(params["operation_timeout"]))
        admitted_by = check_path(client, project, params, want if params["state"] == "present" else None)
    except SpecError as exc:
        raise ModuleFailure(str(exc), changed=False) from exc
    except GcpError as exc:
        raise ModuleFailure(exc.message, http_status=exc.status, reason=exc.reason) from exc
    result: dict[str, Any] = {"changed": changed}
    if admitted_by:
        result["admitted_by"] = admitted_by
    if params["state"] == "present":
        result["firewall"] = after
    return call.with_diff(result, before, after)


def main() -> None:
    run_as_module(SPEC, run)


if __name__ == "__main__":
    main()
