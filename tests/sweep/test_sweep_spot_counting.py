"""The sweep's loop counts a preemption once, however many looks it spans: a VM still going down (or
coming back) answers "preempted" on look after look, and only the look whose recovery brought the
trial back is a recovery. Past --max-recoveries a new preemption fails the trial with why.

The runner here plays what a VM's looks answer (the TrialRunner seam, forja.sweep_runners): the
loop's own policy is what is tested, through real Optuna; the VMs' side is the managed watcher's
(tests/managed) and the host tier's."""

from __future__ import annotations

from pathlib import Path

import optuna
from sweep_played import Played, tiny_spec

from forja.sweep import Driver, open_study
from forja.sweep_runners import WAIT, Look, Recovery

DONE = Look("completed", 30, summary={"eval_loss": 0.5})
RUNS = Look("running", 10)
DOWN = Look("preempted")


def test_a_preemption_is_one_recovery_however_many_looks_it_spans_and_past_the_most_the_trial_fails(
    tmp_path: Path,
) -> None:
    spec = tiny_spec(tmp_path, "spot", trials=2, max_recoveries=1, prune=False)
    played = Played(
        looks={0: [RUNS, DOWN, DOWN, DOWN, RUNS, DONE],  # down three looks: the VM going down, then back
               1: [RUNS, DOWN, RUNS, DOWN]},  # brought back once, then preempted again: past the most
        recoveries={0: [WAIT, WAIT, Recovery(resumed=True)], 1: [Recovery(resumed=True)]},
    )
    said: list[str] = []
    study = open_study(spec, create=True)

    Driver(spec, study, played, session=None, poll_s=0, say=said.append, sleep=lambda _: None).run()

    first, second = study.get_trials()
    assert first.state == optuna.trial.TrialState.COMPLETE and first.user_attrs["recoveries"] == 1, said
    assert said.count("spot-t000: preempted; waiting for its VM") == 1
    assert second.state == optuna.trial.TrialState.FAIL and second.user_attrs["recoveries"] == 1
    assert "preempted again after 1 recoveries, the most (--max-recoveries 1)" in second.user_attrs["reason"]
    assert played.asked_to_recover == ["spot-t000"] * 3 + ["spot-t001"]
