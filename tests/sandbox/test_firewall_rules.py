"""The sandbox's firewall, without hosts: GCE's rules as nftables text, and the emulator's change hook.

- `forja_sandbox.firewall.ruleset` keeps GCE's semantics: implied deny of ingress, replies and
  loopback pass, rules ordered by priority with deny first at equal priority, targetTags /
  targetServiceAccounts choose the instances, disabled and egress rules count for nothing, and
  sources are IPv4 ranges or the addresses of instances carrying a source tag or account.
- Every text it makes loads with `nft -f` (in a throwaway network namespace), twice in a row: the
  table is replaced, never doubled.
- The emulator tells a backend that has `firewalls_changed` the project's rules and instances on the
  worker of every firewall insert/patch/delete and setTags (before the operation is DONE), and
  when it starts with rules from a state file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from forja_sandbox.compute_emulator import ComputeEmulator
from forja_sandbox.compute_emulator.firewalls import PROTOCOLS
from forja_sandbox.firewall import PROTOCOL_NUMBERS, TABLE, evaluation_order, ruleset

PROJECT = "forja-sandbox"
ZONE = "us-east1-d"
HEADER = f"table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{"


def rule(name: str, **fields: Any) -> dict[str, Any]:
    """A stored Firewall as the emulator keeps it (build_firewall's defaults filled in)."""
    stored: dict[str, Any] = {
        "name": name,
        "network": f"https://compute.example/compute/v1/projects/{PROJECT}/global/networks/default",
        "direction": "INGRESS",
        "priority": 1000,
        "disabled": False,
        "sourceRanges": ["0.0.0.0/0"],
        "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
    }
    stored.update(fields)
    return stored


def vm(*tags: str, accounts: tuple[str, ...] = ()) -> dict[str, Any]:
    instance: dict[str, Any] = {"name": "vm-1", "networkInterfaces": [{"network": "global/networks/default"}]}
    if tags:
        instance["tags"] = {"items": list(tags)}
    if accounts:
        instance["serviceAccounts"] = [{"email": a, "scopes": []} for a in accounts]
    return instance


def rule_lines(text: str) -> list[str]:
    """The lines after the fixed prologue (lo, established) and before the chain's end."""
    body = text.split("ct state established,related accept", 1)[1].split("\n  }", 1)[0]
    return [line.strip() for line in body.splitlines()[1:] if line.strip()]


def test_no_rule_leaves_only_the_implied_deny_loopback_and_replies() -> None:
    text = ruleset([], vm())
    assert HEADER in text
    assert "type filter hook input priority filter; policy drop;" in text
    assert '    iif "lo" accept\n' in text
    assert rule_lines(text) == []
    assert "hook output" not in text, "egress stays open (GCE's implied allow)"


def test_an_ssh_rule_becomes_one_accept_line() -> None:
    fw = rule("forja-ssh", sourceRanges=["10.213.0.1/32"], targetTags=["forja-ssh"])
    assert rule_lines(ruleset([fw], vm("forja-ssh"))) == [
        'ip saddr 10.213.0.1/32 meta l4proto 6 th dport 22 accept comment "forja-ssh priority 1000"'
    ]


@pytest.mark.parametrize(
    ("fw", "instance", "applies"),
    [
        (rule("a"), vm(), True),  # no targets: every instance of the network
        (rule("a", targetTags=["forja-ssh"]), vm("forja-ssh", "web"), True),
        (rule("a", targetTags=["forja-ssh"]), vm("web"), False),
        (rule("a", targetTags=["forja-ssh"]), vm(), False),
        (rule("a", targetServiceAccounts=["sa@p.iam.gserviceaccount.com"]),
         vm(accounts=("sa@p.iam.gserviceaccount.com",)), True),
        (rule("a", targetServiceAccounts=["sa@p.iam.gserviceaccount.com"]), vm("sa"), False),
        (rule("a", disabled=True), vm(), False),
        (rule("a", direction="EGRESS", destinationRanges=["0.0.0.0/0"]), vm(), False),
        (rule("a", network="projects/p/global/networks/other"), vm(), False),
    ],
)
def test_which_rules_apply_to_an_instance(
    fw: dict[str, Any], instance: dict[str, Any], applies: bool
) -> None:
    assert [r["name"] for r in evaluation_order([fw], instance)] == (["a"] if applies else [])


def test_lower_priority_number_first_and_deny_before_allow_at_equal_priority() -> None:
    rules = [
        rule("allow-late", priority=2000),
        rule("allow-1000", priority=1000),
        rule("deny-1000", priority=1000, allowed=None, denied=[{"IPProtocol": "all"}]),
        rule("allow-early", priority=10),
    ]
    assert [r["name"] for r in evaluation_order(rules, vm())] == [
        "allow-early", "deny-1000", "allow-1000", "allow-late"
    ]
    verdicts = [line.split(" comment ")[0].rsplit(" ", 1)[1] for line in rule_lines(ruleset(rules, vm()))]
    assert verdicts == ["accept", "drop", "accept", "accept"]


def test_ranges_and_ports_are_merged_and_everywhere_means_any_ipv4_source() -> None:
    fw = rule(
        "merge",
        sourceRanges=["35.235.240.0/20", "35.235.241.7/32", "10.0.0.0/8", "10.1.0.0/16"],
        allowed=[{"IPProtocol": "tcp", "ports": ["22", "20-30", "8000-8100", "8101"]}],
    )
    assert rule_lines(ruleset([fw], vm())) == [
        "ip saddr { 10.0.0.0/8, 35.235.240.0/20 } meta l4proto 6 th dport { 20-30, 8000-8101 } "
        'accept comment "merge priority 1000"'
    ]
    everywhere = rule_lines(ruleset([rule("any")], vm()))[0]
    assert everywhere.startswith("meta nfproto ipv4 meta l4proto 6 th dport 22 ")


@pytest.mark.parametrize(
    ("allowed", "match"),
    [
        ([{"IPProtocol": "all"}], "meta nfproto ipv4 accept"),
        ([{"IPProtocol": "icmp"}], "meta nfproto ipv4 meta l4proto 1 accept"),
        ([{"IPProtocol": "udp", "ports": ["53"]}], "meta nfproto ipv4 meta l4proto 17 th dport 53 accept"),
        ([{"IPProtocol": "sctp"}], "meta nfproto ipv4 meta l4proto 132 accept"),
        ([{"IPProtocol": "47"}], "meta nfproto ipv4 meta l4proto 47 accept"),
    ],
)
def test_protocols_become_protocol_numbers(allowed: list[dict[str, Any]], match: str) -> None:
    assert rule_lines(ruleset([rule("p", allowed=allowed)], vm()))[0].startswith(match)


def test_every_protocol_the_api_accepts_has_a_number() -> None:
    assert set(PROTOCOL_NUMBERS) == set(PROTOCOLS) - {"all"}


def test_each_allowed_entry_is_its_own_line() -> None:
    fw = rule("two", allowed=[{"IPProtocol": "tcp", "ports": ["22"]}, {"IPProtocol": "icmp"}])
    assert len(rule_lines(ruleset([fw], vm()))) == 2


def test_ingress_destination_ranges_narrow_the_rule() -> None:
    fw = rule("dst", destinationRanges=["10.213.0.44/32"])
    assert rule_lines(ruleset([fw], vm()))[0].startswith("meta nfproto ipv4 ip daddr 10.213.0.44/32 ")


@pytest.mark.parametrize(
    "sources",
    [
        {"sourceRanges": [], "sourceTags": ["bastion"]},
        {"sourceRanges": [], "sourceServiceAccounts": ["sa@p.iam.gserviceaccount.com"]},
        {"sourceRanges": ["::/0"]},
    ],
)
def test_sources_that_are_not_ipv4_ranges_or_instances_up_match_nothing(sources: dict[str, Any]) -> None:
    lines = rule_lines(ruleset([rule("unenforced", **sources)], vm()))
    assert lines == ["# unenforced: no IPv4 source (range, or tagged instance), matches nothing here"]


def peer(name: str, address: str | None, *tags: str, network: str = "default",
         accounts: tuple[str, ...] = ()) -> dict[str, Any]:
    """Another instance of the project, as the emulator reports it (its primary internal IP)."""
    nic: dict[str, Any] = {"network": f"global/networks/{network}"}
    if address:
        nic["networkIP"] = address
    found = {**vm(*tags, accounts=accounts), "name": name, "networkInterfaces": [nic]}
    return found


def test_source_tags_and_accounts_admit_the_primary_ips_of_the_instances_that_carry_them() -> None:
    cluster = rule("cluster", sourceRanges=[], sourceTags=["team"], targetTags=["team"],
                   allowed=[{"IPProtocol": "tcp", "ports": ["29400", "32768-60999"]}])
    peers = [peer("team-0", "10.213.0.20", "team"), peer("team-1", "10.213.0.25", "team"),
             peer("other", "10.213.0.22", "web"), peer("booting", None, "team"),
             peer("elsewhere", "10.9.0.5", "team", network="lab")]
    assert rule_lines(ruleset([cluster], vm("team"), peers)) == [
        "ip saddr { 10.213.0.20/32, 10.213.0.25/32 } meta l4proto 6 th dport { 29400, 32768-60999 } accept "
        'comment "cluster priority 1000"'
    ]
    by_account = rule("sa", sourceRanges=["192.0.2.0/24"], sourceServiceAccounts=["trainer@p.iam"])
    lines = rule_lines(ruleset([by_account], vm(), [peer("t", "10.213.0.30", accounts=("trainer@p.iam",))]))
    assert lines[0].startswith("ip saddr { 10.213.0.30/32, 192.0.2.0/24 } ")  # ranges or instances


NFT_CASES = [
    [],
    [rule("forja-ssh", sourceRanges=["35.235.240.0/20"], targetTags=["t"])],
    [rule("a", priority=5, allowed=None, denied=[{"IPProtocol": "all"}]),
     rule("b", sourceRanges=["10.0.0.0/8", "10.1.0.0/16", "192.0.2.7"],
          allowed=[{"IPProtocol": "tcp", "ports": ["22", "8000-9000"]}, {"IPProtocol": "udp"},
                   {"IPProtocol": "icmp"}, {"IPProtocol": "esp"}, {"IPProtocol": "ah"},
                   {"IPProtocol": "ipip"}, {"IPProtocol": "sctp", "ports": ["9"]}]),
     rule("c", destinationRanges=["10.213.0.0/24"], sourceTags=["x"])],
]


@pytest.mark.hosts  # root and nft, as the test hosts need
@pytest.mark.parametrize("rules", NFT_CASES)
def test_every_ruleset_loads_and_replaces_the_table(rules: list[dict[str, Any]], tmp_path: Path) -> None:
    assert shutil.which("unshare") and os.geteuid() == 0
    nft_file = tmp_path / "firewall.nft"
    nft_file.write_text(ruleset(rules, vm("t")))
    # Loaded twice in a fresh network namespace, then listed: one table, with every rule.
    script = 'nft -f "$1" && nft -f "$1" && nft list ruleset'
    proc = subprocess.run(["unshare", "--net", "sh", "-c", script, "sh", str(nft_file)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(f"table inet {TABLE}") == 1
    assert proc.stdout.count(" comment ") == sum(len(r.get("allowed") or r.get("denied")) for r in rules
                                                 if r.get("sourceRanges"))


# -- the emulator's hook ---------------------------------------------------------------------------


class FirewallRecorder:
    """A backend that only records what the emulator reports (the host side is in the other file)."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, list[str], dict[str, list[str]], str]] = []

    def create(self, instance: dict[str, Any]) -> None:
        return None

    def start(self, instance: dict[str, Any]) -> None:
        return None

    def stop(self, instance: dict[str, Any]) -> None: ...

    def delete(self, instance: dict[str, Any]) -> None: ...

    def firewalls_changed(
        self, project: str, firewalls: list[dict[str, Any]], instances: list[dict[str, Any]]
    ) -> None:
        tags = {i["name"]: (i.get("tags") or {}).get("items", []) for i in instances}
        names = sorted(f["name"] + ("(disabled)" if f["disabled"] else "") for f in firewalls)
        self.reports.append((project, names, tags, threading.current_thread().name))


class Api:
    def __init__(self, emu: ComputeEmulator) -> None:
        self.base = f"{emu.base_url}projects/{PROJECT}/"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {emu.issue_token()}"

    def call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """Send a mutation and wait for its operation; DONE without error."""
        resp = self.session.request(method, self.base + path, json=body, timeout=30)
        assert resp.status_code == 200, resp.text
        op = resp.json()
        while op["status"] != "DONE":
            op = self.session.post(op["selfLink"] + "/wait", timeout=30).json()
        assert "error" not in op, op
        return op


def small_vm(name: str, tags: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "machineType": f"zones/{ZONE}/machineTypes/e2-small",
        "disks": [{"boot": True, "initializeParams": {
            "sourceImage": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"}}],
        "networkInterfaces": [{}],
        "tags": {"items": tags},
    }


def ssh_rule(name: str, **fields: Any) -> dict[str, Any]:
    body = {"name": name, "sourceRanges": ["10.213.0.1/32"]}
    body["allowed"] = [{"IPProtocol": "tcp", "ports": ["22"]}]
    body.update(fields)
    return body


def test_the_emulator_reports_every_firewall_and_tag_change_before_the_operation_is_done() -> None:
    recorder = FirewallRecorder()
    with ComputeEmulator(backend=recorder) as emu:
        api = Api(emu)
        assert recorder.reports[-1][:3] == (PROJECT, [], {}), "reported at start"
        api.call("POST", f"zones/{ZONE}/instances", small_vm("vm-a", ["fw-a"]))
        api.call("POST", "global/firewalls", ssh_rule("ssh", targetTags=["fw-a"]))
        assert recorder.reports[-1][:3] == (PROJECT, ["ssh"], {"vm-a": ["fw-a"]})
        assert recorder.reports[-1][3].startswith("op-"), "on the operation's worker"
        api.call("PATCH", "global/firewalls/ssh", {"name": "ssh", "disabled": True})
        assert recorder.reports[-1][1] == ["ssh(disabled)"]
        tags = api.session.get(api.base + f"zones/{ZONE}/instances/vm-a").json()["tags"]
        new_tags = {"items": ["fw-b"], "fingerprint": tags["fingerprint"]}
        api.call("POST", f"zones/{ZONE}/instances/vm-a/setTags", new_tags)
        assert recorder.reports[-1][2] == {"vm-a": ["fw-b"]}
        api.call("DELETE", "global/firewalls/ssh")
        assert recorder.reports[-1][1] == []


def test_the_emulator_reports_instances_made_started_and_deleted_for_rules_whose_sources_are_tags() -> None:
    recorder = FirewallRecorder()
    with ComputeEmulator(backend=recorder) as emu:
        api = Api(emu)
        for name in ("team-0", "team-1"):
            api.call("POST", f"zones/{ZONE}/instances", small_vm(name, ["team"]))
            assert name in recorder.reports[-1][2] and recorder.reports[-1][3].startswith("op-")
        api.call("POST", f"zones/{ZONE}/instances/team-1/stop")
        before = len(recorder.reports)
        api.call("POST", f"zones/{ZONE}/instances/team-1/start")
        assert len(recorder.reports) > before, "a start reports: the instance's address may change"
        api.call("DELETE", f"zones/{ZONE}/instances/team-1")
        assert recorder.reports[-1][2] == {"team-0": ["team"]}


def test_quick_changes_leave_the_backend_with_the_newest_rules() -> None:
    recorder = FirewallRecorder()
    with ComputeEmulator(backend=recorder) as emu:
        api = Api(emu)
        ops = [api.session.post(api.base + "global/firewalls", json=ssh_rule(f"r{i}"), timeout=30).json()
               for i in range(8)]
        for op in ops:
            while op["status"] != "DONE":
                op = api.session.post(op["selfLink"] + "/wait", timeout=30).json()
        assert recorder.reports[-1][1] == [f"r{i}" for i in range(8)]


def test_rules_from_a_state_file_reach_the_backend_when_the_emulator_starts(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    with ComputeEmulator(state_file=state) as emu:
        Api(emu).call("POST", "global/firewalls", ssh_rule("kept"))
    recorder = FirewallRecorder()
    with ComputeEmulator(backend=recorder, state_file=state):
        assert recorder.reports == [(PROJECT, ["kept"], {}, threading.current_thread().name)]
