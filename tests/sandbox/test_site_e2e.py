"""site.yml end to end on the sandbox cloud, as a new user runs it.

From nothing (the sandbox destroyed) to a trained demo fetched to the controller and a Jupyter
that a Colab-like client reaches through a real SSH tunnel; then a second run that changes
nothing, and a teardown that leaves no host, namespace, mount or emulator behind. The first
insert in the default zone is answered with a stock-out, so the play must move to the fallback
zone. The VM is a Spot VM, so the module can end with the preemption drill: Google takes the VM
away mid-training (a simulated maintenance event through the Compute API), `Forja.up()` starts it
again, and the training unit resumes from its checkpoint at boot and finishes; the run history
records the preemption and the work lost. This test resets the machine's sandbox (it is the same
one `make sandbox` uses).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from forja import colab
from forja.api import Forja
from forja.history import History
from forja.sandbox import service, testhosts
from forja.tunnel import ssh_tunnel

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STOCK_OUT = [{"method": "instances.insert", "error": "ZONE_RESOURCE_POOL_EXHAUSTED",
              "zone": "us-east1-d", "times": 1}]
SPOT = ("-e", "gcp_instance_spot=true")  # every site run of this module: the drill needs a Spot VM


def _playbook(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), *args], cwd=ROOT,
                          capture_output=True, text=True, env=env or dict(os.environ), timeout=2400,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc


def _recap(stdout: str) -> dict[str, dict[str, int]]:
    recap = {}
    for host, fields in re.findall(r"^(\S+)\s+: (ok=.*)$", stdout, flags=re.M):
        recap[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", fields)}
    return recap


def _compute(method: str, path: str) -> dict:
    """One Compute API call to the sandbox, authorised with the sandbox's own service-account key."""
    import google.auth.transport.requests
    from google.oauth2 import service_account

    endpoint = service.ensure_running()
    creds = service_account.Credentials.from_service_account_file(
        endpoint["credentials_file"], scopes=["https://www.googleapis.com/auth/compute"])
    creds.refresh(google.auth.transport.requests.Request())
    resp = requests.request(method, f"{endpoint['api_url']}projects/{endpoint['project']}/{path}",
                            headers={"Authorization": f"Bearer {creds.token}"}, timeout=60)
    resp.raise_for_status()
    return resp.json()


def _instances() -> list[dict]:
    """The sandbox's instances, read through the Compute API."""
    items = _compute("GET", "aggregated/instances")["items"]
    return [i for scope in items.values() for i in scope.get("instances", [])]


def _address(vm: dict) -> str:
    return vm["networkInterfaces"][0]["accessConfigs"][0]["natIP"]


def _on_host(address: str, command: str) -> str:
    ssh = ["ssh", "-i", str(testhosts.key_path()), "-o", "StrictHostKeyChecking=no", "-o",
           "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
           f"ansible@{address}", command]
    return subprocess.run(ssh, capture_output=True, text=True, timeout=30, check=False).stdout


@pytest.fixture(scope="module")
def first_run() -> subprocess.CompletedProcess[str]:
    service.destroy()
    env = dict(os.environ, FORJA_SANDBOX_FAULTS=json.dumps(STOCK_OUT))
    proc = _playbook("site.yml", *SPOT, env=env)
    yield proc
    service.stop_service()  # the fault drill must not outlive the test module


def test_stock_out_moves_the_vm_to_the_fallback_zone(first_run: subprocess.CompletedProcess[str]) -> None:
    (vm,) = _instances()
    assert vm["name"] == "forja-l4"
    assert vm["zone"].endswith("/zones/us-east1-b"), vm["zone"]
    assert vm["status"] == "RUNNING"
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in first_run.stdout + first_run.stderr


