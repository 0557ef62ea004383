"""A 2-VM cluster of the sandbox trains with elastic torchrun and outlives a lost node.

`gcp_instance_count: 2` makes forja-elastic-0 and forja-elastic-1 (a cluster apart from the default
VM forja-l4) on the machine's sandbox: real hosts behind the GCE firewall the emulator enforces, with
the cluster's rule opening the rendezvous and gloo ports between them. playbooks/train.yml, aimed at
the cluster's group, starts the trainer_run unit on both: torchrun with a c10d rendezvous on node 0,
one gloo process per node, the digits CNN with a checkpoint every 100 steps. Mid-run node 1 is lost:
systemd SIGKILLs every process of its run (a Spot VM's run is gone as abruptly), and the unit's
Restart=on-failure brings it back 10 s later, as a restarted Spot VM's enabled unit comes back at
boot. The test checks that node 0's elastic agent restarted its workers within the restart budget,
that training resumed from a checkpoint with both nodes and completed with world size 2, that the
play followed node 0 and fetched its results, and that teardown removes both VMs. It starts the
sandbox service when it is not running and stops it again, leaving other VMs alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from forja_sandbox import service

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventory" / "sandbox"
NAME = "forja-elastic"
GROUP = "cluster_forja_elastic"
RUN = "elastic-digits"
CLUSTER = ("-e", f"gcp_instance_name={NAME}", "-e", "gcp_instance_count=2", "-e", f"forja_hosts={GROUP}",
           "-e", '{"gcp_instance_fallback_zones": []}')  # a cluster lives in one zone
MAX_RESTARTS = 3  # trainer_run_max_restarts' default, named on the command so the test says what it checks
STEPS = 2000
MEMBERS_RULE = f"{NAME}-cluster-members"


def _ansible(
    *args: str, tool: str = "ansible-playbook", timeout: float = 1200
) -> subprocess.CompletedProcess[str]:
    argv = [str(Path(sys.executable).with_name(tool)), "-i", str(INVENTORY), *args]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
                          env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc


def _on(host: str, command: str) -> str:
    """A command as root on one VM, along Ansible's own path (the IAP stand-in); its stdout."""
    out = _ansible(host, "-b", "-m", "ansible.builtin.command", "-a", command, tool="ansible",
                   timeout=120).stdout
    return out.split(">>\n", 1)[1] if ">>\n" in out else out


def _state(host: str) -> dict:
    return json.loads(_on(host, f"/usr/local/lib/forja/forja-train-state {RUN}").strip().splitlines()[-1])


def _compute(method: str, path: str, body: dict | None = None) -> dict:
    """One Compute API call to the sandbox, authorised with the sandbox's own service-account key."""
    import google.auth.transport.requests
    import requests
    from google.oauth2 import service_account

    endpoint = service.ensure_running()
    creds = service_account.Credentials.from_service_account_file(
        endpoint["credentials_file"], scopes=["https://www.googleapis.com/auth/compute"])
    creds.refresh(google.auth.transport.requests.Request())
    resp = requests.request(method, f"{endpoint['api_url']}projects/{endpoint['project']}/{path}",
                            headers={"Authorization": f"Bearer {creds.token}"}, json=body, timeout=60)
    resp.raise_for_status()
    return resp.json()


def _members_by_address() -> None:
    """The cluster rule's meaning, spelled with source ranges: the sandbox enforces no sourceTags.

    forja's rule (gcp_instance) admits the rendezvous and gloo ports from the cluster's tag, as GCE
    wants; the sandbox's firewall matches only sourceRanges (forja_sandbox/README.md), so this rule
    admits the same ports from the members' own addresses, to the same target tag, and no more.
    """
    rule = _compute("GET", f"global/firewalls/{NAME}-cluster")
    scopes = _compute("GET", "aggregated/instances")["items"].values()
    addresses = [i["networkInterfaces"][0]["networkIP"]
                 for scope in scopes for i in scope.get("instances", []) if i["name"].startswith(f"{NAME}-")]
    _drop_members_rule()  # an interrupted earlier run's
    _compute("POST", "global/firewalls", {
        "name": MEMBERS_RULE, "network": rule["network"], "direction": "INGRESS",
        "sourceRanges": [f"{a}/32" for a in addresses], "targetTags": rule["targetTags"],
        "allowed": rule["allowed"]})


def _drop_members_rule() -> None:
    if any(f["name"] == MEMBERS_RULE for f in _compute("GET", "global/firewalls").get("items", [])):
        _compute("DELETE", f"global/firewalls/{MEMBERS_RULE}")


