"""A project's GCE firewall rules, as the nftables ruleset of one sandbox host's network namespace.

GCE enforces a VPC's firewall outside the VM, so SSH that the rules do not admit never reaches
sshd. The sandbox does the same on its hosts (each one a network namespace on bridge thbr0): the
backend turns the Compute API's stored rules and the instance's network tags into the ruleset
below and loads it into the host's namespace, so a rule/path mismatch fails in tests as on GCP.

GCE's semantics, as documented ("VPC firewall rules"), that the ruleset keeps:
- implied rules: ingress is denied and egress allowed unless a rule says otherwise;
- the rules are stateful: replies of an admitted (or outgoing) connection pass;
- a rule applies to every instance of its network, or only to instances carrying one of its
  `targetTags` (or running as one of its `targetServiceAccounts`);
- the first matching rule by priority decides (lower number first); at equal priority a deny
  rule wins over an allow rule; disabled rules count for nothing.
- a rule admits traffic from its `sourceRanges` or from the primary internal IP of the instances of
  the same network that carry one of its `sourceTags` or run as one of its `sourceServiceAccounts`
  (GCE: "source tags ... apply to the primary internal IP address" of those instances), so a
  cluster's rule between its members' tag admits exactly the members, as it does on GCE.
What it does not enforce (see forja_sandbox/README.md): egress rules, IPv6 ranges, and rule
logging.

Everything here is pure (dicts in, text out); `testhosts` loads the text with one `nft -f`,
which replaces the table atomically.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

Json = dict[str, Any]

#: The table every sandbox host's firewall lives in (family inet), replaced whole on each change.
TABLE = "forja_gce"
#: IP protocol numbers of the names GCE accepts in `IPProtocol` (firewalls.PROTOCOLS, minus "all").
PROTOCOL_NUMBERS = {"icmp": 1, "ipip": 4, "tcp": 6, "udp": 17, "esp": 50, "ah": 51, "sctp": 132}
#: Protocols whose rules may name ports (GCE: tcp, udp and sctp).
PORT_PROTOCOLS = frozenset({6, 17, 132})
#: GCE's priority when a rule gives none.
DEFAULT_PRIORITY = 1000


def _last_segment(url: Any) -> str:
    return str(url or "").rstrip("/").rsplit("/", 1)[-1]


def instance_network(instance: Json) -> str:
    """The short name of the network of the instance's first interface (`default` if unset)."""
    nics = instance.get("networkInterfaces") or [{}]
    return _last_segment(nics[0].get("network")) or "default"


def tags_and_accounts(instance: Json) -> tuple[set[str], set[str]]:
    """An instance's network tags and service-account emails: what rules target and take traffic from."""
    tags = set((instance.get("tags") or {}).get("items") or [])
    return tags, {str(sa.get("email")) for sa in instance.get("serviceAccounts") or []}


def applies_to(rule: Json, instance: Json) -> bool:
    """Whether an enabled ingress rule of the instance's network targets this instance."""
    if rule.get("disabled") or (rule.get("direction") or "INGRESS") != "INGRESS":
        return False
    if (_last_segment(rule.get("network")) or "default") != instance_network(instance):
        return False
    target_tags = set(rule.get("targetTags") or [])
    target_accounts = set(rule.get("targetServiceAccounts") or [])
    if not target_tags and not target_accounts:
        return True
    tags, accounts = tags_and_accounts(instance)
    return bool(target_tags & tags or target_accounts & accounts)


def evaluation_order(firewalls: Iterable[Json], instance: Json) -> list[Json]:
    """The rules that apply to the instance, in the order GCE decides by: priority, deny first."""
    rules = [r for r in firewalls if applies_to(r, instance)]

    def key(rule: Json) -> tuple[int, int, str]:
        deny_first = 0 if rule.get("denied") else 1
        return int(rule.get("priority", DEFAULT_PRIORITY)), deny_first, str(rule.get("name"))

    return sorted(rules, key=key)


def _ipv4_set(cidrs: Iterable[str]) -> list[str] | None:
    """The IPv4 ranges merged (nft refuses overlapping set elements); None when there are none."""
    nets = []
    for cidr in cidrs:
        net = ipaddress.ip_network(str(cidr), strict=False)
        if isinstance(net, ipaddress.IPv4Network):
            nets.append(net)
    if not nets:
        return None
    return [str(n) for n in ipaddress.collapse_addresses(nets)]


def _protocol(name: Any) -> int | None:
    """The protocol number of an `IPProtocol` value; None for "all"."""
    text = str(name).lower()
    if text == "all":
        return None
    if text.isdigit():
        return int(text)
    return PROTOCOL_NUMBERS[text]


