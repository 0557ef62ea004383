"""A 2-VM cluster of the sandbox trains with elastic torchrun and outlives a lost node.

`gcp_instance_count: 2` makes forja-elastic-0 and forja-elastic-1 (a cluster apart from the default
VM forja-l4) on the machine's sandbox: real hosts behind the GCE firewall the emulator enforces,
with the cluster's rule opening the rendezvous and gloo ports between them (source and target: the
cluster's tag, which the sandbox's firewall resolves to the members' addresses, as GCE does). The
user's command, `forja train CONFIG --cluster forja-elastic`, sends the run to the cluster's group,
which starts the trainer_run unit on both: torchrun with a c10d rendezvous on node 0, one gloo
process per node, the digits CNN with a checkpoint every 100 steps. Mid-run node 1 is lost: systemd
SIGKILLs every process of its run (a Spot VM's run is gone as abruptly), and the unit's Restart=on-
failure brings it back 10 s later, as a restarted Spot VM's enabled unit comes back at boot. The
test checks that node 0's elastic agent restarted its workers within the restart budget, that
training resumed from a checkpoint with both nodes and completed with world size 2, that forja
followed node 0 (progress in its history while it trained, follow windows of 60 s: no fixed clock)
and fetched its results alone, that `forja runs`, `forja cost --run` and `forja status` count both
members (status with their ranks and node 0's elastic restarts), and that teardown removes both VMs.
First, a VM beside the cluster (forja-solo) shows that a play over both groups nodes by cluster.
It starts the sandbox service when it is not running and stops it again, leaving other VMs alone.
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
import testsandbox
import yaml

from trainer import run_folder

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = testsandbox.INVENTORY
NAME = "forja-elastic"
GROUP = "cluster_forja_elastic"
RUN = "elastic-digits"
CLUSTER = ("-e", f"gcp_instance_name={NAME}", "-e", "gcp_instance_count=2", "-e", f"forja_hosts={GROUP}",
           "-e", '{"gcp_instance_fallback_zones": []}')  # a cluster lives in one zone
MAX_RESTARTS = 3  # trainer_run_max_restarts' default, named on the command so the test says what it checks
STEPS = 2000
MEMBERS = [f"{NAME}-0", f"{NAME}-1"]
FORJA = str(Path(sys.executable).with_name("forja"))


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


def _instances() -> list[str]:
    listed = _ansible("all", "--list-hosts", tool="ansible", timeout=120).stdout
    return [line.strip() for line in listed.splitlines()[1:] if line.strip().startswith(NAME)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, sandbox_cloud: dict[str, str]) -> Iterator[Path]:
    """The two VMs, provisioned on the test run's sandbox; torn down (both deleted) at the end,
    whatever happened, so the sandbox is left as it was found."""
    try:
        with testsandbox.vms_over_the_site_env():  # their training is tested here, not the install
            _ansible("playbooks/provision.yml", *CLUSTER)
        yield tmp_path_factory.mktemp("cluster")
    finally:
        if _instances():  # a test failed before the teardown test ran
            _ansible("playbooks/teardown.yml", *CLUSTER, "-e", "forja_teardown_delete=true")


def _forja(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The user's command on the machine's sandbox, run in the project folder, with a history of the
    test's own (FORJA_HOME beside the project, not sent with it)."""
    proc = subprocess.run([FORJA, "-i", str(INVENTORY), "--no-host-key-checking", *args],
                          cwd=folder / "project", capture_output=True, text=True, timeout=300, check=False,
                          env=_forja_env(folder))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _forja_env(folder: Path) -> dict[str, str]:
    env = dict(os.environ, FORJA_HOME=str(folder / "home"), FORJA_FOLLOW_WINDOW_S="60", ANSIBLE_NOCOLOR="1")
    env.pop("FORJA_INVENTORY", None)
    return env


SOLO = ("-e", "gcp_instance_name=forja-solo", "-e", "forja_hosts=forja-solo")