def _instances() -> list[str]:
    listed = _ansible("all", "--list-hosts", tool="ansible", timeout=120).stdout
    return [line.strip() for line in listed.splitlines()[1:] if line.strip().startswith(NAME)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The two VMs, provisioned; torn down (both deleted) at the end, whatever happened."""
    was_running = bool(service.describe()["running"])
    service.ensure_running()
    try:
        _ansible("playbooks/provision.yml", *CLUSTER)
        _members_by_address()
        yield tmp_path_factory.mktemp("cluster")
    finally:
        _drop_members_rule()
        if _instances():  # a test failed before the teardown test ran
            _ansible("playbooks/teardown.yml", *CLUSTER, "-e", "forja_teardown_delete=true")
        if not was_running:
            service.stop_service()


@pytest.fixture(scope="module")
def trained(cluster: Path) -> tuple[Path, subprocess.CompletedProcess[str], dict, dict]:
    """train.yml on the cluster's group; node 1's run SIGKILLed once node 0 has checkpoints (step 250)."""
    config = cluster / f"{RUN}.yaml"
    config.write_text(yaml.safe_dump({
        "model": "trainer.demo:digits_cnn", "model_args": {"width": 8, "hidden": 32},
        "data": "trainer.demo:digits", "steps": STEPS, "batch_size": 16, "lr": 0.002, "log_every_steps": 20,
        "checkpoint_every_steps": 100, "checkpoint_every_s": 0,
    }))
    fetched = cluster / "results"
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(INVENTORY),
            "playbooks/train.yml", *CLUSTER, "-e", f"trainer_run_config={config}",
            "-e", f"trainer_run_fetch_dir={fetched}",
            "-e", f"trainer_run_max_restarts={MAX_RESTARTS}", "-e", "forja_history_record=false",
            "-e", '{"trainer_run_env": {"OMP_NUM_THREADS": "1"}}',  # one core per node, as 1 GPU each
            "-e", "trainer_run_checkpoint_bucket="]  # node 0's own disk: RANK 0 stays there
    play = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    try:
        deadline = time.monotonic() + 600
        while True:
            assert play.poll() is None, play.communicate()[0][-6000:]
            assert time.monotonic() < deadline, "node 0 never got past step 250"
            time.sleep(5)
            try:
                step = int((_state(f"{NAME}-0").get("last") or {}).get("step") or 0)
            except (AssertionError, ValueError, IndexError):
                continue  # the unit is not there yet
            if step >= 250:
                break
        assert step < STEPS, "the run ended before node 1 could be lost"
        # Every process of node 1's run at once (systemctl kill cannot signal a cgroup inside nspawn).
        _on(f"{NAME}-1", "sh -c \"kill -KILL $(ps -e -o pid=,unit= | awk '$2 == \\\"forja-train@" + RUN
            + ".service\\\" { print $1 }')\"")
        out, _ = play.communicate(timeout=900)
    finally:
        if play.poll() is None:
            play.kill()
    assert play.returncode == 0, out[-6000:]
    return fetched / f"{NAME}-0", subprocess.CompletedProcess(argv, 0, out, ""), \
        _state(f"{NAME}-0"), _state(f"{NAME}-1")


def test_node_1_was_lost_and_came_back_through_systemd(trained) -> None:
    _, _, node0, node1 = trained
    # systemd's Restart=on-failure brought node 1 back
    assert node1["status"] == "completed" and node1["restarts"] >= 1, node1
    assert node0["restarts"] == 0, node0  # node 0's unit never stopped: its torchrun agent handled the loss
    assert (node0["node_rank"], node0["nnodes"], node1["node_rank"]) == (0, 2, 1)


def test_node_0s_elastic_agent_restarted_within_its_budget(trained) -> None:
    results, _, _, _ = trained
    elastic = json.loads((results / "elastic.json").read_text())
    assert 1 <= elastic["restart_count"] <= elastic["max_restarts"] == MAX_RESTARTS, elastic
    # RANK 0 stayed on node 0, and both nodes trained again
    assert (elastic["rank"], elastic["world_size"], elastic["nodes"]) == (0, 2, 2), elastic


def test_training_resumed_from_a_checkpoint_and_completed_on_both_nodes(trained) -> None:
    results, play, _, _ = trained
    events = [json.loads(line) for line in (results / "events.jsonl").read_text().splitlines()]
    resumed = [e for e in events if e["event"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["resumed_from_step"] >= 200, resumed
    assert resumed[0]["world_size"] == 2
    summary = json.loads((results / "summary.json").read_text())
    assert (summary["status"], summary["steps"], summary["world_size"]) == ("completed", STEPS, 2), summary
    assert summary["resumed_from_step"] == resumed[0]["resumed_from_step"] and summary["accuracy"] >= 0.85
    # the play followed node 0 alone and fetched from it alone
    assert f"Run {RUN} completed on {NAME}-0 (rank 0)" in play.stdout
    assert not (results.parent / f"{NAME}-1").exists()


def test_teardown_removes_both_vms(trained) -> None:
    del trained
    assert sorted(_instances()) == [f"{NAME}-0", f"{NAME}-1"]
    _ansible("playbooks/teardown.yml", *CLUSTER, "-e", "forja_teardown_delete=true")
    assert _instances() == []