def _port_ranges(ports: Iterable[Any]) -> list[tuple[int, int]]:
    """'22', '8000-8100', ... merged into sorted, non-overlapping (low, high) ranges."""
    spans = []
    for port in ports:
        low, _dash, high = str(port).partition("-")
        spans.append((int(low), int(high or low)))
    merged: list[tuple[int, int]] = []
    for low, high in sorted(spans):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(high, merged[-1][1]))
        else:
            merged.append((low, high))
    return merged


def source_addresses(rule: Json, peers: Iterable[Json]) -> list[str]:
    """The primary internal IPs (as /32) of the peers a rule's `sourceTags`/`sourceServiceAccounts` name.

    Peers are the project's instances; only those of the rule's network with an address count.
    """
    tags = set(rule.get("sourceTags") or [])
    accounts = set(rule.get("sourceServiceAccounts") or [])
    if not tags and not accounts:
        return []
    network = _last_segment(rule.get("network")) or "default"
    found = []
    for peer in peers:
        address = ((peer.get("networkInterfaces") or [{}])[0]).get("networkIP")
        if not address or instance_network(peer) != network:
            continue
        peer_tags, peer_accounts = tags_and_accounts(peer)
        if tags & peer_tags or accounts & peer_accounts:
            found.append(f"{address}/32")
    return found


def _set(elements: list[str]) -> str:
    return elements[0] if len(elements) == 1 else "{ " + ", ".join(elements) + " }"


def _match_lines(rule: Json, peers: Iterable[Json] = ()) -> list[str]:
    """The nft matches of one rule, one line per `allowed`/`denied` entry; [] if it can match nothing.

    The sources are the rule's `sourceRanges` plus the addresses of the peers its `sourceTags` /
    `sourceServiceAccounts` name; with none of them (no such peer up yet) it matches nothing.
    """
    sources = _ipv4_set([*(rule.get("sourceRanges") or []), *source_addresses(rule, peers)])
    if sources is None:
        return []
    destinations = None
    if rule.get("destinationRanges"):
        destinations = _ipv4_set(rule["destinationRanges"])
        if destinations is None:
            return []  # only IPv6 destinations: no IPv4 packet matches
    addresses = ["meta nfproto ipv4"] if sources == ["0.0.0.0/0"] else [f"ip saddr {_set(sources)}"]
    if destinations and destinations != ["0.0.0.0/0"]:
        addresses.append(f"ip daddr {_set(destinations)}")
    lines = []
    for entry in rule.get("allowed") or rule.get("denied") or []:
        parts = list(addresses)
        number = _protocol(entry.get("IPProtocol"))
        if number is not None:
            parts.append(f"meta l4proto {number}")
            ports = _port_ranges(entry.get("ports") or [])
            if ports and number in PORT_PROTOCOLS:
                parts.append("th dport " + _set([str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ports]))
        lines.append(" ".join(parts))
    return lines


def ruleset(firewalls: Iterable[Json], instance: Json, peers: Iterable[Json] = ()) -> str:
    """The `nft -f` text that gives the instance's namespace exactly these rules, atomically.

    `peers` are the project's instances, for the rules whose sources are tags or service accounts.

    The first two lines make sure the table exists and then delete it, so loading the text
    replaces whatever an earlier load left, in the one transaction `nft -f` runs.
    """
    lines = [
        f"# GCE firewall of instance {instance.get('name', '?')} (forja_sandbox.firewall)",
        f"table inet {TABLE}",
        f"delete table inet {TABLE}",
        f"table inet {TABLE} {{",
        "  chain ingress {",
        "    type filter hook input priority filter; policy drop;  # GCE's implied deny of ingress",
        '    iif "lo" accept',
        "    ct state established,related accept  # stateful: replies pass",
    ]
    for rule in evaluation_order(firewalls, instance):
        verdict = "drop" if rule.get("denied") else "accept"
        comment = f'comment "{rule.get("name")} priority {int(rule.get("priority", DEFAULT_PRIORITY))}"'
        matches = _match_lines(rule, peers)
        if not matches:
            lines.append(f"    # {rule.get('name')}: no IPv4 source (range, or tagged instance), "
                         "matches nothing here")
        for match in matches:
            lines.append(f"    {match} {verdict} {comment}")
    lines += ["  }", "  # no output chain: GCE's implied allow of egress (egress rules are not enforced)"]
    lines += ["}"]
    return "\n".join(lines) + "\n"
