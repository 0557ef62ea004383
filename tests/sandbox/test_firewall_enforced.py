"""The sandbox's hosts enforce the firewall rules of the Compute API, as GCE does (real hosts th34, th35).

Two instances are created through the emulator's HTTP API with the sandbox's backend; their
hosts boot behind the project's rules, and each `firewalls.insert/patch/delete` or `setTags`
changes what reaches port 22 by the time its operation is DONE:
- no rule: nothing reaches sshd (the connection times out: dropped, as GCE drops);
- a rule for tcp:22 from 10.213.0.1/32 (the controller's address on the hosts' bridge) opens the
  host with its target tag, not the other one, and not for a client from another address;
- a rule for IAP's range 35.235.240.0/20 admits a client bound to 35.235.240.1 (the IAP stand-in's
  source), not the controller;
- a deny at a higher priority wins, a disabled rule counts for nothing, a deleted rule closes
  the port again, and new tags (setTags) or a restart (stop/start) get the right rules;
- each change replaces the table atomically: SSH that stays allowed never sees a drop.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from forja_sandbox import backend as sandbox_backend
from forja_sandbox import testhosts
from forja_sandbox.compute_emulator import ComputeEmulator
from forja_sandbox.iap import IAP_RANGE, IAP_SOURCE

pytestmark = pytest.mark.hosts

PROJECT = "forja-sandbox"
ZONE = "us-east1-d"
FIRST, LAST = 34, 35
CONTROLLER = f"{testhosts.net_prefix()}.1"
CONNECT_TIMEOUT_S = 1.0


class Api:
    """The emulator's Compute API over HTTP, waiting on each mutation's operation."""

    def __init__(self, emu: ComputeEmulator) -> None:
        self.base = f"{emu.base_url}projects/{PROJECT}/"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {emu.issue_token()}"

    def send(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        resp = self.session.request(method, self.base + path, json=body, timeout=30)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def wait(self, op: dict[str, Any]) -> dict[str, Any]:
        while op["status"] != "DONE":
            op = self.session.post(op["selfLink"] + "/wait", timeout=120).json()
        assert "error" not in op, op
        return op

    def call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        return self.wait(self.send(method, path, body))

    def instance(self, name: str) -> dict[str, Any]:
        return self.session.get(self.base + f"zones/{ZONE}/instances/{name}", timeout=30).json()


def vm_body(name: str, tag: str) -> dict[str, Any]:
    return {
        "name": name,
        "machineType": f"zones/{ZONE}/machineTypes/e2-small",
        "disks": [{"boot": True, "initializeParams": {
            "sourceImage": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"}}],
        "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}],
        "tags": {"items": [tag]},
    }


def ssh_rule(name: str, sources: list[str], **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "direction": "INGRESS", "priority": 1000, "sourceRanges": sources,
                            "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}]}
    body.update(fields)
    return body


def ssh(address: str, source: str | None = None) -> str:
    """`open` (sshd's banner came), `dropped` (no answer: the firewall) or `refused`."""
    with socket.socket() as sock:
        sock.settimeout(CONNECT_TIMEOUT_S)
        if source:
            sock.bind((source, 0))
        try:
            sock.connect((address, 22))
        except TimeoutError:
            return "dropped"
        except ConnectionRefusedError:
            return "refused"
        sock.settimeout(10)
        return "open" if sock.recv(64).startswith(b"SSH-2.0-") else "no banner"


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, str, str]]:
    """Instance fw-a (tag fw-a) and fw-b (tag fw-b) on hosts th34/th35, with no firewall rule."""
    testhosts.ensure_golden()
    bindings = tmp_path_factory.mktemp("fw") / "bindings.json"
    backend = sandbox_backend.TestHostBackend(bindings, first=FIRST, last=LAST)
    with ComputeEmulator(backend=backend) as emu:
        api = Api(emu)
        try:
            ops = [api.send("POST", f"zones/{ZONE}/instances", vm_body(n, n)) for n in ("fw-a", "fw-b")]
            for op in ops:
                api.wait(op)
            a, b = (api.instance(n)["networkInterfaces"][0]["networkIP"] for n in ("fw-a", "fw-b"))
            assert {a, b} == {testhosts.address(FIRST), testhosts.address(LAST)}
            yield api, a, b
        finally:
            backend.remove_all()
    assert not {FIRST, LAST} & set(testhosts.running()), "the test's hosts are gone"


@pytest.fixture
def rules(cloud: tuple[Api, str, str]) -> Iterator[list[str]]:
    """Names of the rules a test inserts; they are deleted after it, whatever happened."""
    names: list[str] = []
    yield names
    api = cloud[0]
    for name in names:
        if api.session.get(api.base + f"global/firewalls/{name}", timeout=30).status_code == 200:
            api.call("DELETE", f"global/firewalls/{name}")


def insert(api: Api, rules: list[str], body: dict[str, Any]) -> None:
    rules.append(body["name"])
    api.call("POST", "global/firewalls", body)


