"""The sandbox service serves Cloud Storage beside the Compute API: `python -m forja_sandbox.service
ensure` starts both, google-cloud-storage reaches the store at the printed storage_url, objects
outlive a service restart, and the sandbox's VMs reach the same store on the hosts' bridge."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from forja_sandbox import service

pytestmark = pytest.mark.hosts  # the service needs the golden image before it starts

REPO = Path(__file__).resolve().parents[2]


def _free_run_of_ports(length: int = 5) -> int:
    """A port p with p .. p+length-1 all free (the service uses p and the next four)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + length > 65535:
            continue
        taken = False
        for port in range(first, first + length):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    taken = True
                    break
        if not taken:
            return first
    raise RuntimeError("no run of free ports")


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = dict(os.environ, FORJA_SANDBOX_DIR=str(tmp_path / "sandbox"),
               FORJA_SANDBOX_PORT=str(_free_run_of_ports()))
    env.pop("STORAGE_EMULATOR_HOST", None)
    yield env
    subprocess.run([sys.executable, "-m", "forja_sandbox.service", "stop"], env=env, cwd=REPO, check=False,
                   timeout=60)


def _service(env: dict[str, str], verb: str) -> str:
    done = subprocess.run([sys.executable, "-m", "forja_sandbox.service", verb], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def _client(url: str, monkeypatch: pytest.MonkeyPatch) -> storage.Client:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    return storage.Client(project=service.PROJECT, credentials=AnonymousCredentials())


def test_ensure_serves_storage_that_outlives_a_service_restart(
    sandbox: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = json.loads(_service(sandbox, "ensure"))
    port = int(sandbox["FORJA_SANDBOX_PORT"])
    assert endpoint["storage_url"] == service.storage_url(port) == f"http://127.0.0.1:{port + 4}"
    client = _client(endpoint["storage_url"], monkeypatch)
    client.create_bucket("forja-sandbox-ckpt").blob("checkpoints/r1/ckpt-1.pt").upload_from_string(b"step 1")

    _service(sandbox, "stop")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port + 4), timeout=2).close()
    assert (Path(sandbox["FORJA_SANDBOX_DIR"]) / "storage").is_dir()
    _service(sandbox, "ensure")
    blob = client.bucket("forja-sandbox-ckpt").blob("checkpoints/r1/ckpt-1.pt")
    assert blob.download_as_bytes() == b"step 1"


def test_the_sandboxs_vms_reach_the_same_store_on_the_hosts_bridge(
    sandbox: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay on the hosts' bridge (service._serve_storage_on_bridge). The bridge here is a stand-in
    on loopback (TH_NET=127.0.1: 127.0.1.1), so the test needs no booted host and cannot meet the
    lead's sandbox; what differs from the real bridge is only which interface holds the address."""
    sandbox["TH_NET"] = "127.0.1"
    monkeypatch.setenv("TH_NET", "127.0.1")
    endpoint = json.loads(_service(sandbox, "ensure"))
    port = int(sandbox["FORJA_SANDBOX_PORT"])
    bridge_url = service.storage_url(port, bridge=True)
    assert bridge_url == f"http://127.0.1.1:{port + 4}"
    _client(endpoint["storage_url"], monkeypatch).create_bucket("forja-bridge")
    deadline = time.monotonic() + service.POLL_S + 5  # the relay binds within one poll of the start
    while True:
        try:
            socket.create_connection(("127.0.1.1", port + 4), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "nothing listens on the bridge address"
            time.sleep(0.1)
    data = os.urandom(3 * 256 * 1024)  # resumable, in chunks: its session URL must come back via the relay
    via_bridge = _client(bridge_url, monkeypatch).bucket("forja-bridge")
    via_bridge.blob("x", chunk_size=256 * 1024).upload_from_string(data)
    direct = _client(endpoint["storage_url"], monkeypatch)
    assert direct.bucket("forja-bridge").blob("x").download_as_bytes() == data
