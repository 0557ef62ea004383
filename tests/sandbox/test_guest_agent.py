"""On a real sandbox host, metadata `ssh-keys` grants and revokes SSH access, as on GCE.

The emulator creates an instance through its API; the backend boots it as host th36 with the
guest-agent stand-in and no baked-in key, and the emulator's metadata server answers it on the
hosts' bridge. Everything after that is a `setMetadata` call and a real `ssh`: the first key
logs in, a second user's key creates that user with passwordless sudo, a removed key stops
working within seconds, and an expiring key (gcloud's `google-ssh {"expireOn"}` form) stops at
its expiry. With `enable-oslogin=TRUE` the host ignores `ssh-keys`: a service account's key
imported into its OS Login profile logs in as `sa_<id>`, and deleting it locks the account out.
The project's firewall admits SSH only from the controller's bridge address.
"""

from __future__ import annotations

import datetime
import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import google.auth.jwt
import pytest
import requests
from google.auth.transport.requests import AuthorizedSession

from forja_sandbox import backend as sandbox_backend
from forja_sandbox import testhosts
from forja_sandbox.compute_emulator import ComputeEmulator
from forja_sandbox.compute_emulator.metadata_server import MetadataServer

pytestmark = pytest.mark.hosts

FIRST, LAST = 36, 37  # this test's host slots
ZONE = "us-east1-d"
NAME = "agent-vm"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(tmp: Path, name: str) -> tuple[Path, str]:
    path = tmp / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True)
    return path, path.with_suffix(".pub").read_text().strip()


@dataclass
class Cloud:
    emu: ComputeEmulator
    token: str
    backend: sandbox_backend.TestHostBackend
    metadata_url: str

    def call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        url = f"{self.emu.base_url}projects/{self.emu_project}/{path}"
        resp = requests.request(method, url, json=body, timeout=60,
                                headers={"Authorization": f"Bearer {self.token}"})
        assert resp.status_code == 200, resp.text
        answer: dict[str, Any] = resp.json()
        if answer.get("kind") == "compute#operation":
            scope = f"zones/{ZONE}" if "/zones/" in answer["selfLink"] else "global"
            done = requests.post(f"{self.emu.base_url}projects/{self.emu_project}/{scope}/operations/"
                                 f"{answer['name']}/wait", timeout=300,
                                 headers={"Authorization": f"Bearer {self.token}"}).json()
            assert done["status"] == "DONE" and "error" not in done, done
        return answer

    @property
    def emu_project(self) -> str:
        return self.emu.projects[0]

    def set_ssh_keys(self, lines: list[str]) -> None:
        current = self.call("GET", f"zones/{ZONE}/instances/{NAME}")
        self.call("POST", f"zones/{ZONE}/instances/{NAME}/setMetadata",
                  {"fingerprint": current["metadata"]["fingerprint"],
                   "items": [{"key": "ssh-keys", "value": "\n".join(lines)}]})


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Cloud]:
    metadata_url = f"http://{testhosts.net_prefix()}.1:{_free_port()}/computeMetadata/v1"
    backend = sandbox_backend.TestHostBackend(tmp_path / "bindings.json", first=FIRST, last=LAST,
                                              metadata_url=metadata_url)
    emu = ComputeEmulator(backend=backend).start()
    try:
        yield Cloud(emu, emu.issue_token(), backend, metadata_url)
    finally:
        backend.remove_all()
        emu.stop()
        for index in (FIRST, LAST):
            testhosts.down(index)


def ssh(address: str, user: str, key: Path, command: str = "true") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         f"{user}@{address}", command],
        capture_output=True, text=True, timeout=30, check=False)


