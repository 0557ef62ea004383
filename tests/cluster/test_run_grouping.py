"""One play over a VM and a 2-VM cluster trains two runs: trainer_run groups nodes by their cluster.

Before, the nodes of a run were the play's hosts: site.yml over forja-l4 beside forja-elastic-0/1
refused forja-l4 as "node 2 of 3" and the cluster's run failed with it. The role's input checks
(tasks/validate.yml) are applied by ansible-playbook to three local-connection hosts with the
gcp_gpu inventory's cluster hostvars, as site.yml's train play sees them; each host records what
the role decided for it (node count, rank, rendezvous, rendezvous name), or the message it refused
with. Nothing is installed: the checks only read the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}


def _member(rank: int) -> dict[str, Any]:
    """A cluster member's hostvars as plugins/inventory/gcp_gpu.py gives them."""
    return {"forja_cluster": "forja-elastic", "forja_node_rank": rank, "forja_node_count": 2,
            "forja_rendezvous_host": "10.213.0.60", "forja_rendezvous_port": 29400}  # fmt: skip


HOSTS = {"forja-elastic-1": _member(1), "forja-l4": {}, "forja-elastic-0": _member(0)}  # play order


def _decided(work: Path, pattern: str) -> dict[str, dict[str, Any]]:
    """Run the role's checks over the hosts that `pattern` names; what each host's role decided."""
    (work / "project").mkdir(exist_ok=True)
    (work / "project" / "train.py").write_text("print('training')\n")
    (work / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": HOSTS, "vars": LOCAL}}))
    record = ("{{ {'nnodes': trainer_run_nnodes | int, 'rank': trainer_run_node_rank | int,"
              " 'master': trainer_run_master_addr | trim, 'node_name': trainer_run_node_name,"
              " 'nodes': trainer_run_run_nodes} | to_json }}")  # fmt: skip
    play = {
        "name": "Check the inputs as site.yml's train play does", "hosts": pattern, "gather_facts": False,
        "vars": {"trainer_run_command": ["train.py"], "trainer_run_name": "digits",
                 "trainer_run_project_dir": str(work / "project"),
                 "trainer_run_bundle_cache": str(work / "bundles")},
        "tasks": [{"name": "Apply the role's input checks", "block": [
            {"name": "Check as the role does", "ansible.builtin.include_role": {
                "name": "forja.gpu.trainer_run", "tasks_from": "validate.yml", "public": True}},
            {"name": "Record what the role decided", "ansible.builtin.copy": {
                "dest": str(work / "{{ inventory_hostname }}.json"), "mode": "0600", "content": record}},
        ], "rescue": [{"name": "Record the message", "ansible.builtin.copy": {
            "dest": str(work / "{{ inventory_hostname }}.json"), "mode": "0600",
            "content": "{{ {'failed': ansible_failed_result.msg} | to_json }}"}}]}],
    }  # fmt: skip
    (work / "play.yml").write_text(yaml.safe_dump([play]))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FORJA_"))},
           "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           # not ansible.cfg's fact cache: facts a sandbox run cached for a VM named forja-l4 would
           # give these local hosts its address
           "ANSIBLE_CACHE_PLUGIN": "memory"}  # fmt: skip
    run = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(work / "inventory.yml"),
         str(work / "play.yml")], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return {p.stem: json.loads(p.read_text()) for p in work.glob("*.json")}


def test_a_vm_beside_a_cluster_trains_alone_and_the_cluster_as_one_run(tmp_path: Path) -> None:
    decided = _decided(tmp_path, "all")
    assert decided["forja-l4"] == {"nnodes": 1, "rank": 0, "master": "", "node_name": "forja-digits-node000",
                                   "nodes": ["forja-l4"]}  # fmt: skip
    for rank in (0, 1):
        assert decided[f"forja-elastic-{rank}"] == {
            "nnodes": 2, "rank": rank, "master": "10.213.0.60", "node_name": f"forja-digits-node00{rank}",
            "nodes": ["forja-elastic-0", "forja-elastic-1"],  # node 0 first, whatever the play's order
        }


def test_a_cluster_missing_a_member_from_the_play_is_refused_naming_its_group(tmp_path: Path) -> None:
    decided = _decided(tmp_path, "forja-l4,forja-elastic-1")
    assert "failed" not in decided["forja-l4"], decided["forja-l4"]
    message = decided["forja-elastic-1"]["failed"]
    assert ("forja-elastic-1 is node 1 of 2 in cluster forja-elastic, but the play has 1 such host(s)"
            in message)
    assert "-e forja_hosts=cluster_forja_elastic" in message
