"""observe.yml on a cluster: every member, with its rank and state, through Forja.observe (ansible-runner).

The cluster is made by the gcp_instance role on the Compute emulator over real HTTP; Forja.observe runs
playbooks/observe.yml and reads the published facts through the data contract (forja/contract.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cluster_plays import role_play
from gcp_helpers import emulator_env, run_playbook
from test_cluster_role import recap

from forja.api import Forja
from forja.history import History

PROJECT = "forja-sandbox"


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_observe_reports_every_member_with_its_rank_and_state(emulator, key_file, tmp_path, monkeypatch):
    env = emulator_env(emulator, key_file)
    size = ("-e", "gcp_instance_name=team", "-e", "gcp_instance_count=2", "-e", "gcp_instance_spot=true")
    made = run_playbook(env, "localhost,", str(role_play(tmp_path)), *size)
    assert recap(made)["failed"] == 0, made.stdout[-4000:]
    emulator.preempt(PROJECT, "us-east1-d", "team-1")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    forja = Forja(tmp_path, inventory=inventory, private_data_dir=Path(tmp_path / "runner"),
                  history=History(tmp_path / "history.sqlite"))

    seen = forja.observe({"gcp_instance_name": "team", "gcp_instance_count": 2})
    assert sorted(seen) == ["team-0", "team-1"]
    assert [(seen[n].cluster, seen[n].rank) for n in ("team-0", "team-1")] == [("team", 0), ("team", 1)]
    assert seen["team-0"].running and seen["team-0"].spot
    assert seen["team-1"].status == "TERMINATED" and seen["team-1"].preempted_at

    lone = forja.observe({"gcp_instance_name": "team-0"})  # one VM: as before, no cluster
    assert list(lone) == ["team-0"] and (lone["team-0"].cluster, lone["team-0"].rank) == ("", 0)
