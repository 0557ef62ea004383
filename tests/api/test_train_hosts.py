"""Training through the API on a real test host (th6): real playbooks, real SSH, the real trainer.

Host-key checking is turned off explicitly: the test hosts are throwaway containers that all
share one generated host key (see forja_sandbox/testhosts.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from apihosts import REPO, host_vars, ssh, write_inventory

from forja import errors
from forja import events as ev
from forja.api import Forja
from forja.history import History
from forja_sandbox import testhosts
from trainer import run_folder

# The first test pays for booting th6 and building its trainer environment on the image's PyTorch.
pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.timeout(2400)]
DIGITS = REPO / "trainer" / "configs" / "digits.yaml"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("api")


@pytest.fixture(scope="module")
def forja(th6: testhosts.Host, workspace: Path) -> Forja:
    project = workspace / "project"
    (project / "mypkg").mkdir(parents=True)
    (project / "mypkg" / "__init__.py").write_text("X = 1\n")
    (project / ".env").write_text("TOKEN=do-not-send\n")
    inventory = write_inventory(workspace / "inventory.yml", {"th6": host_vars(th6)})
    return Forja(
        project_dir=project,
        inventory=inventory,
        private_data_dir=workspace / "runner",
        host_key_checking=False,
        history=History(workspace / "history.sqlite"),
    )


#: A staged dataset the run is told to remove once it completed (--delete-data-after, as the role takes it).
STAGED = "/var/lib/forja/data/api-demo"


@pytest.fixture(scope="module")
def trained(forja: Forja, th6: testhosts.Host) -> tuple[object, list[ev.Event]]:
    seen: list[ev.Event] = []
    ssh(th6, f"sudo mkdir -p {STAGED} && echo x | sudo tee {STAGED}/part-0 >/dev/null")
    result = forja.train(DIGITS, name="digits-api", poll_s=1, on_event=seen.append,
                         extravars={"trainer_run_delete_data": STAGED})
    return result, seen


def test_training_the_digits_demo_brings_back_metrics_plots_and_summary(trained: tuple) -> None:
    result, _ = trained
    assert result.status == "completed"
    assert result.hosts == ["th6"]
    assert result.summary["steps"] == 300 and result.summary["accuracy"] >= 0.9
    folder = result.artifact_dir
    assert folder is not None and folder.name == "th6"
    lines = [json.loads(line) for line in (folder / run_folder.METRICS).read_text().splitlines()]
    assert lines[-1]["step"] == 300 and {"loss", "lr", "samples_per_s"} <= set(lines[-1])
    assert list((folder / run_folder.PLOTS_DIR).glob("*.png"))
    assert json.loads((folder / run_folder.SUMMARY).read_text())["status"] == "completed"
    assert not list(folder.rglob("*.pt")), "checkpoints come back only when asked"


def test_progress_streams_while_the_run_trains(trained: tuple) -> None:
    _, seen = trained
    progress = [e for e in seen if isinstance(e, ev.TrainProgress)]
    assert progress and all(p.run == "digits-api" and p.host == "th6" for p in progress)
    assert progress[-1].status == "completed"
    assert any(isinstance(e, ev.TaskStarted) and e.task == "Start the training unit" for e in seen)


def test_the_run_is_in_the_history_with_its_result(forja: Forja, trained: tuple) -> None:
    record = forja.history.get("digits-api")
    assert record.status == "completed" and record.hosts == ["th6"]
    assert record.steps == 300 and record.last_loss is not None and record.ended_at
    assert record.config_hash and record.artifact_dir.endswith("digits-api/th6")


def test_status_and_logs_read_the_run_on_the_host(forja: Forja, trained: tuple) -> None:
    (state,) = forja.status("digits-api")
    assert (state.host, state.run, state.status, state.step) == ("th6", "digits-api", "completed", 300)
    logs = forja.logs("digits-api", lines=200)
    assert "completed" in logs["th6"]


def test_the_project_was_sent_without_its_env_file(th6: testhosts.Host, trained: tuple) -> None:
    listing = ssh(th6, "sudo find /opt/forja/code -path '*/project/*' -printf '%P\\n'")
    assert "mypkg/__init__.py" in listing
    assert ".env" not in listing
    assert "do-not-send" not in ssh(th6, "sudo cat /opt/forja/code/*/project/* 2>/dev/null || true")


def test_the_completed_run_took_its_staged_dataset_and_left_its_snapshot(
    forja: Forja, th6: testhosts.Host, trained: tuple, workspace: Path
) -> None:
    # the unit's ExecStopPost (root) removes it just after the run's end: give it a few seconds
    said = ssh(th6, f"for i in $(seq 30); do [ -e {STAGED} ] || {{ echo gone; exit 0; }}; sleep 1; done; "
                    "echo there")
    assert said.strip() == "gone", ssh(th6, "sudo journalctl -u forja-train@digits-api -n 30 --no-pager")
    snap = forja.run_snapshot("digits-api")
    assert snap.facts["project"] == str(workspace / "project") and snap.facts["git"] is False
    assert snap.packages.get("torch"), "the run's Python packages came back with its results"


def test_iter_events_streams_any_method_then_its_result(forja: Forja, trained: tuple) -> None:
    events = list(forja.iter_events("status", "digits-api"))
    assert isinstance(events[-1], list) and events[-1][0].status == "completed"
    assert any(isinstance(e, ev.TaskStarted) for e in events[:-1])


def test_fetching_again_changes_nothing(forja: Forja, trained: tuple, workspace: Path) -> None:
    first = forja.fetch("digits-api", dest=workspace / "again")
    second = forja.fetch("digits-api", dest=workspace / "again")
    assert (workspace / "again" / "th6" / run_folder.SUMMARY).is_file()
    assert first.changed_tasks and not second.changed_tasks


def test_a_diverged_run_is_named_diverged_is_not_restarted_and_says_where(
    forja: Forja, workspace: Path
) -> None:
    """lr 1e6: the unit's exit 7 is in RestartPreventExitStatus, so systemd leaves it failed (an
    auto-restart would read as "running" and the wait would go on); the host reports "diverged"."""
    config = yaml.safe_load(DIGITS.read_text())
    config["lr"] = 1e6
    path = workspace / "diverging.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(errors.RunDiverged) as info:
        forja.train(path, name="diverging", poll_s=1)
    assert info.value.exit_code == errors.ExitCode.DIVERGED == 8
    assert info.value.task == "Fail when the run did not complete"
    assert "run diverging diverged at step " in info.value.detail and "(exit status 7, " in info.value.detail
    assert "newest checkpoint" in info.value.detail or "no checkpoint before it" in info.value.detail
    assert forja.history.get("diverging").status == "diverged"
    (state,) = forja.status("diverging")
    assert (state.status, state.exit_status, state.restarts) == ("diverged", 7, 0)
    assert state.summary is not None and state.summary["divergence"]["step"] <= 10


def test_cancelling_a_train_raises_cancelled_and_records_it(forja: Forja) -> None:
    def cancel_when_packing(event: ev.Event) -> None:
        if isinstance(event, ev.TaskStarted) and event.task.startswith("Pack the trainer"):
            forja.cancel()

    with pytest.raises(errors.Cancelled):
        forja.train(DIGITS, name="to-cancel", on_event=cancel_when_packing)
    assert forja.history.get("to-cancel").status == "cancelled"


def test_an_unreachable_host_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    ghost = {"ansible_host": "127.0.0.1", "ansible_port": 1}
    inventory = write_inventory(tmp_path / "inv.yml", {"ghost": ghost})
    f = Forja(project_dir=tmp_path, inventory=inventory, host_key_checking=False,
              private_data_dir=tmp_path / "runner", history=History(tmp_path / "h.sqlite"))
    with pytest.raises(errors.HostUnreachable) as info:
        f.status()
    assert info.value.host == "ghost"
    assert "refused" in info.value.detail.lower() or "connect" in info.value.detail.lower()
    assert info.value.exit_code == errors.ExitCode.UNREACHABLE


def test_a_completed_runs_name_is_refused_by_the_host_when_this_history_does_not_know_it(
    trained: tuple, th6: testhosts.Host, workspace: Path
) -> None:
    """forja on another machine (a history without digits-api): the host still holds the completed
    run, so the role refuses before anything changes, naming --replace, and nothing is recorded
    (was: the host started nothing and forja reported the old run's results as the new one's)."""
    other = Forja(project_dir=workspace / "project", inventory=workspace / "inventory.yml",
                  private_data_dir=workspace / "runner-other", host_key_checking=False,
                  history=History(workspace / "other-history.sqlite"))  # fmt: skip
    env_file = "sudo stat -c %Y.%s /etc/forja/train/digits-api.env"
    before = ssh(th6, env_file)
    with pytest.raises(errors.ConfigError) as refused:
        other.train(DIGITS, name="digits-api", poll_s=1)
    said = refused.value.message
    assert refused.value.exit_code == 2 and refused.value.field == "name", said
    assert "run digits-api already completed on th6" in said and "forja train --replace digits-api" in said
    assert other.history.list() == [], "nothing recorded"
    assert ssh(th6, env_file) == before, "nothing changed on the host"


def test_replace_keeps_the_completed_run_aside_and_starts_afresh_under_its_name(
    forja: Forja, trained: tuple, th6: testhosts.Host, workspace: Path
) -> None:
    """`--replace`: the 300-step run is kept as digits-api-replaced-<time> (history row with its
    events, folder on the host, fetched results), and a 30-step run trains from step 0 under the name."""
    forja.history.record_event("digits-api", "preempted", zone="us-east1-d")  # not the new run's
    short = workspace / "digits-short.yaml"
    short.write_text(yaml.safe_dump({**yaml.safe_load(DIGITS.read_text()), "steps": 30}))
    result = forja.train(short, name="digits-api", poll_s=1, replace=True)
    assert (result.status, result.summary["steps"]) == ("completed", 30)  # not resumed at step 300
    (aside,) = [r for r in forja.history.list() if r.run_id.startswith("digits-api-replaced-")]
    assert (aside.status, aside.steps, aside.preemptions) == ("completed", 300, 1)
    assert [e.kind for e in forja.history.events(aside.run_id)].count("preempted") == 1
    new = forja.history.get("digits-api")
    assert (new.steps, new.preemptions) == (30, 0)
    assert "preempted" not in [e.kind for e in forja.history.events("digits-api")]
    on_host = ssh(th6, f"sudo cat /var/lib/forja/runs/{aside.run_id}/{run_folder.SUMMARY}")
    assert json.loads(on_host)["steps"] == 300
    # its fetched results moved with it (the history points at the newest fetch, wherever it went)
    moved = forja.results_dir(aside.run_id) / "th6" / run_folder.SUMMARY
    assert json.loads(moved.read_text())["steps"] == 300
    assert aside.artifact_dir
    assert json.loads((Path(aside.artifact_dir) / run_folder.SUMMARY).read_text())["steps"] == 300
