# Copyright: forja contributors
# Apache-2.0
"""How Compute Engine's firewall decides one ingress connection, and the sentence when it refuses.

gcp_gpu_firewall checks with it, after keeping forja's rule, that the network's rules admit SSH
from the source Ansible connects from (IAP's range, or the controller's address): a mismatch
otherwise shows up later as an SSH timeout that names nothing.
"""

from __future__ import annotations

import ipaddress
from typing import Any


def _ports_cover(entry: dict[str, Any], port: int) -> bool:
    if str(entry.get("IPProtocol")) not in ("tcp", "all", "6"):
        return False
    ports = entry.get("ports") or []
    if not ports:
        return True
    for spec in ports:
        low, _dash, high = str(spec).partition("-")
        if int(low) <= port <= int(high or low):
            return True
    return False


def _matches(rule: dict[str, Any], source: ipaddress.IPv4Network | ipaddress.IPv6Network,
             tags: set[str], port: int) -> bool:
    if rule.get("disabled") or (rule.get("direction") or "INGRESS") != "INGRESS":
        return False
    if rule.get("targetServiceAccounts"):
        return False
    targets = set(rule.get("targetTags") or [])
    if targets and not targets & tags:
        return False
    ranges = []
    for text in rule.get("sourceRanges") or []:
        try:
            ranges.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            continue
    if not any(source.version == r.version and source.subnet_of(r) for r in ranges):  # type: ignore[arg-type]
        return False
    entries = rule.get("allowed") or rule.get("denied") or []
    return any(_ports_cover(e, port) for e in entries)


def decide(rules: list[dict[str, Any]], source: str, tags: list[str], port: int) -> dict[str, Any] | None:
    """The rule that decides a connection from every address of `source`, or None (implied deny).

    Lowest priority number first; at equal priority a deny rule wins, as in GCE.
    """
    net = ipaddress.ip_network(source, strict=False)
    matching = [r for r in rules if _matches(r, net, set(tags), port)]
    matching.sort(key=lambda r: (int(r.get("priority", 1000)), 0 if r.get("denied") else 1))
    return matching[0] if matching else None


def describe(rule: dict[str, Any]) -> str:
    action = "deny" if rule.get("denied") else "allow"
    ports = ",".join(
        f"{e.get('IPProtocol')}:{'/'.join(e.get('ports') or ['all'])}"
        for e in (rule.get("allowed") or rule.get("denied") or [])
    )
    sources = ",".join(rule.get("sourceRanges") or rule.get("sourceTags") or []) or "-"
    targets = ",".join(rule.get("targetTags") or []) or "all VMs"
    return (f"{rule.get('name')} ({action} {ports} from {sources} to {targets}, "
            f"priority {rule.get('priority', 1000)})")


def refusal(rules: list[dict[str, Any]], decider: dict[str, Any] | None, network: str, source: str,
            tags: list[str], port: int, path: str) -> str:
    """Why the connection is refused, the rules seen, and what to change."""
    why = (f"rule {describe(decider)} denies it" if decider is not None
           else "no rule admits it (GCE's implied rule denies all other ingress)")
    seen = "; ".join(describe(r) for r in rules) or "none"
    via = f" (SSH path: {path})" if path else ""
    return (f"The firewall of network '{network}' refuses tcp:{port} from {source}{via} to VMs tagged "
            f"{', '.join(tags) or '(none)'}: {why}. Ingress rules seen: {seen}. Fix: choose the SSH "
            "path your rules allow (gcp_instance_ssh_mode: iap, direct or own_rule), or change your "
            "rule to admit this source.")
