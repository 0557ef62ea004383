"""The managed-run watcher's policy (forja.managed.decide) as a table, its budget and its lock.

The policy is one pure function of what the watcher observed, so every row here is a real input
and a real answer; the loop that acts on it is exercised on the sandbox.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from forja import errors
from forja.contract import InstanceState
from forja.managed import (
    RecoveryBudget,
    Tally,
    WatchError,
    WatchState,
    decide,
    seconds,
    start_state,
    watch_lock,
    zone_order,
)

ZONES = ("us-east1-d", "us-east1-b", "us-central1-a")
RUNNING = InstanceState(exists=True, zone="us-east1-d", status="RUNNING", spot=True)
PREEMPTED = InstanceState(exists=True, zone="us-east1-d", status="TERMINATED", spot=True,
                          preempted_at="2026-11-24T10:00:00Z", preemptions=["2026-11-24T10:00:00Z"])
STOPPED = InstanceState(exists=True, zone="us-east1-d", status="TERMINATED", spot=True,
                        preemptions=["2026-11-20T10:00:00Z"])
GONE = InstanceState(exists=False)


@pytest.mark.parametrize(
    ("vm", "run", "tally", "action", "zones"),
    [
        (RUNNING, "running", Tally(), "watch", ()),
        (RUNNING, "completed", Tally(), "done", ()),
        (PREEMPTED, "failed", Tally(), "done", ()),
        (InstanceState(exists=True, zone="us-east1-d", status="STAGING"), None, Tally(), "watch", ()),
        (STOPPED, "running", Tally(), "done", ()),  # stopped by its user or autostop: not undone
        (PREEMPTED, "running", Tally(), "restart", ("us-east1-d",)),
        # the zone just ran out: go elsewhere, the failed zone last
        (PREEMPTED, "running", Tally(failed_zones=("us-east1-d",)), "move",
         ("us-east1-b", "us-central1-a", "us-east1-d")),
        # a Spot VM deleted on preemption: its own zone is the last resort
        (GONE, "running", Tally(), "move", ("us-east1-b", "us-central1-a", "us-east1-d")),
        (PREEMPTED, "running", Tally(recoveries=10), "give_up", ()),
        (PREEMPTED, "running", Tally(down_s=7 * 3600), "give_up", ()),
        (RUNNING, "running", Tally(recoveries=10), "watch", ()),  # a spent budget stops nothing that runs
    ],
)
def test_the_watcher_decides_from_what_it_sees(vm, run, tally, action, zones):
    decision = decide(vm, run, tally, RecoveryBudget(), ZONES)
    assert decision.action == action, decision.reason
    assert decision.zones == zones


def test_a_zone_that_failed_is_tried_only_when_nothing_else_is_left():
    assert zone_order(ZONES, ()) == ZONES
    assert zone_order(ZONES, ("us-east1-b",)) == ("us-east1-d", "us-central1-a", "us-east1-b")
    # the most recent failure goes last
    assert zone_order(ZONES, ("us-east1-d", "us-east1-b")) == ("us-central1-a", "us-east1-d", "us-east1-b")
    assert zone_order(("us-east1-d",), ("us-east1-d",)) == ("us-east1-d",)


def test_giving_up_says_which_limit_was_spent():
    spent = decide(PREEMPTED, "running", Tally(down_usd=2.5), RecoveryBudget(max_down_usd=2.0), ZONES)
    assert spent.action == "give_up" and "--max-down-usd" in spent.reason and "$2.50" in spent.reason
    spent = decide(PREEMPTED, "running", Tally(recoveries=3), RecoveryBudget(max_recoveries=3), ZONES)
    assert "--max-recoveries 3" in spent.reason


@pytest.mark.parametrize(
    ("budget", "option"),
    [(RecoveryBudget(max_recoveries=0), "--max-recoveries"), (RecoveryBudget(max_down_s=0), "--max-down"),
     (RecoveryBudget(max_down_usd=0.0), "--max-down-usd")],
)
def test_a_budget_used_up_before_it_starts_is_refused_naming_the_option(budget, option):
    with pytest.raises(errors.ConfigError) as caught:
        budget.check()
    assert caught.value.field == option


def test_durations_read_as_people_write_them():
    written = ("90", "90s", "45m", "6h", "2d")
    assert [seconds(t, "--max-down") for t in written] == [90, 90, 2700, 21600, 172800]
    with pytest.raises(errors.ConfigError, match="--max-down: 'soon' is not a duration"):
        seconds("soon", "--max-down")


def test_a_fallback_list_of_only_the_current_zone_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("FORJA_HOME", str(tmp_path))
    with pytest.raises(errors.ConfigError) as caught:
        start_state("digits-1", ["us-east1-d", "us-east1-d"])
    assert caught.value.field == "--fallback-zone" and "us-east1-b" in str(caught.value)
    assert not (tmp_path / "watch").exists()  # nothing was written


def test_a_watcher_started_again_keeps_what_the_run_spent(tmp_path, monkeypatch):
    monkeypatch.setenv("FORJA_HOME", str(tmp_path))
    state = start_state("digits-1", ["us-east1-d", "us-east1-b"], {"config": "digits.yaml"})
    state.tally = Tally(recoveries=2, down_s=120.0, failed_zones=("us-east1-d",))
    state.save()
    again = start_state("digits-1", ["us-east1-d", "us-central1-a"])
    assert again.tally == state.tally and again.train == {"config": "digits.yaml"}
    assert again.zones == ["us-east1-d", "us-central1-a"]
    assert WatchState.load("digits-1") == state
    # the same name sent again is a new run: a new tally
    assert start_state("digits-1", ["us-east1-d", "us-east1-b"], {"config": "digits.yaml"}).tally == Tally()


def test_a_second_watcher_of_a_run_refuses_naming_the_first(tmp_path, monkeypatch):
    monkeypatch.setenv("FORJA_HOME", str(tmp_path))
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom forja.managed import watch_lock\n"
         "with watch_lock('digits-1'):\n    print('held', flush=True)\n    time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "FORJA_HOME": str(tmp_path)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refused = rf"run 'digits-1' is already watched \(pid {holder.pid} since"
        with pytest.raises(WatchError, match=refused), watch_lock("digits-1"):
            pass
        with watch_lock("digits-2"):  # another run is watched freely
            pass
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while True:  # the lock dies with its holder: a new watcher may start at once
        try:
            with watch_lock("digits-1"):
                break
        except WatchError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
