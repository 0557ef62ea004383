"""`forja train --cluster NAME` / `Forja(cluster=NAME)`: which hosts a cluster is, read from the inventory.

The user names a cluster as its VMs were named (gcp_instance_name); forja finds its members by the
gcp_gpu plugin's hostvars (forja_cluster, forja_node_rank), in rank order, and the inventory's own
group that holds exactly them. A name the inventory has no cluster of is refused with the clusters it
has, before a play runs or a run is recorded. Real ansible-inventory over a static inventory shaped as
the plugin fills it (the sandbox test, tests/sandbox/test_cluster_training.py, reads the plugin's).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from forja import errors, inventory, runstate
from forja.api import Forja, TrainStatus
from forja.history import History

REPO = Path(__file__).resolve().parents[2]
FORJA = str(Path(sys.executable).with_name("forja"))


def _member(rank: int, cluster: str = "forja-elastic") -> dict:
    return {"ansible_host": f"10.0.0.{rank + 10}", "forja_cluster": cluster, "forja_node_rank": rank,
            "forja_node_count": 2, "machine_type": "g2-standard-24", "zone": "us-east1-b"}


@pytest.fixture
def listed(tmp_path: Path) -> Path:
    """One VM of its own and a 2-VM cluster whose rank 1 is listed first (the API's order is not rank's)."""
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {
        "forja_gpu": {"hosts": {"forja-elastic-1": _member(1), "forja-l4": {"ansible_host": "10.0.0.5"},
                                "forja-elastic-0": _member(0)}},
        "cluster_forja_elastic": {"hosts": {"forja-elastic-1": {}, "forja-elastic-0": {}}},
    }}}))
    return path


def test_a_cluster_is_its_members_in_rank_order_and_the_inventorys_own_group(listed: Path) -> None:
    found = inventory.clusters(inventory.read(listed))
    assert found == {"forja-elastic": inventory.Cluster(
        "forja-elastic", "cluster_forja_elastic", ["forja-elastic-0", "forja-elastic-1"])}
    assert found["forja-elastic"].rank0 == "forja-elastic-0"


def test_a_cluster_without_its_group_is_named_member_by_member(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {"a-1": _member(1, "a"), "a-0": _member(0, "a")}}}))
    assert inventory.cluster(inventory.read(path), "a").group == "a-0,a-1"


def _refused_train(listed: Path, tmp_path: Path, cluster: str | None) -> str:
    """What `train` says when it refuses the hosts, with --cluster or without; nothing is recorded."""
    config = tmp_path / "digits.yaml"
    config.write_text("steps: 10\n")
    history = History(tmp_path / "history.sqlite")
    with pytest.raises(errors.ConfigError) as caught:
        Forja(tmp_path, inventory=listed, history=history, cluster=cluster).train(config, name="never-sent")
    assert caught.value.field == "--cluster"
    assert history.list() == []
    return caught.value.message


def test_a_cluster_the_inventory_lacks_is_refused_naming_those_it_has_before_a_run_is_recorded(
    listed: Path, tmp_path: Path
) -> None:
    said = _refused_train(listed, tmp_path, "forja-l4")
    assert "'forja-l4' is not a cluster of the inventory (its clusters: forja-elastic)" in said


def test_forja_train_cluster_says_so_once_and_exits_2(listed: Path, tmp_path: Path) -> None:
    config = tmp_path / "digits.yaml"
    config.write_text("steps: 10\n")
    env = dict(os.environ, FORJA_HOME=str(tmp_path / "home"))
    env.pop("FORJA_INVENTORY", None)
    done = subprocess.run([FORJA, "-i", str(listed), "train", str(config), "--cluster", "nope"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == int(errors.ExitCode.USAGE), done.stderr
    assert done.stderr.count("'nope' is not a cluster of the inventory (its clusters: forja-elastic)") == 1
    assert "forja-runs" not in os.listdir(tmp_path)


def test_a_managed_run_on_a_cluster_is_refused_before_it_is_sent(listed: Path, tmp_path: Path) -> None:
    forja = Forja(tmp_path, inventory=listed, history=History(tmp_path / "h.sqlite"), cluster="forja-elastic")
    with pytest.raises(errors.ConfigError, match="a managed run watches one VM"):
        forja.train_managed(tmp_path / "any.yaml", fallback_zones=[])


def test_status_rows_carry_the_rank_and_the_elastic_restarts_where_the_state_has_them() -> None:
    node = runstate.parse({"forja_train_state": 1, "run": "r", "status": "running", "node_rank": 1,
                           "nnodes": 2, "elastic": {"restart_count": 1, "max_restarts": 3}})
    alone = runstate.parse({"forja_train_state": 1, "run": "r", "status": "running"})
    assert node is not None and alone is not None
    row = TrainStatus.from_state("forja-elastic-1", node)
    assert (row.node_rank, row.nnodes, row.elastic_restarts) == (1, 2, 1)
    one = TrainStatus.from_state("forja-l4", alone)
    assert (one.nnodes, one.elastic_restarts) == (1, None)


def test_the_runs_of_an_inventory_are_each_cluster_and_each_vm_outside_one(listed: Path) -> None:
    assert inventory.run_targets(inventory.read(listed)) == [
        "forja-l4", "cluster forja-elastic (forja-elastic-0, forja-elastic-1)"]


def test_train_without_a_choice_between_a_vm_and_a_cluster_is_refused_before_a_run_is_recorded(
    listed: Path, tmp_path: Path
) -> None:
    """A play over both would start two runs (trainer_run groups nodes by cluster); forja follows one."""
    said = _refused_train(listed, tmp_path, None)
    assert "holds 2 runs' hosts: forja-l4; cluster forja-elastic (forja-elastic-0, forja-elastic-1)" in said
    assert "--cluster NAME" in said and "--limit HOST" in said
