"""How the inventory turns a cluster's labels into ranks: the pure table, beside the role test's real run."""

from __future__ import annotations

from ansible_collections.forja.gpu.plugins.inventory import gcp_gpu


def vm(
    name: str, rank: str | None, ip: str, cluster: str = "team", size: str = "3", project: str = "p"
) -> dict:
    labels = {"forja": "managed"}
    if rank is not None:
        labels.update({"forja-cluster": cluster, "forja-rank": rank, "forja-cluster-size": size})
    return {"instance_name": name, "project": project, "private_ip": ip, "labels": labels}


def test_every_member_knows_its_rank_the_node_count_and_rank_zeros_address() -> None:
    found = gcp_gpu.cluster_vars([vm("team-1", "1", "10.0.0.3"), vm("team-0", "0", "10.0.0.2")])
    assert found["team-1"] == {
        "forja_cluster": "team",
        "forja_node_rank": 1,
        "forja_node_count": 3,  # the declared size: a lost member still counts
        "forja_rendezvous_host": "10.0.0.2",
        "forja_rendezvous_port": 29400,
    }
    assert found["team-0"]["forja_node_rank"] == 0


def test_without_rank_zero_there_is_no_rendezvous_host_and_single_vms_are_no_cluster() -> None:
    found = gcp_gpu.cluster_vars([vm("team-1", "1", "10.0.0.3"), vm("forja-l4", None, "10.0.0.9")])
    assert found["team-1"]["forja_rendezvous_host"] is None
    assert "forja-l4" not in found


def test_clusters_of_the_same_name_in_two_projects_stay_apart() -> None:
    found = gcp_gpu.cluster_vars(
        [vm("a-0", "0", "10.0.0.2", project="p1"), vm("b-1", "1", "10.1.0.3", project="p2")]
    )
    assert found["b-1"]["forja_rendezvous_host"] is None
    assert found["a-0"]["forja_rendezvous_host"] == "10.0.0.2"
