"""The data contract read typed: what a role publishes, what forja refuses, what it shows people."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forja import contract
from forja import events as ev
from forja.errors import ConfigError

STATE = {"forja_train_state": 1, "run": "digits", "status": "completed", "node_rank": 0,
         "last": {"step": 300, "loss": 0.05}, "summary": {"steps": 300, "final_loss": 0.05}}
JUPYTER = {"port": 9999, "tunnel_command": "ssh -N -L 9999:127.0.0.1:9999 -i '/keys/my key' me@10.0.0.7",
           "colab_url_template": "http://localhost:9999/?token=<token>",
           "token_file": "/var/lib/forja/jupyter/token", "local_token_file": ""}


def test_runs_come_back_per_host_in_host_order_and_non_states_are_left_out() -> None:
    published = {"forja": {"th7": {"contract_version": 1, "runs": [STATE]},
                           "th6": {"contract_version": 1, "runs": [STATE, {}, {"not": "a state"}]}}}
    runs = contract.read_stats(published).runs
    assert [(host, s.run, s.step) for host, s in runs] == [("th6", "digits", 300), ("th7", "digits", 300)]


def test_nothing_published_reads_as_no_hosts() -> None:
    assert contract.read_stats({}).hosts == {}


def test_a_newer_contract_is_refused_naming_the_host_and_the_fix() -> None:
    with pytest.raises(contract.ContractError) as info:
        contract.read_stats({"forja": {"th6": {"contract_version": 2, "runs": []}}})
    assert info.value.host == "th6" and "upgrade forja" in info.value.message


def test_a_malformed_connection_names_the_field() -> None:
    bad = {"forja": {"th6": {"contract_version": 1, "jupyter": {**JUPYTER, "port": 0}}}}
    with pytest.raises(contract.ContractError) as info:
        contract.read_stats(bad)
    assert "jupyter.port" in info.value.message


def test_the_tunnel_command_is_split_as_the_shell_would() -> None:
    conn = contract.read_stats({"forja": {"th6": {"contract_version": 1, "jupyter": JUPYTER}}}).jupyter["th6"]
    assert conn.argv[-3:] == ["-i", "/keys/my key", "me@10.0.0.7"]


def test_the_colab_url_carries_the_token_only_when_asked_and_copied_here(tmp_path: Path) -> None:
    token = tmp_path / "th6.jupyter-token"
    token.write_text("abc123")
    conn = contract.JupyterConnection.model_validate({**JUPYTER, "local_token_file": str(token)})
    assert conn.colab_url() == "http://localhost:9999/?token=<token>"
    assert conn.colab_url(show_token=True) == "http://localhost:9999/?token=abc123"
    plan = conn.plan("th6", show_token=False)
    assert (plan.local_port, plan.remote_port, plan.token_file) == (9999, 9999, str(token))


def test_a_local_port_other_than_the_served_one_is_refused() -> None:
    conn = contract.JupyterConnection.model_validate(JUPYTER)
    with pytest.raises(ConfigError) as info:
        conn.plan("th6", local_port=8888)
    assert info.value.field == "--local-port"


def _ok(res: dict, task: str) -> list[ev.Event]:
    return ev.from_runner({"event": "runner_on_ok", "counter": 3, "stdout": "",
                           "event_data": {"host": "th6", "task": task, "res": res}})


def test_an_announcement_is_recognised_by_its_result_key_whatever_the_task_is_called() -> None:
    ok, announced = _ok({"trainer_run_announcement": "Sending 3 files", "changed": False}, "Renamed: any")
    assert isinstance(ok, ev.TaskOk)
    assert isinstance(announced, ev.Announcement)
    assert (announced.host, announced.text) == ("th6", "Sending 3 files")


def test_a_debug_message_without_the_key_is_not_announced() -> None:
    assert [type(e) for e in _ok({"msg": "Show what will be sent"}, "Show what will be sent")] == [ev.TaskOk]


def test_the_recap_hands_over_the_published_facts() -> None:
    published = {"forja": {"th6": {"contract_version": 1, "runs": [STATE]}}}
    data = {"ok": {"th6": 1}, "artifact_data": json.loads(json.dumps(published))}
    (done,) = ev.from_runner({"event": "playbook_on_stats", "counter": 9, "event_data": data})
    assert isinstance(done, ev.PlaybookFinished)
    assert done.published.runs[0][1].status == "completed"