def test_without_a_rule_nothing_reaches_ssh(cloud: tuple[Api, str, str]) -> None:
    _api, a, b = cloud
    assert [ssh(a), ssh(b), ssh(a, IAP_SOURCE)] == ["dropped"] * 3
    loaded = (testhosts.base_dir() / "hosts" / f"th{FIRST}" / "firewall.nft").read_text()
    assert "policy drop;" in loaded and "dport" not in loaded


def test_a_rule_for_the_controller_opens_its_target_until_deleted(
    cloud: tuple[Api, str, str], rules: list[str]
) -> None:
    api, a, b = cloud
    insert(api, rules, ssh_rule("ssh-controller", [f"{CONTROLLER}/32"], targetTags=["fw-a"]))
    assert ssh(a) == "open"
    assert ssh(b) == "dropped", "a rule for another tag does not apply"
    assert ssh(a, IAP_SOURCE) == "dropped", "only the controller's address is admitted"
    api.call("DELETE", "global/firewalls/ssh-controller")
    assert ssh(a) == "dropped"


def test_the_iap_range_admits_the_iap_source_not_the_controller(
    cloud: tuple[Api, str, str], rules: list[str]
) -> None:
    api, a, _b = cloud
    insert(api, rules, ssh_rule("ssh-iap", [IAP_RANGE], targetTags=["fw-a"]))
    assert ssh(a) == "dropped"
    assert ssh(a, IAP_SOURCE) == "open"


def test_patch_deny_priority_and_disabled(cloud: tuple[Api, str, str], rules: list[str]) -> None:
    api, a, b = cloud
    insert(api, rules, ssh_rule("ssh-both", [f"{CONTROLLER}/32"], targetTags=["fw-a"]))
    api.call("PATCH", "global/firewalls/ssh-both", {"name": "ssh-both", "targetTags": ["fw-a", "fw-b"]})
    assert [ssh(a), ssh(b)] == ["open", "open"]
    deny = ssh_rule("deny-ssh", ["0.0.0.0/0"], priority=900, targetTags=["fw-b"])
    deny["denied"] = deny.pop("allowed")
    insert(api, rules, deny)
    assert [ssh(a), ssh(b)] == ["open", "dropped"], "the deny at priority 900 wins on fw-b only"
    api.call("PATCH", "global/firewalls/deny-ssh", {"name": "deny-ssh", "disabled": True})
    assert ssh(b) == "open", "a disabled rule counts for nothing"


def test_new_tags_and_a_restart_get_the_rules(cloud: tuple[Api, str, str], rules: list[str]) -> None:
    api, a, b = cloud
    insert(api, rules, ssh_rule("ssh-a", [f"{CONTROLLER}/32"], targetTags=["fw-a"]))
    assert ssh(b) == "dropped"
    set_tags(api, "fw-b", ["fw-a"])
    assert ssh(b) == "open", "setTags changes which rules apply"
    set_tags(api, "fw-b", ["fw-b"])
    assert ssh(b) == "dropped"
    api.call("POST", f"zones/{ZONE}/instances/fw-a/stop")
    api.call("POST", f"zones/{ZONE}/instances/fw-a/start")
    assert ssh(a) == "open", "a started host boots with the project's rules"
    api.call("DELETE", "global/firewalls/ssh-a")
    api.call("POST", f"zones/{ZONE}/instances/fw-a/stop")
    api.call("POST", f"zones/{ZONE}/instances/fw-a/start")  # port 22 closed: the boot does not wait for it
    assert ssh(a) == "dropped"


def set_tags(api: Api, name: str, tags: list[str]) -> None:
    fingerprint = api.instance(name)["tags"]["fingerprint"]
    api.call("POST", f"zones/{ZONE}/instances/{name}/setTags", {"items": tags, "fingerprint": fingerprint})


def test_reloading_never_closes_what_stays_allowed(cloud: tuple[Api, str, str], rules: list[str]) -> None:
    """Each change replaces the table in one transaction: SSH allowed throughout never sees a drop."""
    api, a, _b = cloud
    insert(api, rules, ssh_rule("ssh-steady", [f"{CONTROLLER}/32"]))
    insert(api, rules, ssh_rule("churn", ["192.0.2.0/32"]))
    seen: list[str] = []
    stop = threading.Event()

    def knock() -> None:
        while not stop.is_set():
            seen.append(ssh(a))

    knocker = threading.Thread(target=knock)
    knocker.start()
    try:
        for i in range(1, 11):
            patch = {"name": "churn", "sourceRanges": [f"192.0.2.{i}/32"]}
            api.call("PATCH", "global/firewalls/churn", patch)
    finally:
        stop.set()
        knocker.join()
    assert seen and set(seen) == {"open"}, seen
    listing = subprocess.run(["ip", "netns", "exec", f"th{FIRST}", "nft", "list", "ruleset"],
                             capture_output=True, text=True, check=True).stdout
    assert listing.count("table inet forja_gce") == 1 and "192.0.2.10 " in listing
