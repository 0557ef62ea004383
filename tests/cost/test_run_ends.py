"""The ends of a run that were never settled: a send that fails, and a preempted run that resumes.

Real parts: forja train's own send (train.yml through forja's runner) to a host that fails it, with a
real history, settled where forja.training records the end; and a real history taking a preempted run's
events in the order forja records them (the host's "preempted" seen by `forja status`, the managed
watcher's ``restarted`` and ``zone_moved`` with its counted time down, the zone move's send of the run
again, the host's "completed"), settled by forja.cost_report.settle at each end. The expected figures
come from the price table read here as plain JSON and the history's own timestamps.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

from forja import cost_report, errors, runstate, training
from forja.api import Forja
from forja.cost.run import PRICED_EVENT
from forja.history import History, RunRecord
from forja.session import Session

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "trainer" / "configs" / "digits.yaml"
TABLE = json.loads((REPO / "plugins/module_utils/forja_gcp_prices.json").read_text())
HOURS_PER_MONTH = TABLE.get("hours_per_month", 730)
SPOT = TABLE["machine_types"]["g2-standard-8"]["us-east1"]["spot"]
#: The VM's 300 GB boot disk, USD an hour.
DISK_HOUR = TABLE["disks"]["pd-balanced"]["us-east1"]["per_gb_month"] * 300 / HOURS_PER_MONTH
#: The VM's hostvars as the gcp_gpu inventory plugin sets them (what prices it).
PRICE = {"machine_type": "g2-standard-8", "zone": "us-east1-d", "gpu_type": "nvidia-l4", "gpu_count": 1,
         "provisioning_model": "SPOT", "preemptible": True, "boot_disk_size_gb": 300}
#: A VM nothing answers on, and one that answers and fails the send's first task (its Python is missing).
NOBODY = {"ansible_host": "127.0.0.1", "ansible_port": 1}
FAILS = {"ansible_connection": "local", "ansible_python_interpreter": "/nonexistent/python3"}


def seconds(record: RunRecord) -> float:
    """The run's span, from the history's own timestamps."""
    assert record.ended_at is not None
    span = datetime.fromisoformat(record.ended_at) - datetime.fromisoformat(record.started_at)
    return span.total_seconds()


@pytest.mark.parametrize(("vm", "raised"), [(NOBODY, errors.HostUnreachable), (FAILS, errors.PlaybookFailed)],
                         ids=["reached-no-vm", "failed-on-its-vm"])
def test_a_send_that_fails_is_settled_at_its_end_its_vm_time_or_0_saying_so(
    tmp_path: Path, vm: dict[str, object], raised: type[errors.ForjaError]
) -> None:
    inventory = tmp_path / "inv.yml"
    hosts = {"l4": {**vm, **PRICE}}
    inventory.write_text(yaml.safe_dump({"all": {"children": {"forja_gpu": {"hosts": hosts}}}}))
    forja = Forja(project_dir=tmp_path, inventory=inventory, host_key_checking=False,
                  private_data_dir=tmp_path / "runner", history=History(tmp_path / "h.sqlite"))

    with pytest.raises(raised):
        forja.train(DIGITS, name="digits")

    record, events = forja.history.get("digits"), forja.history.events("digits")
    (priced,) = [e.data for e in events if e.kind == PRICED_EVENT]
    assert [e.kind for e in events].count(cost_report.SETTLED_EVENT) == 1
    assert record.status == "failed" and record.ended_at is not None
    settled = cost_report.settled_cost(forja.history, "digits")
    if vm is NOBODY:
        assert settled == record.cost_usd == 0.0, "a figure, not none"
        assert priced["source"] == training.NO_VM, "and why it is 0"
    else:  # its VM was up for it: billed from the run's record to its end, failed or not
        assert settled == record.cost_usd == pytest.approx((SPOT + DISK_HOUR) * seconds(record) / 3600)
        assert priced["usd_per_hour"] == SPOT


def test_a_preempted_run_the_watcher_brings_back_ends_where_it_ends_less_its_time_down(
    tmp_path: Path,
) -> None:
    history = History(tmp_path / "history.sqlite")
    session = Session(tmp_path, history=history)
    began = datetime.now().astimezone() - timedelta(hours=1)

    def host(status: str) -> runstate.RunState:
        state = runstate.parse({runstate.SCHEMA_KEY: 1, "run": "r", "status": status,
                                "configured_at": began.isoformat(timespec="seconds")})
        assert state is not None
        return state

    def seen_preempted(minutes: int) -> None:  # what `forja status` records of the host then, and settles
        history.update("r", status="preempted", ended_at=(began + timedelta(minutes=minutes)).isoformat())
        assert cost_report.settle(session, "r") is not None

    history.record_host_run(host("running"), hosts=["l4"])  # a run started an hour ago
    cost_report.price_run(session, history.get("r"), [{"name": "l4", **PRICE}])
    seen_preempted(20)
    history.record_event("r", "preempted", seconds_down=0.0)  # the watcher's events, its tally cumulative
    history.record_event("r", "restarted", seconds_down=300.0)
    assert (history.get("r").status, history.get("r").ended_at) == ("running", None)
    assert cost_report.settled_cost(history, "r") is None, "going on: no settled cost"
    seen_preempted(40)
    history.record_event("r", "preempted", seconds_down=300.0)
    history.record_event("r", "zone_moved", seconds_down=900.0)
    history.start("r", name="r")  # the zone move sends it again: the same run, its first start stands
    history.record_host_run(host("completed"), hosts=["l4"])

    found = cost_report.settle(session, "r")
    record = history.get("r")
    assert found is not None and record.status == "completed"
    assert datetime.fromisoformat(record.started_at) == began.replace(microsecond=0)
    span = seconds(record)
    assert span >= 3600
    assert (found.down_s, found.preemptions, found.zone_moves) == (900.0, 2, 1)
    assert cost_report.settled_cost(history, "r") == pytest.approx(
        SPOT * (span - 900) / 3600 + DISK_HOUR * span / 3600), "every boot's VM time, the disk all along"