def test_a_vm_beside_the_cluster_is_a_run_of_its_own(cluster: Path) -> None:
    """One VM and the 2-VM cluster side by side on the sandbox, as the plugin lists them: the train
    play over forja_gpu (all three) groups nodes by cluster, so the VM is node 0 of 1 and the cluster's
    members nodes 0 and 1 of 2 (the role's own checks and decisions, tasks/validate.yml, on the real
    VMs); `forja train` without --cluster asks which run it is to follow, before anything is sent.
    First in the module: on the cluster as provisioned, before its training (the VM is removed again)."""
    work = cluster / "side-by-side"
    (work / "project").mkdir(parents=True)
    (work / "project" / "train.py").write_text("print('training')\n")
    decided = "{{ {'nnodes': trainer_run_nnodes | int, 'rank': trainer_run_node_rank | int, " \
              "'nodes': trainer_run_run_nodes} | to_json }}"
    (work / "play.yml").write_text(yaml.safe_dump([{
        "name": "Check the inputs as the train play does", "hosts": "forja_gpu", "become": True,
        "gather_facts": False,
        "vars": {"trainer_run_command": ["train.py"], "trainer_run_name": "side-by-side",
                 "trainer_run_project_dir": str(work / "project"),
                 "trainer_run_bundle_cache": str(work / "bundles")},
        "tasks": [
            {"name": "Check as the role does", "ansible.builtin.include_role": {
                "name": "forja.gpu.trainer_run", "tasks_from": "validate.yml", "public": True}},
            {"name": "Record what the role decided", "delegate_to": "localhost", "become": False,
             "ansible.builtin.copy": {"dest": str(work / "{{ inventory_hostname }}.json"), "mode": "0600",
                                      "content": decided}},
        ],
    }]))  # fmt: skip
    _ansible("playbooks/provision.yml", *SOLO)
    try:
        _ansible(str(work / "play.yml"))
        found = {p.stem: json.loads(p.read_text()) for p in work.glob("*.json")}
        assert found["forja-solo"] == {"nnodes": 1, "rank": 0, "nodes": ["forja-solo"]}, found
        for rank, member in enumerate(MEMBERS):
            assert found[member] == {"nnodes": 2, "rank": rank, "nodes": MEMBERS}, found
        config = work / "digits.yaml"
        config.write_text(yaml.safe_dump({"model": "trainer.demo:digits_cnn", "data": "trainer.demo:digits",
                                          "steps": 10}))
        refused = subprocess.run([FORJA, "-i", str(INVENTORY), "--no-host-key-checking", "train", str(config),
                                  "--name", "never-sent"], cwd=work / "project", capture_output=True,
                                 text=True, timeout=300, check=False, env=_forja_env(cluster))  # fmt: skip
        assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
        assert "runs' hosts: " in refused.stderr and "forja-solo" in refused.stderr, refused.stderr
        assert "cluster forja-elastic (forja-elastic-0, forja-elastic-1)" in refused.stderr, refused.stderr
    finally:
        _ansible("playbooks/teardown.yml", *SOLO, "-e", "forja_teardown_delete=true")


@pytest.fixture(scope="module")
def trained(cluster: Path) -> tuple[Path, dict, dict, dict]:
    """`forja train --cluster` on the cluster; node 1's run SIGKILLed once node 0 has checkpoints (step
    250). Returns node 0's fetched results, forja's result, both nodes' states, and what `forja runs`,
    `forja cost --run`, `forja status` and the history while training said."""
    config = cluster / f"{RUN}.yaml"
    config.write_text(yaml.safe_dump({
        "model": "trainer.demo:digits_cnn", "model_args": {"width": 8, "hidden": 32},
        "data": "trainer.demo:digits", "steps": STEPS, "batch_size": 16, "lr": 0.002, "log_every_steps": 20,
        "checkpoint_every_steps": 100, "checkpoint_every_s": 0,
    }))
    argv = [FORJA, "-i", str(INVENTORY), "--no-host-key-checking", "--json",
            "-e", f"trainer_run_max_restarts={MAX_RESTARTS}",
            "-e", 'trainer_run_env={"OMP_NUM_THREADS": "1"}',  # one core per node, as 1 GPU each
            "-e", "trainer_run_checkpoint_bucket=",  # node 0's own disk: RANK 0 stays there
            "train", str(config), "--cluster", NAME, "--name", RUN]
    project = cluster / "project"  # the command's folder, sent with the trainer
    project.mkdir()
    (project / "README.md").write_text("digits on two nodes\n")
    with (cluster / "train.out").open("w") as stdout, (cluster / "train.err").open("w") as stderr:
        sent = subprocess.Popen(argv, cwd=project, stdout=stdout, stderr=stderr, text=True,
                                env=_forja_env(cluster))
    seen: dict = {}
    try:
        deadline = time.monotonic() + 600
        while True:
            assert sent.poll() is None, (cluster / "train.err").read_text()[-6000:]
            assert time.monotonic() < deadline, "node 0 never got past step 250"
            time.sleep(5)
            try:
                step = int((_state(f"{NAME}-0").get("last") or {}).get("step") or 0)
            except (AssertionError, ValueError, IndexError):
                continue  # the unit is not there yet
            if step >= 250:
                # what forja's history holds while it follows rank 0: the run, its members, its progress
                # (written at forja's own poll, which may come a few seconds after node 0's step 250)
                (seen,) = json.loads(_forja(cluster, "--json", "runs").stdout)
                if seen.get("steps") or step >= STEPS // 2:
                    break
        assert step < STEPS, "the run ended before node 1 could be lost"
        # Every process of node 1's run at once (systemctl kill cannot signal a cgroup inside nspawn).
        _on(f"{NAME}-1", "sh -c \"kill -KILL $(ps -e -o pid=,unit= | awk '$2 == \\\"forja-train@" + RUN
            + ".service\\\" { print $1 }')\"")
        sent.wait(timeout=900)
    finally:
        if sent.poll() is None:
            sent.kill()
    assert sent.returncode == 0, (cluster / "train.err").read_text()[-6000:]
    said = {
        "train": json.loads((cluster / "train.out").read_text()), "while": seen,
        "runs": json.loads(_forja(cluster, "--json", "runs").stdout),
        "cost": json.loads(_forja(cluster, "--json", "cost", "--run", RUN).stdout),
        "status": json.loads(_forja(cluster, "--json", "status", RUN, "--cluster", NAME).stdout),
    }
    return project / "forja-runs" / RUN / f"{NAME}-0", said, _state(f"{NAME}-0"), _state(f"{NAME}-1")


