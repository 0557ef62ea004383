"""The shipped Grafana dashboard and Prometheus snippet match the metrics the runs serve.

The metric names' one home is `forja.live.METRICS`; a metric the trainer serves with no panel, a
panel querying a name nobody serves, or a scrape target outside the tunnel's ports fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from forja import live

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "grafana"
DASHBOARD = json.loads((EXAMPLES / "forja-training.json").read_text())
PANELS = [p for p in DASHBOARD["panels"] if p["type"] != "row"]
NAME = re.compile(r"\bforja_[a-z_]+")


def _exprs() -> list[str]:
    return [target["expr"] for panel in PANELS for target in panel["targets"]]


def test_every_served_metric_has_a_panel_and_every_panel_a_served_metric() -> None:
    queried = {name for expr in _exprs() for name in NAME.findall(expr)}
    assert queried == set(live.METRICS)


def test_every_query_is_filtered_by_the_run_variable() -> None:
    run_variable = next(v for v in DASHBOARD["templating"]["list"] if v["name"] == "run")
    assert "label_values(forja_train_step, run)" in run_variable["definition"]
    for expr in _exprs():
        for selector in re.findall(r"forja_[a-z_]+(\{[^}]*\})?", expr):
            assert selector == '{run=~"$run"}', expr


def test_panels_have_unique_ids_a_datasource_and_fit_the_grid() -> None:
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in PANELS:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["targets"] and all(t["refId"] for t in panel["targets"]), panel["title"]
    assert DASHBOARD["uid"] == "forja-training" and isinstance(DASHBOARD["schemaVersion"], int)


def test_the_scrape_snippet_targets_the_ports_the_tunnel_forwards() -> None:
    config = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets == [f"127.0.0.1:{port}" for port in live.metrics_ports()]
