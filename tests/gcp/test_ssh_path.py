"""The SSH path and the firewall rule always agree: iap, direct and own_rule through provision.yml.

Against the Compute emulator over HTTP with the repo's group_vars (the sandbox's host tests prove
the paths connect: tests/sandbox/test_ssh_modes.py). Here: which rule each mode keeps, the address
detection of direct mode, and the refusal, before any connection, of a path the rules do not admit.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_firewall import decide
from gcp_helpers import REPO, emulator_env, run_playbook

from forja_sandbox.address_echo import AddressEcho

PROJECT = "forja-sandbox"
IAP = "35.235.240.0/20"


@pytest.fixture
def inventory_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "inventory"
    folder.mkdir()
    (folder / "forja.gcp_gpu.yml").write_text("plugin: forja.gpu.gcp_gpu\n")
    shutil.copytree(REPO / "inventory" / "group_vars", folder / "group_vars")
    return folder


@pytest.fixture
def echo():
    """The sandbox's stand-in for api.ipify.org, answering a documentation address."""
    server = AddressEcho("203.0.113.7").start()
    yield f"http://127.0.0.1:{server.port}/"
    server.stop()


def provision(emulator, key_file, inventory_dir, tmp_path, *extra):
    env = emulator_env(emulator, key_file)
    return run_playbook(env, inventory_dir, "playbooks/provision.yml",
                        "-e", "gcp_instance_wait_for_ssh=false",
                        "-e", f"gcp_instance_ssh_key_file={tmp_path / 'id_forja'}", *extra)


def rule_of(emulator):
    return emulator.store.firewalls[PROJECT].get("forja-allow-ssh")


def failure(proc) -> str:
    assert proc.returncode != 0, proc.stdout[-3000:]
    found = re.findall(r'"msg": "([^"]*)"', proc.stdout)
    assert found, proc.stdout[-3000:]
    return found[-1]


