"""A sweep counts each trial at its run's cost, settled as it ends (what `forja runs` shows), and a
trial not settled yet at the trainer's own count so far, a floor; `forja sweep status` marks those.

The runner here plays what the runs' looks answer (the TrialRunner seam, forja.sweep_runners): the
loop's budget and the status table are what is tested, through real Optuna and the real CLI; the
runners' side (settling each run at its end) is proven by the local sweep's real trainer runs
(test_sweep_local.py) and on the host tier."""

from __future__ import annotations

from pathlib import Path

from sweep_played import Played, tiny_spec
from typer.testing import CliRunner

from forja.cli import app
from forja.sweep import Driver, open_study
from forja.sweep_runners import Look


def test_the_budget_counts_each_run_s_settled_cost_and_the_trainer_s_count_only_until_then(
    tmp_path: Path,
) -> None:
    spec = tiny_spec(tmp_path, "costs", trials=4, parallel=2, max_usd=1.0, prune=False)
    done = {"eval_loss": 0.5}
    played = Played(slots=2, looks={
        # ended and settled: $0.70, of which the trainer counted $0.40
        0: [Look("completed", 30, summary=done, training_usd=0.40, cost_usd=0.70)],
        # still training ($0.35 so far by the trainer's count), then ended with no rate known
        1: [Look("running", 10, training_usd=0.35), Look("completed", 30, summary=done, training_usd=0.50)],
    })
    said: list[str] = []

    report = Driver(spec, open_study(spec, create=True), played, session=None, poll_s=0, say=said.append,
                    sleep=lambda _: None).run()

    # $0.70 settled + $0.35 floor: over $1 after the first look; the trainer's $0.75 would have sent more
    assert "--max-usd $1.00 reached ($1.05 spent)" in (report.stopped or ""), said
    assert [(row.cost_usd, row.training_usd) for row in report.trials] == [(0.70, 0.40), (None, 0.50)]
    assert report.spent_usd == 0.70 + 0.50 and report.unsettled == 1

    shown = CliRunner().invoke(app, ["sweep", "status", "costs"], env={"COLUMNS": "240"})
    assert shown.exit_code == 0, shown.output
    (first,) = [line for line in shown.output.splitlines() if "costs-t000" in line]
    (second,) = [line for line in shown.output.splitlines() if "costs-t001" in line]
    assert "$0.70" in first and "$0.40" not in first
    assert "≥$0.50 training so far" in second
    assert "≥ marks one not settled yet" in " ".join(shown.output.split()), shown.output
