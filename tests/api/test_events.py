"""Runner event dicts (as ansible-runner 2.4 writes them) become typed events."""

from __future__ import annotations

import json

from forja import events as ev


def raw(kind: str, counter: int = 1, stdout: str = "", **event_data: object) -> dict:
    return {"event": kind, "counter": counter, "stdout": stdout, "event_data": event_data}


def test_a_changed_result_is_task_changed_and_an_unchanged_one_task_ok() -> None:
    (changed,) = ev.from_runner(raw("runner_on_ok", host="th6", task="Copy", res={"changed": True}))
    (ok,) = ev.from_runner(raw("runner_on_ok", host="th6", task="Copy", res={"changed": False}))
    assert type(changed) is ev.TaskChanged and changed.host == "th6"
    assert type(ok) is ev.TaskOk


def test_a_censored_result_is_judged_by_ansibles_own_line() -> None:
    censored = {"censored": "the output has been hidden"}
    (e,) = ev.from_runner(raw("runner_on_ok", stdout="changed: [th6]", host="th6", task="T", res=censored))
    assert type(e) is ev.TaskChanged


def test_a_failure_carries_the_most_useful_message() -> None:
    res = {"msg": "non-zero return code", "stderr": "No space left on device", "rc": 1}
    (e,) = ev.from_runner(raw("runner_on_failed", host="th6", task="Install", res=res, ignore_errors=None))
    assert isinstance(e, ev.TaskFailed)
    assert e.message == "non-zero return code: No space left on device"
    assert not e.ignored


def test_an_unreachable_host_is_its_own_event() -> None:
    res = {"msg": "Failed to connect to the host via ssh: Connection refused", "unreachable": True}
    (e,) = ev.from_runner(raw("runner_on_unreachable", host="th9", task="Gathering Facts", res=res))
    assert isinstance(e, ev.HostUnreachable)
    assert e.host == "th9" and "Connection refused" in e.message


STATE = {"forja_train_state": 1, "run": "digits-1", "status": "running", "total_steps": 300,
         "last": {"step": 120, "loss": 0.31, "lr": 0.002}}


def test_a_poll_that_returns_a_run_state_also_yields_train_progress() -> None:
    res = {"attempts": 4, "retries": 720, "stdout": json.dumps(STATE)}
    retry, progress = ev.from_runner(raw("runner_retry", host="th6", task="Any wording", res=res))
    assert isinstance(retry, ev.TaskRetry) and retry.attempt == 4
    assert isinstance(progress, ev.TrainProgress)
    assert (progress.run, progress.step, progress.total_steps, progress.loss) == ("digits-1", 120, 300, 0.31)


def test_the_last_poll_of_a_run_is_progress_too() -> None:
    done = {**STATE, "status": "completed", "last": {"step": 300, "loss": 0.05}}
    ok, progress = ev.from_runner(raw("runner_on_ok", host="th6", task="T", res={"stdout": json.dumps(done)}))
    assert isinstance(ok, ev.TaskOk) and isinstance(progress, ev.TrainProgress)
    assert (progress.status, progress.step) == ("completed", 300)


def test_json_without_the_state_schema_key_is_not_progress() -> None:
    unversioned = {k: v for k, v in STATE.items() if k != "forja_train_state"}
    res = {"attempts": 1, "retries": 3, "stdout": json.dumps(unversioned)}
    events = ev.from_runner(raw("runner_retry", host="h", task="Install PyTorch", res=res))
    assert [type(e) for e in events] == [ev.TaskRetry]


def test_the_recap_carries_what_the_roles_published_with_set_stats() -> None:
    published = {"forja": {"th6": {"contract_version": 1, "runs": [STATE]}}}
    (e,) = ev.from_runner(raw("playbook_on_stats", ok={"th6": 3}, artifact_data=published))
    assert isinstance(e, ev.PlaybookFinished) and e.artifact_data == published


def test_the_recap_becomes_playbook_finished_with_stats() -> None:
    (e,) = ev.from_runner(raw("playbook_on_stats", ok={"th6": 5}, changed={"th6": 2}, dark={}, failures={}))
    assert isinstance(e, ev.PlaybookFinished)
    assert e.stats["ok"] == {"th6": 5} and e.stats["dark"] == {}


def test_unknown_event_kinds_are_ignored() -> None:
    assert ev.from_runner(raw("verbose", stdout="something")) == []
