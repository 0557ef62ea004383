"""The ansible-runner facade, run for real against the controller itself (connection: local)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from forja import errors, runner
from forja import events as ev

PLAYBOOK = str(Path(__file__).with_name("playbooks") / "local_echo.yml")
INVENTORY = str(Path(__file__).with_name("playbooks") / "local_inventory.yml")
SECRET = "s3cret-token-value-1234"


def request(tmp_path: Path, **extravars: object) -> runner.PlaybookRun:
    """A run on the controller itself (connection: local), so host keys never come into play."""
    return runner.PlaybookRun(
        playbook=PLAYBOOK,
        inventory=INVENTORY,
        extravars={"forja_test_out": str(tmp_path / "out.txt"), **extravars},
        private_data_dir=tmp_path / "pdd",
    )


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> tuple[runner.RunResult, list[ev.Event], Path]:
    """One successful run (with a secret greeting) that several tests read, to keep the suite fast."""
    tmp_path = tmp_path_factory.mktemp("runner")
    seen: list[ev.Event] = []
    result = runner.run(request(tmp_path, forja_test_greeting=SECRET), on_event=seen.append)
    return result, seen, tmp_path


def test_a_successful_run_reports_per_host_stats_and_changed_tasks(done: tuple) -> None:
    result, _, tmp_path = done
    assert result.ok and result.status == "successful" and result.rc == 0
    assert result.stats["localhost"].changed == 1
    assert result.stats["localhost"].failures == 0
    assert [t.task for t in result.changed_tasks] == ["Write a file with the greeting"]
    assert (tmp_path / "out.txt").read_text() == SECRET + "\n"
    assert result.artifact_dir is not None and result.artifact_dir.is_dir()


def test_events_arrive_typed_and_in_order(done: tuple) -> None:
    _, seen, _ = done
    kinds = [type(e) for e in seen]
    assert kinds[0] is ev.PlaybookStarted
    assert kinds[-1] is ev.PlaybookFinished
    assert ev.TaskStarted in kinds and ev.TaskChanged in kinds
    counters = [e.counter for e in seen]
    assert counters == sorted(counters)


def test_a_failing_task_raises_playbook_failed_with_host_task_and_message(tmp_path: Path) -> None:
    result = runner.run(request(tmp_path, forja_test_fail=True, forja_test_reason="disk full"))
    assert not result.ok
    with pytest.raises(errors.PlaybookFailed) as info:
        result.raise_for_status()
    assert info.value.host == "localhost"
    assert info.value.task == "Fail when told to"
    assert "disk full" in info.value.detail
    assert info.value.exit_code == errors.ExitCode.PLAYBOOK_FAILED


def test_secrets_in_extravars_never_reach_the_command_line_or_artifacts(done: tuple) -> None:
    result, _, tmp_path = done
    pdd = tmp_path / "pdd"
    assert not (pdd / "env" / "extravars").exists()
    for path in pdd.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), f"secret leaked into {path}"
    command = json.loads((result.artifact_dir / "command").read_text())
    assert SECRET not in " ".join(command["command"])


def test_host_key_checking_is_passed_explicitly_both_ways(done: tuple, tmp_path: Path) -> None:
    checked = json.loads((done[0].artifact_dir / "command").read_text())["env"]
    assert checked["ANSIBLE_HOST_KEY_CHECKING"] == "True"  # PlaybookRun's default, unlike runner's
    req = runner.PlaybookRun(
        playbook=PLAYBOOK, inventory=INVENTORY, extravars={"forja_test_out": str(tmp_path / "o")},
        host_key_checking=False, private_data_dir=tmp_path / "pdd",
    )
    unchecked = json.loads((runner.run(req).artifact_dir / "command").read_text())["env"]
    assert unchecked["ANSIBLE_HOST_KEY_CHECKING"] == "False"


def test_artifact_folders_are_rotated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "KEEP_ARTIFACTS", 1)
    for _ in range(2):
        runner.run(request(tmp_path))
    assert len([p for p in (tmp_path / "pdd" / "artifacts").iterdir() if p.is_dir()]) == 1


@pytest.mark.slow  # 7 s or more: the host tier's CPU lane, not make check
def test_rotation_spares_the_folder_of_a_play_still_running(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A long play (a watcher's configure) must not lose its folder to the short polls beside it."""
    monkeypatch.setattr(runner, "KEEP_ARTIFACTS", 1)
    running = tmp_path / "pdd" / "artifacts" / "20000101T000000-configure-000000"
    running.mkdir(parents=True)
    os.utime(running, (0, 0))  # the oldest of all, and no status file yet
    for _ in range(2):
        runner.run(request(tmp_path))
    left = sorted(p.name for p in running.parent.iterdir() if p.is_dir())
    assert len(left) == 2 and running.name in left


