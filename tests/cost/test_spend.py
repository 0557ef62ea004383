"""Spend from known uptimes and prices, including a stop and start in the middle."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from forja.cost.prices import load_prices
from forja.cost.spend import (
    Instance,
    Interval,
    billed_seconds,
    compute_spend,
    cost_of,
    cost_report,
    disk_spend,
)

T0 = datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)
L4_US = 0.8536  # g2-standard-8 on demand, us-east1 (the note's figure)


@pytest.fixture(scope="module")
def prices():
    return load_prices(env={})


def test_three_hours_running_cost_three_hours_of_the_rate():
    assert compute_spend(L4_US, [Interval(T0, T0 + 3 * H)], now=T0 + 10 * H) == pytest.approx(2.5608)


def test_a_stop_and_start_in_the_middle_bills_only_the_running_stretches():
    # 08:00-10:00 running, stopped until 13:00, running again since then; now 14:30.
    intervals = [Interval(T0, T0 + 2 * H), Interval(T0 + 5 * H, None)]
    now = T0 + 6.5 * H
    assert billed_seconds(intervals, now) == 3.5 * 3600
    assert compute_spend(L4_US, intervals, now) == pytest.approx(3.5 * L4_US)


def test_each_start_bills_at_least_one_minute():
    blips = [Interval(T0, T0 + timedelta(seconds=20)), Interval(T0 + H, T0 + H + timedelta(seconds=90))]
    assert billed_seconds(blips, T0 + 2 * H) == 60 + 90


def test_a_disk_costs_its_monthly_price_over_730_hours_running_or_not():
    assert disk_spend(0.10, 300, seconds=730 * 3600) == pytest.approx(30.0)
    assert disk_spend(0.10, 300, seconds=73 * 3600) == pytest.approx(3.0)


def hostvars(**over):
    """Hostvars as forja's gcp_gpu inventory writes them."""
    base = {
        "name": "forja-gpu",
        "zone": "us-east1-d",
        "machine_type": "g2-standard-8",
        "gpu_type": "nvidia-l4",
        "gpu_count": 1,
        "provisioning_model": "STANDARD",
        "status": "RUNNING",
        "creation_timestamp": "2026-11-20T00:00:00.000-08:00",  # = T0
        "last_start_timestamp": "2026-11-20T05:00:00.000-08:00",  # = T0 + 5 h
        "last_stop_timestamp": "2026-11-20T02:00:00.000-08:00",  # = T0 + 2 h
        "boot_disk_size_gb": 300,
        "boot_disk_type": "pd-balanced",
    }
    return {**base, **over}


def test_a_running_instance_reports_rate_uptime_spend_month_and_disk(prices):
    line = cost_of(Instance.from_mapping(hostvars()), prices, now=T0 + 6.5 * H)
    assert line.usd_per_hour == pytest.approx(L4_US)  # the L4 is in the G2 price: not added twice
    assert line.uptime_s == 1.5 * 3600
    assert line.session_usd == pytest.approx(1.5 * L4_US)
    assert line.disk_usd_per_month == pytest.approx(30.0)
    assert line.monthly_if_running_usd == pytest.approx(730 * L4_US + 30.0)
    assert line.disk_usd_so_far == pytest.approx(30.0 * 6.5 / 730, abs=1e-6)  # rounded to 6 places
    assert line.total_usd is None  # no history given


def test_the_history_gives_the_total_across_a_stop_and_start(prices):
    history = [
        {"start": "2026-11-20T08:00:00Z", "end": "2026-11-20T10:00:00Z"},
        {"start": "2026-11-20T13:00:00Z"},
    ]
    line = cost_of(Instance.from_mapping(hostvars(intervals=history)), prices, now=T0 + 6.5 * H)
    assert line.total_usd == pytest.approx(3.5 * L4_US)
    assert line.session_usd == pytest.approx(1.5 * L4_US)


def test_a_stopped_instance_costs_only_its_disk_now(prices):
    stopped = hostvars(status="TERMINATED", last_stop_timestamp="2026-11-20T06:00:00-08:00")
    line = cost_of(Instance.from_mapping(stopped), prices, now=T0 + 10 * H)
    assert line.uptime_s == 0
    assert line.session_usd == pytest.approx(1.0 * L4_US)  # its last run, 05:00-06:00
    assert line.disk_usd_per_month == pytest.approx(30.0)


def test_spot_uses_the_spot_price(prices):
    line = cost_of(Instance.from_mapping(hostvars(provisioning_model="SPOT")), prices, now=T0 + 6 * H)
    assert line.spot and line.usd_per_hour == pytest.approx(0.56)


def test_the_compute_api_json_works_as_well(prices):
    api = {
        "name": "t4-box",
        "zone": "https://compute.googleapis.com/compute/v1/projects/p/zones/europe-west4-a",
        "machineType": "projects/p/zones/europe-west4-a/machineTypes/n1-standard-8",
        "status": "RUNNING",
        "scheduling": {"provisioningModel": "STANDARD"},
        "lastStartTimestamp": "2026-11-20T08:00:00.000+00:00",
        "guestAccelerators": [
            {
                "acceleratorType": "zones/europe-west4-a/acceleratorTypes/nvidia-tesla-t4",
                "acceleratorCount": 1,
            }
        ],
        "disks": [{"diskSizeGb": "100", "boot": True}],
    }
    line = cost_of(Instance.from_mapping(api), prices, now=T0 + 2 * H)
    assert line.usd_per_hour == pytest.approx(0.418 + 0.385)
    assert line.session_usd == pytest.approx(2 * (0.418 + 0.385))
    assert line.disk_usd_per_month == pytest.approx(100 * 0.11)  # pd-balanced assumed


def test_unknown_disks_are_reported_as_unknown_not_free(prices):
    raw = {k: v for k, v in hostvars().items() if not k.startswith("boot_disk")}
    line = cost_of(Instance.from_mapping(raw), prices, now=T0 + 6 * H)
    assert line.disk_usd_per_month is None and line.disk_usd_so_far is None


def test_a_report_error_names_the_instance(prices):
    with pytest.raises(ValueError, match=r"^forja-gpu: .*'zone'"):
        cost_report([hostvars(zone="")], prices, now=T0)
