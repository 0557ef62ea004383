"""One run, one cost: every view shows the figure forja.cost.run defines, under the name "cost".

Real parts: the built-in trainer trains the digits demo on the CPU into the run's folder as a host
writes it; the run is recorded by the command site.yml's train play runs on the controller
(`python -m forja.record`, with the VM's pricing fields as the forja_price_record filter picks
them from its hostvars); `forja runs` and `forja cost --run` are the installed command on that
history; the dashboard is `forja ui`, read over real HTTP. The expected figure comes from the price
table read here as plain JSON and the history's own timestamps, not from the code under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from ansible.plugins.loader import filter_loader

from forja import format as fmt
from forja.cost.run import TRAINING_LABEL
from forja.history import History
from trainer import run_folder

REPO = Path(__file__).resolve().parents[2]
TABLE = json.loads((REPO / "plugins/module_utils/forja_gcp_prices.json").read_text())
SPOT = TABLE["machine_types"]["g2-standard-8"]["us-east1"]["spot"]
DISK_GB_MONTH = TABLE["disks"]["pd-balanced"]["us-east1"]["per_gb_month"]
HOURS_PER_MONTH = TABLE.get("hours_per_month", 730)
#: The VM's hostvars as the gcp_gpu inventory plugin sets them, with what a play adds around them.
HOSTVARS = {"inventory_hostname": "forja-l4", "instance_name": "forja-l4", "machine_type": "g2-standard-8",
            "zone": "us-east1-d", "gpu_type": "nvidia-l4", "gpu_count": 1, "provisioning_model": "SPOT",
            "preemptible": True, "boot_disk_size_gb": 300, "status": "RUNNING",
            "ansible_ssh_private_key_file": "/home/me/.ssh/forja", "notify_webhook": "https://hooks/secret"}
TOKEN = "one-cost-test-token"


def cli(root: Path, *args: str, wait: bool = True) -> Any:
    """The installed `forja` command on the run's history (FORJA_HOME), with no inventory named."""
    env = {**os.environ, "FORJA_HOME": str(root / "home"), "FORJA_UI_TOKEN": TOKEN, "NO_COLOR": "1",
           "COLUMNS": "200"}
    env.pop("FORJA_INVENTORY", None)
    env.pop("FORJA_PRICES", None)
    argv = [str(Path(sys.executable).with_name("forja")), *args]
    if not wait:
        return subprocess.Popen(argv, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    done = subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The digits demo trained, then recorded as site.yml's train play records it on the controller."""
    from trainer.config import load
    from trainer.train import train

    root = tmp_path_factory.mktemp("onecost")
    out = root / "forja-runs" / "digits" / "forja-l4"  # where `forja fetch digits` puts it
    config = root / "digits.yaml"
    config.write_text(yaml.safe_dump({
        "model": "trainer.demo:digits_cnn", "data": "trainer.demo:digits", "steps": 20, "batch_size": 32,
        "lr": 0.002, "log_every_steps": 10, "eval_every_steps": 0, "device": "cpu", "render_plots": False,
        "price_per_hour": SPOT, "out_dir": str(out),
    }))  # fmt: skip
    set_up = datetime.now(timezone.utc).isoformat()  # the host set the run up: its start
    assert train(load(config)).status == "completed"
    time.sleep(1.0)  # the play records the run after it ended, and the history keeps whole seconds
    summary = json.loads((out / run_folder.SUMMARY).read_text())
    price_record = filter_loader.get("forja.gpu.forja_price_record").j2_function
    state = {"forja_train_state": 1, "run": "digits", "status": "completed", "node_rank": 0,
             "configured_at": set_up, "summary": summary}  # fmt: skip
    env = {**os.environ, "FORJA_HOME": str(root / "home")}
    env.pop("FORJA_PRICES", None)
    instances = json.dumps([price_record(HOSTVARS)])  # what train.yml's record step passes
    argv = [sys.executable, "-m", "forja.record", "--state", json.dumps(state),
            "--hosts", "forja-l4", "--config", str(config), "--instances", instances]
    recorded = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=60)
    return {"root": root, "summary": summary, "recorded": recorded.stdout.splitlines(), "argv": argv}


def test_the_record_step_hands_the_command_line_only_what_prices_the_vm(run: dict[str, Any]) -> None:
    instances = json.loads(run["argv"][-1])
    assert instances == [{"name": "forja-l4", "machine_type": "g2-standard-8", "zone": "us-east1-d",
                          "gpu_type": "nvidia-l4", "gpu_count": 1, "provisioning_model": "SPOT",
                          "preemptible": True, "boot_disk_size_gb": 300}]  # fmt: skip


def test_every_view_shows_the_one_cost_of_the_run(run: dict[str, Any]) -> None:
    root = run["root"]
    record = History(root / "home" / "history.sqlite").get("digits")
    span = (datetime.fromisoformat(record.ended_at or "")
            - datetime.fromisoformat(record.started_at)).total_seconds()
    expected = SPOT * span / 3600 + 300 * DISK_GB_MONTH * span / 3600 / HOURS_PER_MONTH
    training = run["summary"]["cost_usd"]
    assert record.cost_usd == pytest.approx(expected), "the history: the VM up for the run plus its disk"
    assert 0 < training < record.cost_usd, "the trainer's count leaves out setup, the end and the disk"
    cost, money = record.cost_usd, fmt.money(record.cost_usd)

    # site.yml's summary prints what the record step printed after "changed"
    assert run["recorded"][0] == "changed" and json.loads(run["recorded"][1])["cost_usd"] == cost

    (row,) = json.loads(cli(root, "--json", "runs"))
    assert row["cost_usd"] == cost
    table = cli(root, "runs")
    assert money in table and fmt.money(training) not in table

    # no inventory named: the rate recorded with the run, disk included, not the config's bare rate
    assert json.loads(cli(root, "--json", "cost", "--run", "digits"))["cost_usd"] == cost
    shown = cli(root, "cost", "--run", "digits")
    (total,) = [line for line in shown.splitlines() if " total " in f" {line} "]
    assert money in total, shown
    assert f"{TRAINING_LABEL}: {fmt.money(training)}" in " ".join(shown.split()), shown

    ui = cli(root, "ui", "--port", "0", wait=False)
    try:
        line = ui.stdout.readline()
        base = line.split("forja ui: ", 1)[1].split("?token=", 1)[0]
        headers = {"Authorization": f"token {TOKEN}"}
        deadline = time.monotonic() + 30
        while True:  # the URL is printed just before uvicorn answers
            try:
                runs = requests.get(f"{base}api/runs", headers=headers, timeout=5).json()["runs"]
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, line
                time.sleep(0.1)
        (listed,) = runs
        assert (listed["cost_usd"], listed["shown"]["cost"]) == (cost, money)
        detail = requests.get(f"{base}api/runs/digits", headers=headers, timeout=5).json()["cost"]
        assert detail["cost_usd"] == cost and ["total", "", money, ""] in detail["shown"]["rows"]
        assert f"{TRAINING_LABEL}: {fmt.money(training)}" in detail["shown"]["note"]
    finally:
        ui.terminate()
        ui.wait(15)
