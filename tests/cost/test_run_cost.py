"""A run's cost (`forja cost --run ID`) and the estimate `forja train` shows before sending.

Real parts: the built-in trainer trains the digits demo on the CPU into a run folder (its events,
metrics and config as a host writes them), the run is in a real history file with the watcher's
events, and prices come from forja's own table (plugins/module_utils/forja_gcp_prices.json, read
here as plain JSON so the expected figures do not come from the code under test).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from forja.api import Forja
from forja.cost.run import PARTS
from forja.errors import ConfigError, ExitCode
from forja.history import History
from trainer import run_folder

REPO = Path(__file__).resolve().parents[2]
TABLE = json.loads((REPO / "plugins/module_utils/forja_gcp_prices.json").read_text())
RATE = TABLE["machine_types"]["g2-standard-8"]["us-east1"]["on_demand"]
DISK_GB_MONTH = TABLE["disks"]["pd-balanced"]["us-east1"]["per_gb_month"]
HOURS_PER_MONTH = TABLE.get("hours_per_month", 730)
VM = {"name": "forja-l4", "zone": "us-east1-d", "machine_type": "g2-standard-8",
      "provisioning_model": "SPOT", "status": "RUNNING", "boot_disk_size_gb": 300}  # fmt: skip
SPOT = TABLE["machine_types"]["g2-standard-8"]["us-east1"]["spot"]
STEPS, EVAL_EVERY, SPAN_S, DOWN_S = 60, 20, 900, 240


def digits_config(path: Path, out: Path, steps: int = STEPS) -> Path:
    path.write_text(yaml.safe_dump({
        "model": "trainer.demo:digits_cnn", "data": "trainer.demo:digits", "steps": steps, "batch_size": 32,
        "lr": 0.002, "log_every_steps": 10, "eval_every_steps": EVAL_EVERY, "device": "cpu",
        "render_plots": False, "price_per_hour": RATE, "out_dir": str(out),
    }))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One finished run as forja knows it: recorded, trained, preempted once and moved, fetched."""
    from trainer.config import load
    from trainer.train import train

    root = tmp_path_factory.mktemp("runcost")
    history = History(root / "home" / "history.sqlite")  # FORJA_HOME's history, for the CLI too
    out = root / "results" / "forja-l4"
    config = digits_config(root / "digits.yaml", out)
    forja = Forja(project_dir=root, inventory=None, history=history)
    from forja.cost.estimate import config_hash

    record = history.start("digits-a", name="digits-a", hosts=["forja-l4"], config_path=str(config),
                           config_hash=config_hash(config))  # fmt: skip
    assert train(load(config)).status == "completed"
    history.record_event("digits-a", "preempted", zone="us-east1-d", seconds_down=DOWN_S / 2, usd_down=0.001)
    history.record_event("digits-a", "zone_moved", from_zone="us-east1-d", to_zone="us-east1-b",
                         seconds_down=DOWN_S, usd_down=0.002)  # fmt: skip
    ended = datetime.fromisoformat(record.started_at) + timedelta(seconds=SPAN_S)
    history.update("digits-a", status="completed", ended_at=ended.isoformat(), artifact_dir=str(out))
    return {"root": root, "history": history, "forja": forja, "config": config, "out": out}


def test_a_run_costs_the_vm_while_up_for_it_and_the_disk_all_along(ran: dict[str, Any]) -> None:
    cost = ran["forja"].run_cost("digits-a", [VM])
    assert cost.span_s == SPAN_S and cost.down_s == DOWN_S and cost.up_s == SPAN_S - DOWN_S
    assert cost.usd_per_hour == SPOT, "the instance's own rate (Spot) from the price table"
    assert cost.vm_usd == pytest.approx(SPOT * (SPAN_S - DOWN_S) / 3600)
    assert cost.disk_usd == pytest.approx(300 * DISK_GB_MONTH * SPAN_S / 3600 / HOURS_PER_MONTH)
    assert cost.cost_usd == pytest.approx(cost.vm_usd + cost.disk_usd)
    assert (cost.preemptions, cost.zone_moves) == (1, 1)


def test_the_parts_are_measured_and_add_up_to_the_time_up(ran: dict[str, Any]) -> None:
    cost = ran["forja"].run_cost("digits-a", [VM])
    seconds = {p.name: p.seconds for p in cost.parts}
    assert tuple(seconds) == PARTS
    for measured in ("setup", "compute", "data_wait", "evaluation", "checkpoints"):
        assert seconds[measured] is not None and seconds[measured] > 0, measured
    assert sum(seconds.values()) == pytest.approx(cost.up_s)
    assert all(p.usd == pytest.approx(p.seconds * SPOT / 3600) for p in cost.parts)


