"""A run `forja train` sends is priced as it is sent, from the VM records the train playbook publishes,
so settling its cost at its end reads no inventory (one `ansible-inventory` fewer per run).

Real parts: train.yml's own publishing task (read from the playbook, not copied) runs in Ansible through
forja's runner over two local hosts, a VM as the gcp_gpu inventory plugin describes it and the user's
own machine; its artifact data is read through forja's contract, recorded as forja.training records it,
and settled by forja.cost_report.settle while Python's audit hook sees every process it starts.
The expected figure comes from the price table read here as plain JSON.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from forja import contract, cost_report, runner
from forja.cost.run import PRICED_EVENT
from forja.history import History
from forja.session import Session

REPO = Path(__file__).resolve().parents[2]
TABLE = json.loads((REPO / "plugins/module_utils/forja_gcp_prices.json").read_text())
SPOT = TABLE["machine_types"]["g2-standard-8"]["us-east1"]["spot"]
DISK_GB_MONTH = TABLE["disks"]["pd-balanced"]["us-east1"]["per_gb_month"]
HOURS_PER_MONTH = TABLE.get("hours_per_month", 730)
#: The VM's hostvars as the gcp_gpu inventory plugin sets them, with a secret a play also holds.
VM = {"ansible_connection": "local", "machine_type": "g2-standard-8", "zone": "us-east1-d",
      "gpu_type": "nvidia-l4", "gpu_count": 1, "provisioning_model": "SPOT", "preemptible": True,
      "boot_disk_size_gb": 300, "status": "RUNNING", "notify_webhook": "https://hooks/secret"}  # fmt: skip
SPAN_S = 600


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The artifact data of train.yml's publishing task over the VM and the user's own machine."""
    root = tmp_path_factory.mktemp("published")
    plays = yaml.safe_load((REPO / "playbooks/train.yml").read_text())
    (task,) = [t for play in plays for t in play.get("post_tasks", []) if "ansible.builtin.set_stats" in t]
    (root / "play.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": [task]}]))
    hosts = {"forja-l4": VM, "mine": {"ansible_connection": "local", "host_contract_platform": "own"}}
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    result = runner.run(runner.PlaybookRun(playbook=str(root / "play.yml"), inventory=str(root / "hosts.yml"),
                                           private_data_dir=root / "runner", host_key_checking=False))
    assert result.ok, result.output_tail
    return result.artifact_data


def test_the_play_publishes_only_what_prices_each_vm(published: dict[str, Any]) -> None:
    assert contract.read_stats(published).price_records == [
        {"name": "forja-l4", "machine_type": "g2-standard-8", "zone": "us-east1-d", "gpu_type": "nvidia-l4",
         "gpu_count": 1, "provisioning_model": "SPOT", "preemptible": True, "boot_disk_size_gb": 300},
    ], "no secret, no connection setting, and nothing for the user's own machine (priced at its end)"


def test_a_run_priced_when_sent_is_settled_without_reading_the_inventory(
    published: dict[str, Any], tmp_path: Path
) -> None:
    inventory = tmp_path / "hosts.yml"  # a real one: reading it would run ansible-inventory, seen below
    inventory.write_text(yaml.safe_dump({"all": {"children": {"forja_gpu": {"hosts": {"forja-l4": {}}}}}}))
    history = History(tmp_path / "history.sqlite")
    session = Session(tmp_path, inventory=str(inventory), history=history)
    started = history.start("digits", name="digits").started_at
    # what forja.training does once the play has sent the run
    history.update("digits", hosts=["forja-l4"])
    cost_report.price_run(session, history.get("digits"), contract.read_stats(published).price_records)

    ended = datetime.fromisoformat(started) + timedelta(seconds=SPAN_S)
    history.update("digits", status="completed", ended_at=ended.isoformat())
    spawned: list[str] = []  # every process started from here on (Python's audit events)
    sys.addaudithook(lambda event, args: event == "subprocess.Popen" and spawned.append(str(args[1])))
    found = cost_report.settle(session, "digits")

    assert not [argv for argv in spawned if "ansible-inventory" in argv], "the run was priced when sent"
    expected = SPOT * SPAN_S / 3600 + 300 * DISK_GB_MONTH * SPAN_S / 3600 / HOURS_PER_MONTH
    assert found is not None and history.get("digits").cost_usd == pytest.approx(expected)
    assert "g2-standard-8" in found.rate_source


def test_a_run_its_hosts_cannot_price_reads_the_inventory_once_however_often_it_is_looked_at(
    tmp_path: Path,
) -> None:
    inventory = tmp_path / "hosts.yml"  # a host with no machine type: nothing in it prices the run
    inventory.write_text(yaml.safe_dump({"all": {"children": {"forja_gpu": {"hosts": {"th6": {}}}}}}))
    history = History(tmp_path / "history.sqlite")
    session = Session(tmp_path, inventory=str(inventory), history=history)
    history.start("digits", name="digits")
    ended = datetime.now(timezone.utc).isoformat()
    history.update("digits", hosts=["th6"], status="completed", ended_at=ended)
    spawned: list[str] = []
    sys.addaudithook(lambda event, args: event == "subprocess.Popen" and spawned.append(str(args[1])))
    # following it to its end, fetching it, `forja status`: each learns it ended
    assert [cost_report.settle(session, "digits") for _ in range(3)] == [None, None, None]

    assert len([argv for argv in spawned if "ansible-inventory" in argv]) == 1, spawned
    assert [e.kind for e in history.events("digits")].count(cost_report.UNPRICED_EVENT) == 1
    assert history.get("digits").cost_usd is None  # unknown, never a made-up figure


def test_a_run_sent_again_keeps_its_rate_and_a_new_run_under_its_name_gets_its_own(tmp_path: Path) -> None:
    history = History(tmp_path / "history.sqlite")
    session = Session(tmp_path, history=history)
    moved = {"name": "forja-l4", "machine_type": "g2-standard-8", "zone": "europe-west4-a"}
    history.start("digits", name="digits", hosts=["forja-l4"])
    first = cost_report.price_run(session, history.get("digits"), [{**moved, "zone": "us-east1-d"}])
    # the managed watcher sends the run again on the VM it recreated in another region
    history.start("digits", name="digits", hosts=["forja-l4"])
    assert cost_report.price_run(session, history.get("digits"), [moved]) == first
    history.update("digits", status="completed", ended_at="2026-01-01T01:00:00+00:00")
    with sqlite3.connect(history.path) as db:  # that run was yesterday's, not this second's
        db.execute("UPDATE runs SET started_at = '2026-01-01T00:00:00+00:00'")
        db.execute("UPDATE run_events SET time = '2026-01-01T00:30:00+00:00'")

    # a new run under the ended run's name: the old run's events stay in the history, its rate does not
    history.start("digits", name="digits", hosts=["forja-l4"])
    again = cost_report.price_run(session, history.get("digits"), [moved])
    assert first is not None and again is not None and again.usd_per_hour > first.usd_per_hour
    assert [e.kind for e in history.events("digits")].count(PRICED_EVENT) == 2
