"""Turning a `firewalls.insert`/`patch` body into the stored Firewall, or refusing it.

forja opens exactly the ports it needs (SSH, from the operator's address); the checks here are
the ones Google applies to such rules, so a malformed rule fails in tests, not in production.
"""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

from .errors import invalid_field, not_found, required_field
from .instances import NAME_RE, now, reference

Json = dict[str, Any]
PROTOCOLS = ("tcp", "udp", "icmp", "esp", "ah", "sctp", "ipip", "all")


def build_firewall(body: Json, project: str, base: str, new_id: str, current: Json | None = None) -> Json:
    """The stored Firewall for an insert body, or `current` patched with `body`."""
    firewall = copy.deepcopy(current or {})
    firewall.update(copy.deepcopy(body))
    name = firewall.get("name") or ""
    if not NAME_RE.fullmatch(name):
        raise invalid_field("resource.name", name, f"Must be a match of regex '{NAME_RE.pattern}'")
    network = firewall.get("network") or "global/networks/default"
    _p, scope, net_name = reference("resource.network", network, project, "networks")
    if scope != "global" or net_name != "default":
        raise not_found(f"projects/{project}/global/networks/{net_name}")
    _check_rules(firewall)
    direction = firewall.get("direction") or "INGRESS"
    for field in ("sourceRanges", "destinationRanges"):
        for index, cidr in enumerate(firewall.get(field) or []):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise invalid_field(f"resource.{field}[{index}]", cidr, "Expected a CIDR range.") from None
    # Google's defaults: an ingress rule without sources, or an egress rule without
    # destinations, applies to every address.
    if direction == "INGRESS" and not firewall.get("sourceRanges") and not firewall.get("sourceTags"):
        firewall["sourceRanges"] = ["0.0.0.0/0"]
    if direction == "EGRESS" and not firewall.get("destinationRanges"):
        firewall["destinationRanges"] = ["0.0.0.0/0"]
    project_url = f"{base}projects/{project}"
    firewall.update(
        {
            "kind": "compute#firewall",
            "name": name,
            "network": f"{project_url}/global/networks/default",
            "direction": direction,
            "priority": int(firewall.get("priority", 1000)),
            "disabled": bool(firewall.get("disabled", False)),
            "logConfig": firewall.get("logConfig") or {"enable": False},
            "description": firewall.get("description", ""),
            "selfLink": f"{project_url}/global/firewalls/{name}",
        }
    )
    firewall.setdefault("id", new_id)
    firewall.setdefault("creationTimestamp", now())
    return firewall


def _check_rules(firewall: Json) -> None:
    allowed, denied = firewall.get("allowed") or [], firewall.get("denied") or []
    if bool(allowed) == bool(denied):
        raise invalid_field(
            "resource.allowed", allowed, "Exactly one of 'allowed' or 'denied' must be given."
        )
    rules_field = "resource.allowed" if allowed else "resource.denied"
    for index, rule in enumerate(allowed or denied):
        protocol = str(rule.get("IPProtocol") or "")
        if not protocol:
            raise required_field(f"{rules_field}[{index}].IPProtocol")
        if protocol not in PROTOCOLS and not protocol.isdigit():
            raise invalid_field(
                f"{rules_field}[{index}].IPProtocol", protocol, f"Must be one of {PROTOCOLS} or a number."
            )
        for port_index, port in enumerate(rule.get("ports") or []):
            low, dash, high = str(port).partition("-")
            if (
                not low.isdigit()
                or (dash and not high.isdigit())
                or not 0 <= int(low) <= int(high or low) <= 65535
            ):
                raise invalid_field(
                    f"{rules_field}[{index}].ports[{port_index}]", port, "Expected 'N' or 'N-M'."
                )
