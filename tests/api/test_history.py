"""The run history: a real SQLite file in a temporary FORJA_HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from forja import errors, runstate
from forja.history import History


@pytest.fixture
def history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> History:
    monkeypatch.setenv("FORJA_HOME", str(tmp_path))
    return History()


def test_the_database_lives_in_forja_home(history: History, tmp_path: Path) -> None:
    assert history.path == tmp_path / "history.sqlite"
    assert history.path.is_file()


def test_a_run_is_recorded_as_running_before_it_starts(history: History) -> None:
    rec = history.start("digits-1", name="digits-1", hosts=["th6"], config_path="/c.yaml", config_hash="abc")
    assert rec.status == "running" and rec.hosts == ["th6"] and rec.ended_at is None
    assert [e.kind for e in history.events("digits-1")] == ["started"]


def test_update_sets_the_result_columns(history: History) -> None:
    history.start("r1", name="r1")
    rec = history.update("r1", status="completed", steps=300, last_loss=0.05, cost_usd=0.01,
                         artifact_dir="/x")
    assert (rec.status, rec.steps, rec.last_loss, rec.cost_usd, rec.artifact_dir) == (
        "completed", 300, 0.05, 0.01, "/x"
    )


def test_a_preemption_event_counts_and_adds_lost_steps(history: History) -> None:
    history.start("r1", name="r1")
    history.record_event("r1", "preempted", lost_steps=7, zone="us-east1-d")
    history.record_event("r1", "preempted", lost_steps=3)
    rec = history.get("r1")
    assert rec.preemptions == 2 and rec.lost_steps == 10
    assert history.events("r1")[1].data == {"lost_steps": 7, "zone": "us-east1-d"}


def test_unknown_columns_and_statuses_are_refused_by_name(history: History) -> None:
    history.start("r1", name="r1")
    with pytest.raises(errors.ConfigError) as info:
        history.update("r1", colour="red")
    assert info.value.field == "colour"
    with pytest.raises(errors.ConfigError) as info:
        history.update("r1", status="exploded")
    assert info.value.field == "status"
    assert history.get("r1").status == "running"


def test_unknown_runs_raise_run_not_found(history: History) -> None:
    with pytest.raises(errors.RunNotFound):
        history.update("nope", status="failed")
    with pytest.raises(errors.RunNotFound):
        history.record_event("nope", "preempted")
    with pytest.raises(errors.RunNotFound):
        history.find("nope")


def test_list_is_newest_first_and_filters_by_status(history: History) -> None:
    for i in range(3):
        history.start(f"r{i}", name=f"r{i}")
    history.update("r1", status="failed")
    assert [r.run_id for r in history.list()] == ["r2", "r1", "r0"]
    assert [r.run_id for r in history.list(status="failed")] == ["r1"]
    assert [r.run_id for r in history.list(limit=1)] == ["r2"]


def test_two_history_objects_share_one_file(history: History) -> None:
    history.start("r1", name="r1")
    other = History(history.path)
    other.update("r1", status="preempted")
    assert history.get("r1").status == "preempted"


def host_state(**fields: object) -> runstate.RunState:
    doc = {"forja_train_state": 1, "run": "digits", "status": "completed", "node_rank": 0,
           "configured_at": "2026-11-20T08:00:00+00:00",
           "summary": {"steps": 300, "final_loss": 0.05, "cost_usd": 0.01}, **fields}
    state = runstate.parse(json.dumps(doc))
    assert state is not None
    return state


def test_a_run_started_outside_forja_is_added_from_its_host_state(history: History) -> None:
    assert history.record_host_run(host_state(), hosts=["forja-l4"], config_path="/c/digits.yaml")
    record = history.get("digits")
    assert (record.status, record.steps, record.last_loss) == ("completed", 300, 0.05)
    assert record.hosts == ["forja-l4"]
    assert record.started_at == "2026-11-20T08:00:00+00:00", "its start is when the host set it up"
    assert record.ended_at and [e.kind for e in history.events("digits")] == ["discovered"]


def test_recording_the_same_host_state_again_changes_nothing(history: History) -> None:
    history.record_host_run(host_state(), hosts=["forja-l4"])
    assert not history.record_host_run(host_state(), hosts=["forja-l4"])


def test_a_running_host_never_overwrites_what_forja_decided(history: History) -> None:
    history.start("digits", name="digits")
    history.update("digits", status="cancelled")
    assert not history.record_host_run(host_state(status="running", summary=None), hosts=["th6"])
    assert history.get("digits").status == "cancelled"
    assert history.record_host_run(host_state(), hosts=["th6"])
    assert history.get("digits").status == "completed"


def test_the_train_playbook_s_record_command_adds_then_leaves_a_run(tmp_path: Path) -> None:
    env = {**os.environ, "FORJA_HOME": str(tmp_path / "cli-home")}
    state = json.dumps(host_state().model_dump(by_alias=True))
    argv = [sys.executable, "-m", "forja.record", "--state", state, "--hosts", "th6"]
    first = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    second = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    said = (first.stdout.splitlines()[0], second.stdout.splitlines()[0])  # then the cost line (tests/cost)
    assert said == ("changed", "unchanged")
    assert History(tmp_path / "cli-home" / "history.sqlite").get("digits").status == "completed"


def test_the_record_command_refuses_a_document_without_the_state_schema(tmp_path: Path) -> None:
    env = {**os.environ, "FORJA_HOME": str(tmp_path / "cli-home")}
    argv = [sys.executable, "-m", "forja.record", "--state", '{"run": "x", "status": "completed"}']
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "forja_train_state" in proc.stderr



# --- One id, one run or two: when a run started ------------------------------------------------------
#: The host set the run up long before this test ran (host_state's configured_at).
SET_UP = "2026-11-20T08:00:00+00:00"


def later_than_now(hours: int = 1) -> str:
    return (datetime.now(timezone.utc) + timedelta(hours=hours)).isoformat(timespec="seconds")


def test_sending_a_run_again_before_it_ended_keeps_its_first_start(history: History) -> None:
    history.record_host_run(host_state(status="running", summary=None), hosts=["th6"])
    again = history.start("digits", name="digits", hosts=["th6"], config_path="/c/digits.yaml")
    assert again.started_at == SET_UP and again.status == "running"
    assert [e.kind for e in history.events("digits")] == ["discovered", "started"]


def test_a_new_run_under_the_name_of_an_ended_one_starts_now_with_no_old_results(history: History) -> None:
    history.record_host_run(host_state(), hosts=["th6"])
    history.record_event("digits", "preempted", lost_steps=7)
    new = history.start("digits", name="digits", hosts=["th6"])
    assert new.started_at > SET_UP and new.started_at[:10] == datetime.now(timezone.utc).date().isoformat()
    assert (new.status, new.ended_at) == ("running", None)
    assert (new.steps, new.last_loss, new.cost_usd) == (None, None, None)
    assert (new.preemptions, new.lost_steps) == (0, 0)


def test_the_host_reporting_a_forja_run_keeps_the_start_forja_recorded(history: History) -> None:
    """forja records the start before the play; the host sets the run up later: still the same run."""
    started = history.start("digits", name="digits", hosts=["th6"]).started_at
    assert history.record_host_run(host_state(configured_at=later_than_now()), hosts=["th6"])
    record = history.get("digits")
    assert record.started_at == started and (record.status, record.steps) == ("completed", 300)


def test_a_run_the_host_set_up_after_the_recorded_one_ended_is_a_new_run(history: History) -> None:
    history.record_host_run(host_state(), hosts=["th6"])
    history.update("digits", ended_at="2026-11-20T09:00:00+00:00")
    set_up_again = "2026-11-21T08:00:00+00:00"
    new = host_state(configured_at=set_up_again, summary={"steps": 10, "final_loss": 1.5, "cost_usd": 0.001})
    assert history.record_host_run(new, hosts=["th7"])
    record = history.get("digits")
    assert (record.started_at, record.steps, record.last_loss) == (set_up_again, 10, 1.5)
    assert record.hosts == ["th7"] and record.ended_at is not None
    assert not history.record_host_run(new, hosts=["th7"]), "the same report again is the same run"