def test_cancelling_stops_the_run_and_raises_cancelled(tmp_path: Path) -> None:
    stop = threading.Event()

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.TaskStarted) and event.task == "Wait a while when told to":
            stop.set()

    result = runner.run(request(tmp_path, forja_test_sleep=60), on_event=on_event, cancel=stop)
    assert result.status == "canceled"
    assert result.duration_s < 50
    with pytest.raises(errors.Cancelled):
        result.raise_for_status()


def test_iter_events_yields_events_then_the_result(tmp_path: Path) -> None:
    items = list(runner.iter_events(request(tmp_path)))
    assert isinstance(items[-1], runner.RunResult) and items[-1].ok
    assert any(isinstance(i, ev.TaskChanged) for i in items)


def test_a_stream_cancelled_stops_its_own_run_and_no_other(tmp_path: Path) -> None:
    slow = runner.iter_events(request(tmp_path / "slow", forja_test_sleep=60))
    quick = runner.iter_events(request(tmp_path / "quick"))
    for item in slow:
        if isinstance(item, ev.TaskStarted) and item.task == "Wait a while when told to":
            slow.cancel()
        last = item
    assert isinstance(last, runner.RunResult) and last.status == "canceled"
    assert last.duration_s < 50
    assert quick.result().ok


def test_leaving_a_stream_early_cancels_its_run(tmp_path: Path) -> None:
    stream = runner.iter_events(request(tmp_path, forja_test_sleep=60))
    started = time.monotonic()
    for item in stream:
        if isinstance(item, ev.TaskStarted) and item.task == "Wait a while when told to":
            break
    assert stream.cancelled.is_set()
    assert time.monotonic() - started < 50, "break waited for the run to be cancelled, not to end"


def test_a_missing_playbook_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError) as info:
        runner.run(runner.PlaybookRun(playbook="no-such-playbook.yml", host_key_checking=False))
    assert info.value.field == "playbook"
    assert "no-such-playbook.yml" in info.value.message


def test_a_play_ansible_cannot_parse_is_named_with_ansibles_own_error(tmp_path: Path) -> None:
    """No task ran, so no task failed: the error is what ansible-playbook said, not a bare exit code."""
    broken = tmp_path / "broken.yml"
    broken.write_text("- hosts: localhost\n  tasks:\n    - name: Use a module that does not exist\n"
                      "      forja.gpu.no_such_module: {}\n")
    result = runner.run(runner.PlaybookRun(playbook=str(broken), inventory=INVENTORY,
                                           private_data_dir=tmp_path / "pdd"))
    assert not result.ok and result.failed_tasks == []
    with pytest.raises(errors.PlaybookFailed) as info:
        result.raise_for_status()
    said = str(info.value)
    assert said.startswith("broken.yml: "), said  # the cause first, in Ansible's words
    assert said.endswith(" (ansible-playbook exited with 4)"), said
    assert "no_such_module" in said and "[ERROR]" not in said, said
    assert "task '" not in said


def test_forja_from_an_unactivated_venv_runs_the_venvs_ansible(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`.venv/bin/forja` without `source .venv/bin/activate`: PATH has no ansible-playbook at all."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    result = runner.run(request(tmp_path))
    assert result.ok, result.output_tail
    assert (tmp_path / "out.txt").exists()


def test_no_parsed_inventory_is_said_with_the_first_sources_reason(tmp_path: Path) -> None:
    """An inventory plugin that failed (the sandbox's emulator down): its reason, not only Ansible's
    "Completely failed to parse inventory source" (fatal: runner.STRICT_INVENTORY)."""
    pdd = tmp_path / "pdd"
    (pdd / "inventory").mkdir(parents=True)
    source = pdd / "inventory" / "down.gcp_gpu.yml"
    source.write_text("plugin: forja.gpu.gcp_gpu\nprojects: [forja-sandbox]\n"
                      "service_account_file: /nonexistent/key.json\nauth_kind: serviceaccount\n")
    result = runner.run(runner.PlaybookRun(playbook=PLAYBOOK, inventory=str(source), private_data_dir=pdd))
    assert f"Completely failed to parse inventory source {source}" in result.output_tail
    with pytest.raises(errors.ConfigError) as info:  # exit 2: the file, then the plugin's own reason
        result.raise_for_status()
    said = str(info.value)
    assert said.startswith(f"inventory {source}: 'service_account_file' is not an option of "
                           "forja.gpu.gcp_gpu"), said
    assert "Incorrect plugin name" not in said and "ansible_collections" not in said, said