def test_the_demo_trained_and_its_results_were_fetched(first_run: subprocess.CompletedProcess[str]) -> None:
    results = ROOT / "results" / "digits" / "forja-l4"
    summary = json.loads((results / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["accuracy"] >= 0.85
    assert (results / "metrics.jsonl").stat().st_size > 0
    assert list((results / "plots").glob("*.png"))
    assert "Training: completed" in first_run.stdout
    assert "Colab: open the tunnel with: ssh -N -L 8888:127.0.0.1:8888" in first_run.stdout


def test_colab_reaches_the_provisioned_jupyter_through_a_tunnel(
    first_run: subprocess.CompletedProcess[str],
) -> None:
    (vm,) = _instances()
    address = _address(vm)
    token_file = Path.home() / ".config" / "forja" / "tokens" / "forja-l4.jupyter-token"
    assert token_file.stat().st_mode & 0o077 == 0, "the fetched token must be readable by its owner only"
    token = token_file.read_text()
    with ssh_tunnel(address, "ansible", testhosts.key_path(), 8888, 8888,
                    strict_host_key_checking="no", known_hosts_file="/dev/null") as tunnel:
        assert colab.run_via_http_over_ws(tunnel.base_url, token, "print(1+1)").strip() == "2"
        assert colab.run_via_direct(tunnel.base_url, token, "print(1+1)").strip() == "2"
        with pytest.raises(colab.ColabRefused):
            colab.run_via_direct(tunnel.base_url, "wrong-token", "print(1)")


def _assert_nothing_changed(proc: subprocess.CompletedProcess[str]) -> None:
    recap = _recap(proc.stdout)
    assert recap, "no PLAY RECAP found"
    assert {host: stats["changed"] for host, stats in recap.items()} == dict.fromkeys(recap, 0)


def test_a_second_run_changes_nothing(first_run: subprocess.CompletedProcess[str]) -> None:
    _assert_nothing_changed(_playbook("site.yml", *SPOT))


def test_a_second_run_with_the_mitogen_strategy_changes_nothing(
    first_run: subprocess.CompletedProcess[str],
) -> None:
    """The opt-in fast strategy (plugins/strategy/mitogen_linear.py) sees the same converged state.

    An unknown strategy name fails the play, so a pass means Mitogen's strategy drove the run.
    """
    env = dict(os.environ, ANSIBLE_STRATEGY="mitogen_linear")
    _assert_nothing_changed(_playbook("site.yml", *SPOT, env=env))


def test_a_preempted_spot_vm_comes_back_and_its_training_resumes_and_finishes(
    first_run: subprocess.CompletedProcess[str], tmp_path: Path,
) -> None:
    config = yaml.safe_load((ROOT / "trainer" / "configs" / "digits.yaml").read_text())
    config.update(steps=6000, checkpoint_every_s=2, log_every_steps=100)  # ~10-20 s of CPU work
    (tmp_path / "drill.yaml").write_text(yaml.safe_dump(config))
    forja = Forja(tmp_path, extravars={"gcp_instance_spot": True}, host_key_checking=False,
                  history=History(tmp_path / "history.sqlite"), send_project=False)
    started = forja.train(tmp_path / "drill.yaml", name="drill", wait=False)
    assert started.status == "running"

    (vm,) = _instances()
    checkpoints = "/var/lib/forja/runs/drill/checkpoints"
    deadline = time.monotonic() + 120
    while "ckpt" not in _on_host(_address(vm), f"sudo ls {checkpoints}"):
        assert time.monotonic() < deadline, "no checkpoint within 120 s of the start"
        time.sleep(0.5)
    zone = vm["zone"].rsplit("/", 1)[-1]
    _compute("POST", f"zones/{zone}/instances/{vm['name']}/simulateMaintenanceEvent")
    deadline = time.monotonic() + 120
    while _instances()[0]["status"] != "TERMINATED":
        assert time.monotonic() < deadline, "the Spot VM was not preempted within 120 s"
        time.sleep(1)

    up = forja.up()  # provision.yml: starts the preempted VM again and waits for SSH
    assert up.ok, up
    (vm,) = _instances()
    assert vm["status"] == "RUNNING"
    deadline = time.monotonic() + 600
    # "preempted" (the trainer's own word for its SIGTERM exit) lasts until the unit starts at boot
    while (status := forja.status("drill")[0]).status not in ("completed", "failed", "stopped"):
        assert time.monotonic() < deadline, f"the resumed run did not finish: {status}"
        time.sleep(3)
    summary = status.summary or {}
    assert status.status == "completed", status
    assert summary["steps"] == 6000 and summary["preemptions"] == 1, summary
    assert summary["resumed_from_step"] > 0, "it resumed from a checkpoint, not from zero"
    steps_per_s = summary["samples_per_s"] / config["batch_size"]
    assert summary["lost_steps"] <= steps_per_s * config["checkpoint_every_s"] + config["log_every_steps"]
    (record,) = forja.runs()
    assert (record.run_id, record.status, record.preemptions, record.lost_steps) == (
        "drill", "completed", 1, summary["lost_steps"])
    # Jupyter is enabled at boot too: Colab reaches it again after the restart
    token = (Path.home() / ".config" / "forja" / "tokens" / "forja-l4.jupyter-token").read_text()
    with ssh_tunnel(_address(vm), "ansible", testhosts.key_path(), 8888, 8888,
                    strict_host_key_checking="no", known_hosts_file="/dev/null") as tunnel:
        assert colab.run_via_direct(tunnel.base_url, token, "print(2+2)").strip() == "4"


def test_teardown_leaves_nothing_behind(first_run: subprocess.CompletedProcess[str]) -> None:
    _playbook("playbooks/teardown.yml", "-e", "forja_teardown_delete=true")
    assert _instances() == []
    bound = [i for i in testhosts.running() if 10 <= i <= 19]
    assert bound == [], f"hosts of deleted instances still there: {bound}"
    service.destroy()
    assert service.describe()["running"] is False
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not re.search(r"^th1\d\b", netns, flags=re.M)
    mounts = Path("/proc/mounts").read_text()
    assert str(testhosts.base_dir() / "hosts" / "th1") not in mounts