def test_evaluation_is_what_the_trainer_timed(ran: dict[str, Any]) -> None:
    events = [json.loads(line) for line in (ran["out"] / run_folder.EVENTS).read_text().splitlines()]
    timed = [e["seconds"] for e in events if e["event"] in ("eval", "finish")]
    assert len(timed) == STEPS // EVAL_EVERY, "two evaluations in the loop and the final one"
    cost = ran["forja"].run_cost("digits-a", [VM])
    assert {p.name: p.seconds for p in cost.parts}["evaluation"] == pytest.approx(sum(timed))


def test_without_an_instance_the_run_is_priced_at_the_rate_it_used_and_the_disk_is_unknown(
    ran: dict[str, Any],
) -> None:
    cost = ran["forja"].run_cost("digits-a")
    assert cost.usd_per_hour == RATE and "price_per_hour" in cost.rate_source
    assert cost.disk_usd is None and cost.cost_usd == pytest.approx(RATE * (SPAN_S - DOWN_S) / 3600)


def cli(ran: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    """The installed `forja` command, with the run's history as its own (FORJA_HOME)."""
    env = {**os.environ, "FORJA_HOME": str(ran["root"] / "home")}
    env.pop("FORJA_INVENTORY", None)
    forja = Path(sys.executable).with_name("forja")
    return subprocess.run([str(forja), *args], env=env, capture_output=True, text=True, cwd=REPO, timeout=60)


def test_forja_cost_run_prints_each_part_for_people_and_every_digit_in_json(ran: dict[str, Any]) -> None:
    instances = ran["root"] / "vm.yml"
    instances.write_text(yaml.safe_dump([VM]))
    shown = cli(ran, "cost", "--run", "digits-a", "--instances", str(instances))
    assert shown.returncode == 0, shown.stderr
    parts = ("setup", "data wait", "evaluation", "compute", "1 preempted, 1 zone moves", "total", "4m 00s")
    for words in parts:
        assert words in shown.stdout, words
    as_json = cli(ran, "--json", "cost", "--run", "digits-a", "--instances", str(instances))
    data = json.loads(as_json.stdout)
    assert data["cost_usd"] == pytest.approx(SPOT * (SPAN_S - DOWN_S) / 3600
                                              + 300 * DISK_GB_MONTH * SPAN_S / 3600 / HOURS_PER_MONTH)


def test_an_unknown_run_is_not_found(ran: dict[str, Any]) -> None:
    shown = cli(ran, "cost", "--run", "no-such-run")
    assert shown.returncode == ExitCode.NOT_FOUND and "no-such-run" in shown.stderr


def test_the_estimate_is_steps_at_the_measured_speed_plus_setup_and_evaluation_at_the_rate(
    ran: dict[str, Any],
) -> None:
    again = ran["root"] / "again.yaml"
    again.write_bytes(ran["config"].read_bytes())  # the same config: the same hash
    found = ran["forja"].estimate(again, [VM])
    assert found.measured.run_id == "digits-a" and found.measured.how == "the same config"
    parts = {p.name: p.seconds for p in ran["forja"].run_cost("digits-a", [VM]).parts}
    assert found.steps == STEPS
    assert found.seconds == pytest.approx(parts["setup"] + parts["evaluation"]
                                          + STEPS * found.measured.seconds_per_step)
    assert found.vm_usd == pytest.approx(found.seconds * SPOT / 3600)
    assert found.disk_usd_per_month == pytest.approx(300 * DISK_GB_MONTH)
    assert found.total_usd == pytest.approx(found.vm_usd + found.disk_usd)
    line = found.describe()
    assert "60 steps" in line and "measured by digits-a" in line and "about" in line


def test_a_longer_run_of_the_same_model_is_estimated_from_its_speed(ran: dict[str, Any]) -> None:
    longer = digits_config(ran["root"] / "longer.yaml", ran["root"] / "elsewhere", steps=6000)
    found = ran["forja"].estimate(longer, [VM])
    assert found.measured.how == "the same model, data, batch and precision"
    assert found.steps == 6000 and found.seconds > 6000 * found.measured.seconds_per_step


def test_with_no_earlier_run_the_estimate_is_the_plans_prediction_labelled_so(
    ran: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORJA_ESTIMATE_PLAN", "1")  # tests/conftest.py turns it off for the rest
    again = ran["root"] / "again-planned.yaml"
    again.write_bytes(ran["config"].read_bytes())
    no_history = Forja(project_dir=ran["root"], inventory=None, history=History(ran["root"] / "empty.sqlite"))
    found = no_history.estimate(again, [VM])
    assert found.measured is None and found.predicted is not None
    assert found.seconds == pytest.approx(STEPS * found.predicted.seconds_per_step)
    assert found.total_usd == pytest.approx(found.seconds * SPOT / 3600 + found.disk_usd)
    line = found.describe()
    assert "predicted" in line and "no earlier run" in line and "$0.56/h" in line and "±25%" in line
    # a run of that config measured it on the CPU: the L4 plan is not scored against the CPU's speed
    measured = ran["forja"].estimate(again, [VM])
    assert measured.measured.run_id == "digits-a" and measured.measured.device == "cpu"
    assert measured.prediction_error is None and "% off" not in measured.describe()
    assert "not compared: the plan was for nvidia-l4 and digits-a trained on the CPU" in measured.describe()


def test_the_plans_error_is_reported_only_against_a_run_on_the_planned_gpu() -> None:
    from forja.cost.estimate import Measured, Predicted, RunEstimate

    planned = Predicted(0.5, 0.25, "modelled", STEPS, 32, 1, 900.0, "nvidia-l4")
    for device, error in (("NVIDIA L4", 0.25), ("Tesla T4", None), ("cpu", None), (None, None)):
        on = Measured("run-a", "the same config", 0.4, 10.0, 2.0, STEPS, device)
        found = RunEstimate(STEPS, RATE, "on demand", None, on, 60.0, 0.01, None, 0.01, planned)
        assert found.prediction_error == (pytest.approx(error) if error is not None else None), device
        assert ("+25% off" in found.describe()) == (error is not None), device


def test_a_missing_config_is_a_clear_error(ran: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="not a file"):
        ran["forja"].estimate(ran["root"] / "nope.yaml", [VM])


def test_forja_train_shows_the_estimate_before_it_sends_the_run(ran: dict[str, Any]) -> None:
    inventory = ran["root"] / "unreachable.yml"  # the VM's record is there; its SSH port answers nothing
    host = {**{k: v for k, v in VM.items() if k != "name"}, "ansible_host": "127.0.0.1", "ansible_port": 1}
    inventory.write_text(yaml.safe_dump({"all": {"children": {"forja_gpu": {"hosts": {"forja-l4": host}}}}}))
    again = ran["root"] / "sent.yaml"
    again.write_bytes(ran["config"].read_bytes())
    shown = cli(ran, "-i", str(inventory), "train", str(again), "--detach")
    assert shown.returncode == ExitCode.UNREACHABLE
    estimate, _, after = shown.stderr.partition("unreachable")
    for words in ("cost estimate: 60 steps", "measured by digits-a", "$0.56/h"):
        assert words in estimate, words
    assert "forja-l4" in after, "the estimate comes first, then the attempt to send"


def test_a_run_recorded_without_its_folder_is_split_once_fetched_to_the_default_place(
    ran: dict[str, Any],
) -> None:
    """site.yml's runs enter the history from the host's state, with no results folder: the split
    comes as soon as `forja fetch` has put them where forja looks (<project>/forja-runs/<run>/<host>);
    before that the table says why it has no split instead of showing empty rows."""
    history: History = ran["history"]
    record = history.start("digits-b", name="digits-b", hosts=["forja-l4"], config_path=str(ran["config"]))
    ended = datetime.fromisoformat(record.started_at) + timedelta(seconds=SPAN_S)
    history.update("digits-b", status="completed", ended_at=ended.isoformat())
    instances = ran["root"] / "vm-b.yml"
    instances.write_text(yaml.safe_dump([VM]))
    shown = cli(ran, "cost", "--run", "digits-b", "--instances", str(instances))
    assert shown.returncode == 0, shown.stderr
    said = " ".join(shown.stdout.split())
    assert "no split into setup" in said and "forja fetch digits-b" in said, said
    assert "data wait" not in said.split("no split")[0], "no empty rows for parts nobody measured"

    shutil.copytree(ran["out"], ran["root"] / "forja-runs" / "digits-b" / "forja-l4")
    seconds = {p.name: p.seconds for p in ran["forja"].run_cost("digits-b", [VM]).parts}
    assert seconds["compute"] and seconds["evaluation"], seconds