def test_each_mode_keeps_the_rule_of_its_path(emulator, key_file, inventory_dir, tmp_path, echo):
    proc = provision(emulator, key_file, inventory_dir, tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert rule_of(emulator)["sourceRanges"] == [IAP], "iap is the default path"

    proc = provision(emulator, key_file, inventory_dir, tmp_path, "-e", "gcp_instance_ssh_mode=direct",
                     "-e", f"gcp_instance_ssh_address_url={echo}")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert rule_of(emulator)["sourceRanges"] == ["203.0.113.7/32"], "direct: the detected address only"

    proc = provision(emulator, key_file, inventory_dir, tmp_path, "-e", "gcp_instance_ssh_mode=direct",
                     "-e", "gcp_instance_ssh_source_address=198.51.100.9")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert rule_of(emulator)["sourceRanges"] == ["198.51.100.9/32"], "direct: a given address wins"


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_own_rule_is_checked_before_anything_connects(emulator, key_file, inventory_dir, tmp_path, echo):
    own = ("-e", "gcp_instance_ssh_mode=own_rule", "-e", f"gcp_instance_ssh_address_url={echo}")
    proc = provision(emulator, key_file, inventory_dir, tmp_path, *own)
    msg = failure(proc)
    assert "refuses tcp:22 from 203.0.113.7 (SSH path: own_rule)" in msg, msg
    assert "no rule admits it" in msg and "gcp_instance_ssh_mode" in msg, msg
    assert rule_of(emulator) is None and emulator.instances(PROJECT) == [], "nothing was created"

    # A user's rule for IAP's range does not admit a direct connection: named, with the rule seen.
    emulator.store.firewalls[PROJECT]["office-iap"] = _rule("office-iap", [IAP])
    msg = failure(provision(emulator, key_file, inventory_dir, tmp_path, *own))
    assert "office-iap (allow tcp:22 from 35.235.240.0/20 to forja-ssh, priority 1000)" in msg, msg

    emulator.store.firewalls[PROJECT]["office"] = _rule("office", ["203.0.113.0/24"])
    proc = provision(emulator, key_file, inventory_dir, tmp_path, *own)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert rule_of(emulator) is None, "own_rule: forja keeps no rule of its own"


def test_a_higher_priority_deny_is_a_mismatch_too(emulator, key_file, inventory_dir, tmp_path):
    emulator.store.firewalls[PROJECT]["no-ssh"] = {**_rule("no-ssh", ["0.0.0.0/0"]), "priority": 100,
                                                    "allowed": None,
                                                    "denied": [{"IPProtocol": "tcp", "ports": ["22"]}]}
    msg = failure(provision(emulator, key_file, inventory_dir, tmp_path))
    assert "rule no-ssh (deny tcp:22 from 0.0.0.0/0 to forja-ssh, priority 100) denies it" in msg, msg


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_os_login_puts_the_key_on_the_profile_and_names_the_user_to_log_in_as(
        emulator, key_file, inventory_dir, tmp_path):
    """OS Login: the key goes on the service account's profile (the emulator's OS Login API), the VM
    gets enable-oslogin=TRUE, and a login user that is not the profile's fails before any VM exists."""
    from forja_sandbox.compute_emulator import oslogin

    os_login = ("-e", "gcp_instance_ssh_os_login=true",
                "-e", f"gcp_instance_os_login_url={emulator.url}/oslogin/v1/")
    msg = failure(provision(emulator, key_file, inventory_dir, tmp_path, *os_login))
    account = json.loads(key_file.read_text())["client_email"]
    user = oslogin.posix_username(account)
    assert f"OS Login logs {account} in as '{user}', not 'ansible': set gcp_instance_ssh_user: {user}" in msg
    assert emulator.instances(PROJECT) == [], "nothing was created"

    as_user = ("-e", f"gcp_instance_ssh_user={user}")
    proc = provision(emulator, key_file, inventory_dir, tmp_path, *os_login, *as_user)
    assert proc.returncode == 0, proc.stdout[-4000:]
    public = (tmp_path / "id_forja.pub").read_text().split()[1]
    assert [k["key"].split()[1] for k in emulator.store.oslogin_keys[account].values()] == [public]
    (vm,) = emulator.instances(PROJECT)
    metadata = {i["key"]: i["value"] for i in vm["metadata"]["items"]}
    assert metadata["enable-oslogin"] == "TRUE" and "ssh-keys" not in metadata, "OS Login, not ssh-keys"

    again = provision(emulator, key_file, inventory_dir, tmp_path, *os_login, *as_user)
    assert again.returncode == 0, again.stdout[-3000:]
    assert re.search(r"localhost\s+: ok=\d+\s+changed=0", again.stdout), again.stdout[-3000:]


def _connection(inventory_dir: Path, *extra: str) -> str:
    """What one host's ssh gets from the site's group_vars: user, key and common args."""
    (inventory_dir / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"forja-l4": {
        "ansible_connection": "local", "instance_name": "forja-l4", "zone": "us-east1-b", "project": "p"}}}}))
    proc = subprocess.run(
        [str(REPO / ".venv/bin/ansible"), "-i", str(inventory_dir / "hosts.yml"), "forja-l4", *extra,
         "-m", "ansible.builtin.debug",
         "-a", "msg={{ ansible_user }}|{{ ansible_ssh_private_key_file }}|{{ ansible_ssh_common_args }}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return re.search(r'"msg": "(.*)"', proc.stdout).group(1)


def test_the_hosts_take_the_roles_ssh_path_unless_the_site_chooses_another(inventory_dir):
    """The role's defaults are the one statement of the path (the gcp_ssh_path vars plugin hands
    them to the hosts); a choice in group_vars or with -e reaches the hosts as it reaches the role."""
    defaults = yaml.safe_load((REPO / "roles/gcp_instance/defaults/main.yml").read_text())
    user, key, args = _connection(inventory_dir).split("|")
    assert user == defaults["gcp_instance_ssh_user"]
    assert key == str(Path(defaults["gcp_instance_ssh_key_file"]).expanduser())
    assert args.endswith("-o 'ProxyCommand=gcloud compute start-iap-tunnel forja-l4 %p --listen-on-stdin "
                         "--project=p --zone=us-east1-b --verbosity=warning'"), args
    user, _key, args = _connection(inventory_dir, "-e", "gcp_instance_ssh_mode=direct").split("|")
    assert "ProxyCommand" not in args
    (inventory_dir / "group_vars" / "all" / "mine.yml").write_text("gcp_instance_ssh_user: me\n")
    assert _connection(inventory_dir).split("|")[0] == "me"


@pytest.mark.parametrize(("source", "rules", "decider"), [
    (IAP, [{"name": "a", "sourceRanges": ["35.235.240.0/21"], "allowed": [{"IPProtocol": "tcp"}]}], None),
    (IAP, [{"name": "a", "sourceRanges": ["35.0.0.0/8"], "allowed": [{"IPProtocol": "all"}]}], "a"),
    ("1.2.3.4", [{"name": "a", "sourceRanges": ["1.2.3.4"], "allowed": [{"IPProtocol": "tcp",
                                                                           "ports": ["20-25"]}]}], "a"),
    ("1.2.3.4", [{"name": "a", "sourceRanges": ["1.2.3.4"], "allowed": [{"IPProtocol": "udp"}]}], None),
    ("1.2.3.4", [{"name": "a", "sourceRanges": ["1.2.3.4"], "targetTags": ["gpu"],
                  "allowed": [{"IPProtocol": "tcp"}]}], None),
    ("1.2.3.4", [{"name": "a", "sourceRanges": ["1.2.3.4"], "disabled": True,
                  "allowed": [{"IPProtocol": "tcp"}]}], None),
    ("1.2.3.4", [{"name": "allow", "sourceRanges": ["0.0.0.0/0"], "allowed": [{"IPProtocol": "tcp"}]},
                 {"name": "deny", "sourceRanges": ["0.0.0.0/0"], "denied": [{"IPProtocol": "tcp"}]}], "deny"),
    ("1.2.3.4", [{"name": "allow", "sourceRanges": ["0.0.0.0/0"], "priority": 10,
                  "allowed": [{"IPProtocol": "tcp"}]},
                 {"name": "deny", "sourceRanges": ["0.0.0.0/0"], "denied": [{"IPProtocol": "tcp"}]}],
     "allow"),
])
def test_rules_decide_as_gce_does(source, rules, decider):
    found = decide(rules, source, ["forja-ssh"], 22)
    assert (found or {}).get("name") == decider


def _rule(name: str, sources: list[str]) -> dict:
    return {"name": name, "network": f"projects/{PROJECT}/global/networks/default", "direction": "INGRESS",
            "priority": 1000, "sourceRanges": sources, "targetTags": ["forja-ssh"],
            "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}]}
