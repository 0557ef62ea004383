"""A sweep on a real test host (th6, the API tests' own): two tiny trials of the digits demo, each an
ordinary forja run sent through the real playbooks; the second waits in the VM's run queue while the
first trains (when forja has the queue), and the study says how each ended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from apihosts import REPO, host_vars, write_inventory

from forja.api import Forja
from forja.cost_report import SETTLED_EVENT
from forja.history import History
from forja_sandbox import testhosts

pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.timeout(1200)]


def test_a_sweep_runs_each_trial_as_a_run_on_the_host_and_marks_the_best(
    th6: testhosts.Host, tmp_path: Path
) -> None:
    config = yaml.safe_load((REPO / "trainer/configs/digits.yaml").read_text())
    config.update(steps=40, log_every_steps=10, render_plots=False, price_per_hour=0.9)  # each trial priced
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))
    inventory = write_inventory(tmp_path / "inventory.yml", {"th6": host_vars(th6)})
    forja = Forja(project_dir=tmp_path, inventory=inventory, private_data_dir=tmp_path / "runner",
                  host_key_checking=False, history=History(tmp_path / "history.sqlite"), send_project=False)

    report = forja.sweep(tmp_path / "tiny.yaml", space=REPO / "examples/sweep/space.yaml", trials=2,
                         name="sweep-hosts", prune=False, poll_s=2)

    assert [(row.run, row.state) for row in report.trials] == [
        ("sweep-hosts-t000", "complete"), ("sweep-hosts-t001", "complete")]
    assert all(row.values and row.values[0] > 0 for row in report.trials)
    assert {r.run_id: r.status for r in forja.runs()} == {
        "sweep-hosts-t000": "completed", "sweep-hosts-t001": "completed"}
    for row in report.trials:  # each trial costs what its run costs, settled once: where it was fetched
        assert row.cost_usd is not None and row.cost_usd == forja.history.get(row.run).cost_usd, row
        assert [e.kind for e in forja.history.events(row.run)].count(SETTLED_EVENT) == 1
    best = json.loads((Path(report.folder) / "best.json").read_text())
    assert best[0]["run"] in report.best_runs and Path(best[0]["model"]).is_dir()