def test_node_1_was_lost_and_came_back_through_systemd(trained) -> None:
    _, _, node0, node1 = trained
    # systemd's Restart=on-failure brought node 1 back
    assert node1["status"] == "completed" and node1["restarts"] >= 1, node1
    assert node0["restarts"] == 0, node0  # node 0's unit never stopped: its torchrun agent handled the loss
    assert (node0["node_rank"], node0["nnodes"], node1["node_rank"]) == (0, 2, 1)


def test_node_0s_elastic_agent_restarted_within_its_budget(trained) -> None:
    results, _, _, _ = trained
    elastic = json.loads((results / run_folder.ELASTIC).read_text())
    assert 1 <= elastic["restart_count"] <= elastic["max_restarts"] == MAX_RESTARTS, elastic
    # RANK 0 stayed on node 0, and both nodes trained again
    assert (elastic["rank"], elastic["world_size"], elastic["nodes"]) == (0, 2, 2), elastic


def test_training_resumed_from_a_checkpoint_and_completed_on_both_nodes(trained) -> None:
    results, _, _, _ = trained
    events = [json.loads(line) for line in (results / run_folder.EVENTS).read_text().splitlines()]
    resumed = [e for e in events if e["event"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["resumed_from_step"] >= 200, resumed
    assert resumed[0]["world_size"] == 2
    summary = json.loads((results / run_folder.SUMMARY).read_text())
    assert (summary["status"], summary["steps"], summary["world_size"]) == ("completed", STEPS, 2), summary
    assert summary["resumed_from_step"] == resumed[0]["resumed_from_step"] and summary["accuracy"] >= 0.85


def test_forja_followed_rank_0_to_the_end_and_fetched_its_results_alone(trained) -> None:
    results, said, _, _ = trained
    done = said["train"]
    assert (done["run_id"], done["status"], done["detached"]) == (RUN, "completed", None), done
    assert done["hosts"] == MEMBERS
    assert (done["summary"]["steps"], done["artifact_dir"]) == (STEPS, str(results))
    assert not (results.parent / f"{NAME}-1").exists()


def test_the_history_records_every_member_and_rank_0s_progress(trained) -> None:
    _, said, _, _ = trained
    while_training = said["while"]  # read once node 0 was past step 250, forja following it
    assert (while_training["run_id"], while_training["status"]) == (RUN, "running"), while_training
    assert while_training["hosts"] == MEMBERS and while_training["steps"] >= 20
    (ended,) = said["runs"]
    assert (ended["status"], ended["steps"], ended["hosts"]) == ("completed", STEPS, MEMBERS), ended


def test_forja_cost_run_prices_every_member(trained) -> None:
    _, said, _, _ = trained
    cost = said["cost"]
    assert cost["vm_count"] == 2 and cost["rate_source"].startswith("2 × g2-standard-8"), cost
    assert cost["usd_per_hour"] > 0 and cost["parts"], cost


def test_forja_status_shows_each_member_with_its_rank_and_elastic_restarts(trained) -> None:
    _, said, _, _ = trained
    rows = {row["host"]: row for row in said["status"]}
    assert sorted(rows) == MEMBERS
    node0, node1 = rows[f"{NAME}-0"], rows[f"{NAME}-1"]
    assert (node0["node_rank"], node0["nnodes"], node1["node_rank"], node1["nnodes"]) == (0, 2, 1, 2)
    assert 1 <= node0["elastic_restarts"] <= MAX_RESTARTS, node0  # its agent restarted the workers
    assert isinstance(node1["elastic_restarts"], int) and node1["restarts"] >= 1, node1


def test_teardown_removes_both_vms(trained) -> None:
    del trained
    assert sorted(_instances()) == [f"{NAME}-0", f"{NAME}-1"]
    # the command as a user types it: no gcp_instance_fallback_zones, which only creating checks
    # (teardown once refused this cluster until the user set it to [])
    _ansible("playbooks/teardown.yml", "-e", f"gcp_instance_name={NAME}", "-e", "gcp_instance_count=2",
             "-e", "forja_teardown_delete=true")
    assert _instances() == []
