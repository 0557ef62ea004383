"""A run's cost is settled once per end (an end being an instant, however it is written), a run whose
results never came back is priced all the same, and a run's result names that cost `cost_usd` and the
trainer's own count `training_usd`, as `forja cost --run --json` does.

Real parts: a real history file, the run priced as `forja train` prices it when sent (from a VM record
as the train play publishes it, or the snapshot of the config it was sent with), settled by
forja.cost_report.settle as each place that learns of the end calls it; the result printed by the CLI's
own --json printer. The expected figure comes from the price table read here as plain JSON and the
history's own timestamps.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from forja import cost_report, snapshot
from forja.cli.common import emit_json
from forja.cost.run import RunCost
from forja.history import History
from forja.runs import TrainResult
from forja.session import Session

REPO = Path(__file__).resolve().parents[2]
TABLE = json.loads((REPO / "plugins/module_utils/forja_gcp_prices.json").read_text())
SPOT = TABLE["machine_types"]["g2-standard-8"]["us-east1"]["spot"]
DISK_GB_MONTH = TABLE["disks"]["pd-balanced"]["us-east1"]["per_gb_month"]
HOURS_PER_MONTH = TABLE.get("hours_per_month", 730)
#: The VM as the train play publishes it (contract.read_stats(...).price_records).
VM = {"name": "forja-l4", "machine_type": "g2-standard-8", "zone": "us-east1-d", "gpu_type": "nvidia-l4",
      "gpu_count": 1, "provisioning_model": "SPOT", "preemptible": True, "boot_disk_size_gb": 300}
SPAN_S = 600
#: What a trainer's summary.json holds, its own count among it.
SUMMARY = {"status": "completed", "steps": 300, "final_loss": 0.031, "cost_usd": 0.0052, "wall_s": 41.0}


def ended_run(tmp_path: Path) -> tuple[Session, History]:
    """The run `digits`, sent and priced as `forja train` does, ended SPAN_S after it started."""
    history = History(tmp_path / "history.sqlite")
    session = Session(tmp_path, history=history)
    started = history.start("digits", name="digits", hosts=["forja-l4"]).started_at
    cost_report.price_run(session, history.get("digits"), [VM])
    ended = datetime.fromisoformat(started) + timedelta(seconds=SPAN_S)
    history.update("digits", status="completed", ended_at=ended.isoformat())
    return session, history


def test_a_run_is_settled_once_at_its_end_however_often_forja_learns_it_ended(tmp_path: Path) -> None:
    session, history = ended_run(tmp_path)

    # `forja status` sees the end, `forja fetch` fetches it, a second `forja status` looks again
    found = [cost_report.settle(session, "digits") for _ in range(3)]

    expected = SPOT * SPAN_S / 3600 + 300 * DISK_GB_MONTH * SPAN_S / 3600 / HOURS_PER_MONTH
    assert isinstance(found[0], RunCost) and found[1:] == [None, None], "later looks change nothing"
    assert [e.kind for e in history.events("digits")].count(cost_report.SETTLED_EVENT) == 1
    settled = cost_report.settled_cost(history, "digits")
    assert history.get("digits").cost_usd == settled == pytest.approx(expected)

    # the run sent again after its end is a new run: it is settled at its own end
    history.start("digits", name="digits", hosts=["forja-l4"])
    cost_report.price_run(session, history.get("digits"), [VM])  # priced as sent, as the first one was
    assert cost_report.settled_cost(history, "digits") is None
    history.update("digits", status="stopped", ended_at=datetime.now().astimezone().isoformat())
    assert cost_report.settle(session, "digits") is not None


def test_an_end_written_again_in_another_form_is_the_end_it_was_settled_at(tmp_path: Path) -> None:
    session, history = ended_run(tmp_path)
    end = datetime.fromisoformat(history.get("digits").ended_at or "")
    cost_report.settle(session, "digits")
    settled = cost_report.settled_cost(history, "digits")

    # the same instant as another writer may give it: "Z", another offset, another precision
    pacific = timezone(timedelta(hours=-8))
    for form in (end.isoformat().replace("+00:00", "Z"), end.astimezone(pacific).isoformat(),
                 (end + timedelta(milliseconds=400)).isoformat(timespec="milliseconds")):
        history.update("digits", ended_at=form)
        assert cost_report.settled_cost(history, "digits") == settled, form
        assert cost_report.settle(session, "digits") is None, f"{form}: settled once"

    # a later end (the run went on after the first) is a new end: no cost until it is settled there
    history.update("digits", ended_at=(end + timedelta(minutes=5)).isoformat())
    assert cost_report.settled_cost(history, "digits") is None
    again = cost_report.settle(session, "digits")
    assert again is not None and again.cost_usd > (settled or 0.0)


def test_a_run_whose_results_never_came_back_is_priced_at_the_config_it_was_sent_with(tmp_path: Path) -> None:
    """A sweep's last trial on a host with no machine type (no VM record prices it): its fetch failed,
    so no config.yaml came back, and its end is settled where the sweep's look saw it end."""
    history = History(tmp_path / "history.sqlite")
    session = Session(tmp_path, history=history)
    config = tmp_path / "trial.yaml"
    config.write_text(yaml.safe_dump({"steps": 40, "price_per_hour": 0.9}))
    run = "unfetched-t001"
    started = history.start(run, name=run, config_path=str(config)).started_at
    snapshot.record(session, run, project=None, config=config, options={})  # as forja.training sends it
    config.write_text(yaml.safe_dump({"steps": 40, "price_per_hour": 5.0}))  # edited since: not its rate
    history.update(run, status="completed", ended_at=(datetime.fromisoformat(started) + timedelta(seconds=40))
                   .isoformat())

    found = cost_report.settle(session, run)

    assert found is not None and found.usd_per_hour == 0.9
    expected = 0.9 * 40 / 3600  # its config's rate over its span, no disk known
    assert cost_report.settled_cost(history, run) == history.get(run).cost_usd == pytest.approx(expected)


def test_a_run_s_result_in_json_names_its_cost_cost_usd_and_the_trainer_s_count_training_usd(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session, history = ended_run(tmp_path)
    cost_report.settle(session, "digits")

    result = TrainResult.ended(history.get("digits"), cost_report.settled_cost(history, "digits"), SUMMARY,
                               tmp_path / "forja-runs" / "digits" / "forja-l4")
    emit_json(result)  # what `forja train --json` and `forja follow --json` print

    shown = json.loads(capsys.readouterr().out)
    assert shown["cost_usd"] == history.get("digits").cost_usd, "the figure `forja runs --json` shows"
    assert shown["training_usd"] == SUMMARY["cost_usd"] < shown["cost_usd"]
    assert "cost_usd" not in shown["summary"], "the trainer's count is never a second cost"
    assert shown["summary"]["final_loss"] == SUMMARY["final_loss"]
    assert (shown["status"], shown["hosts"]) == ("completed", ["forja-l4"])
