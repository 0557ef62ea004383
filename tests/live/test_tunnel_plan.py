"""The tunnel jupyter_colab publishes carries the runs' metrics ports to forja's side, and `live_url`
names them where the tunnel puts them (equal ports on both ends)."""

from __future__ import annotations

import shlex

from forja import contract, host_contract, live


def _published(metrics_ports: list[int]) -> contract.Published:
    forwards = " ".join(f"-L {port}:127.0.0.1:{port}" for port in metrics_ports)
    return contract.read_stats({"forja": {"h1": {"contract_version": 1, "jupyter": {
        "port": 8888, "tunnel_command": f"ssh -N -L 8888:127.0.0.1:8888 {forwards} ansible@10.0.0.7",
        "colab_url_template": "http://localhost:8888/?token=<token>", "token_file": "/t",
        "metrics_ports": metrics_ports}}}})  # fmt: skip


def test_the_tunnel_plan_knows_the_metrics_ports_it_forwards() -> None:
    ports = list(live.metrics_ports())
    plan = _published(ports).jupyter["h1"].plan("h1")
    assert plan.metrics_ports == tuple(ports)
    forwarded = [plan.command[i + 1] for i, word in enumerate(plan.command) if word == "-L"]
    assert forwarded == [f"{port}:127.0.0.1:{port}" for port in [8888, *ports]]
    assert shlex.join(plan.command).startswith("ssh -N -L 8888:127.0.0.1:8888 -L ")


def test_the_metrics_ports_come_from_the_host_contract() -> None:
    first, count = host_contract.value("metrics_port"), host_contract.value("metrics_ports")
    assert live.metrics_ports() == range(first, first + count)
    assert live.live_url() == f"http://127.0.0.1:{first}/metrics"
    assert live.live_url(first + 3) == f"http://127.0.0.1:{first + 3}/metrics"
    assert live.live_url(first, forwards={first: 18890}) == "http://127.0.0.1:18890/metrics"


def test_an_older_role_that_forwards_no_metrics_port_still_reads() -> None:
    old = contract.read_stats({"forja": {"h1": {"contract_version": 1, "jupyter": {
        "port": 8888, "tunnel_command": "ssh -N -L 8888:127.0.0.1:8888 h1",
        "colab_url_template": "http://localhost:8888/?token=<token>", "token_file": "/t"}}}})  # fmt: skip
    assert old.jupyter["h1"].plan("h1").metrics_ports == ()