def within(seconds: float, predicate: Callable[[], bool]) -> float:
    """Seconds until `predicate()` held; fails the test past `seconds`."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < seconds, f"not within {seconds} s"
        time.sleep(0.2)
    return time.monotonic() - started


def boot(cloud: Cloud, items: dict[str, str]) -> str:
    """A firewall rule for SSH from the controller, then the instance; its address."""
    cloud.call("POST", "global/firewalls", {
        "name": "allow-ssh-from-controller", "network": "global/networks/default",
        "sourceRanges": [f"{testhosts.net_prefix()}.1/32"],
        "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}]})
    cloud.call("POST", f"zones/{ZONE}/instances", {
        "name": NAME, "machineType": f"zones/{ZONE}/machineTypes/e2-small",
        "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
            "sourceImage": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"}}],
        "networkInterfaces": [{"network": "global/networks/default"}],
        "metadata": {"items": [{"key": k, "value": v} for k, v in items.items()]}})
    address = str(cloud.call("GET", f"zones/{ZONE}/instances/{NAME}")["networkInterfaces"][0]["networkIP"])
    assert address == testhosts.address(FIRST)
    return address


def metadata_server(cloud: Cloud) -> MetadataServer:
    """The emulator's metadata server at the URL the hosts were given (the bridge exists once a
    host is up: only then can it bind there)."""
    host, port = cloud.metadata_url.split("//")[1].split("/")[0].split(":")
    return MetadataServer(cloud.emu.api, host, int(port))


def test_ssh_keys_metadata_grants_and_revokes_access(cloud: Cloud, tmp_path: Path) -> None:
    key_a, pub_a = _keygen(tmp_path, "ansible-key")
    key_b, pub_b = _keygen(tmp_path, "alice-key")
    address = boot(cloud, {"ssh-keys": f"ansible:{pub_a}"})
    with metadata_server(cloud):
        granted_s = within(30, lambda: ssh(address, "ansible", key_a).returncode == 0)
        assert ssh(address, "ansible", testhosts.key_path()).returncode != 0, "no fixture key is baked in"

        cloud.set_ssh_keys([f"ansible:{pub_a}", f"alice:{pub_b}"])
        within(10, lambda: ssh(address, "alice", key_b).returncode == 0)
        alice = ssh(address, "alice", key_b,
                    "sudo -n id -un; id -nG; stat -c '%a %U' ~/.ssh/authorized_keys ~/.ssh")
        lines = alice.stdout.split("\n")
        assert lines[0] == "root", alice.stderr
        assert {"google-sudoers", "adm"} <= set(lines[1].split())
        assert lines[2:4] == ["600 alice", "700 alice"]
        journal = ssh(address, "alice", key_b, "sudo -n journalctl -u forja-guest-agent -o cat").stdout
        assert "Creating user alice." in journal
        assert pub_a.split()[1] not in journal and pub_b.split()[1] not in journal, "keys are never logged"

        cloud.set_ssh_keys([f"alice:{pub_b}"])
        revoked_s = within(10, lambda: ssh(address, "ansible", key_a).returncode != 0)
        assert ssh(address, "alice", key_b).returncode == 0, "the other user keeps access"

        kind, data = pub_b.split()[:2]
        # whole seconds, as the expiry is written: the key ends at expire_on, not up to 1 s before it
        expire_on = (datetime.datetime.now(datetime.timezone.utc)
                     + datetime.timedelta(seconds=8)).replace(microsecond=0)
        google_ssh = json.dumps({"userName": "alice@example.com",
                                 "expireOn": expire_on.strftime("%Y-%m-%dT%H:%M:%S+0000")})
        cloud.set_ssh_keys([f"alice:{kind} {data} google-ssh {google_ssh}"])
        within(5, lambda: ssh(address, "alice", key_b).returncode == 0)
        within(20, lambda: ssh(address, "alice", key_b).returncode != 0)
        assert datetime.datetime.now(datetime.timezone.utc) >= expire_on, "the key lived until its expiry"
    print(f"\ngranted after {granted_s:.1f} s of boot, revoked {revoked_s:.1f} s after setMetadata")


def test_os_login_ignores_ssh_keys_and_logs_in_the_profiles_key(cloud: Cloud, tmp_path: Path) -> None:
    key_a, pub_a = _keygen(tmp_path, "ansible-key")
    key_sa, pub_sa = _keygen(tmp_path, "sa-key")
    sa_key = json.loads(cloud.emu.write_service_account_key(tmp_path / "sa.json").read_text())
    session = AuthorizedSession(google.auth.jwt.Credentials.from_service_account_info(
        sa_key, audience="https://oslogin.googleapis.com/"))
    profile_url = f"{cloud.emu.url}/oslogin/v1/users/{quote(sa_key['client_email'])}"
    address = boot(cloud, {"ssh-keys": f"ansible:{pub_a}", "enable-oslogin": "TRUE"})
    with metadata_server(cloud):
        imported = session.post(f"{profile_url}:importSshPublicKey", params={"projectId": cloud.emu_project},
                                json={"key": pub_sa}, timeout=30)
        assert imported.status_code == 200, imported.text
        profile = imported.json()["loginProfile"]
        user = profile["posixAccounts"][0]["username"]
        within(30, lambda: ssh(address, user, key_sa).returncode == 0)
        assert ssh(address, user, key_sa, "sudo -n id -un").stdout.strip() == "root", "an OS Login admin"
        assert ssh(address, "ansible", key_a).returncode != 0, "OS Login ignores ssh-keys metadata"

        [fingerprint] = profile["sshPublicKeys"]
        assert session.delete(f"{profile_url}/sshPublicKeys/{fingerprint}", timeout=30).status_code == 200
        within(5, lambda: ssh(address, user, key_sa).returncode != 0)

        current = cloud.call("GET", f"zones/{ZONE}/instances/{NAME}")
        cloud.call("POST", f"zones/{ZONE}/instances/{NAME}/setMetadata", {
            "fingerprint": current["metadata"]["fingerprint"],
            "items": [{"key": "ssh-keys", "value": f"ansible:{pub_a}"},
                      {"key": "enable-oslogin", "value": "FALSE"}]})
        within(10, lambda: ssh(address, "ansible", key_a).returncode == 0)
