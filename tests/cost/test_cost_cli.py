"""`forja cost` as a user runs it (`python -m forja.cost` is the same command): a file of instances,
the real inventory, the rate lookup."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

NOW = "2026-11-20T14:30:00Z"
INSTANCES = [
    {
        "name": "forja-gpu",
        "zone": "us-east1-d",
        "machine_type": "g2-standard-8",
        "provisioning_model": "STANDARD",
        "status": "RUNNING",
        "creation_timestamp": "2026-11-20T08:00:00Z",
        "last_start_timestamp": "2026-11-20T13:00:00Z",
        "last_stop_timestamp": "2026-11-20T10:00:00Z",
        "boot_disk_size_gb": 300,
        "intervals": [
            {"start": "2026-11-20T08:00:00Z", "end": "2026-11-20T10:00:00Z"},
            {"start": "2026-11-20T13:00:00Z"},
        ],
    },
    {
        "name": "spot-box",
        "zone": "us-east1-d",
        "machine_type": "g2-standard-8",
        "provisioning_model": "SPOT",
        "status": "TERMINATED",
        "last_start_timestamp": "2026-11-20T09:00:00Z",
        "last_stop_timestamp": "2026-11-20T09:30:00Z",
        "boot_disk_size_gb": 100,
    },
]


def forja_cost(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "forja.cost", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=Path(__file__).parents[2],
    )


@pytest.fixture
def instances_file(tmp_path):
    path = tmp_path / "instances.yaml"
    path.write_text(yaml.safe_dump(INSTANCES))
    return path


def test_json_report_of_a_file_of_instances(instances_file):
    proc = forja_cost("--instances", str(instances_file), "--now", NOW, "--json", "--cap", "5")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    gpu, spot = report["instances"]
    assert gpu["usd_per_hour"] == pytest.approx(0.8536)
    assert gpu["uptime_s"] == 1.5 * 3600
    assert gpu["total_usd"] == pytest.approx(3.5 * 0.8536, abs=1e-6)
    assert gpu["budget"]["level"] == "ok"
    assert spot["spot"] and spot["session_usd"] == pytest.approx(0.5 * 0.56)
    assert spot["disk_usd_per_month"] == pytest.approx(10.0)
    assert report["prices_date"] == "2026-09-17"


def test_table_report_shows_every_instance_and_the_project_budget(instances_file):
    proc = forja_cost("--instances", str(instances_file), "--now", NOW, "--cap", "3", "--scope", "project")
    assert proc.returncode == 0, proc.stderr
    assert "forja-gpu" in proc.stdout and "spot-box" in proc.stdout
    assert "project: spend cap $3.00 reached (spent $3.27)" in proc.stdout


def test_bad_prices_file_is_a_usage_error_naming_the_entry(instances_file, tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("machine_types:\n  g2-standard-8:\n    us-east1: {spot: free}\n")
    proc = forja_cost("--instances", str(instances_file), "--prices", str(bad))
    assert proc.returncode == 2
    assert "machine_types.g2-standard-8.us-east1.spot" in proc.stderr


def test_rate_prints_the_hourly_price_for_people_and_in_full_as_json():
    query = ("rate", "--machine-type", "g2-standard-8", "--zone", "us-east1-d", "--spot")
    proc = forja_cost(*query)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("$0.56/h (g2-standard-8 spot in us-east1"), proc.stdout
    as_json = forja_cost("--json", *query)
    assert json.loads(as_json.stdout)["usd_per_hour"] == 0.56


def test_the_report_reads_the_ansible_inventory(tmp_path):
    inventory = tmp_path / "hosts.yml"
    host = {k: v for k, v in INSTANCES[0].items() if k != "name"}
    inventory.write_text(
        yaml.safe_dump({"all": {"hosts": {"forja-gpu": host, "laptop": {"ansible_host": "x"}}}})
    )
    proc = forja_cost("--inventory", str(inventory), "--now", NOW, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [i["name"] for i in report["instances"]] == ["forja-gpu"]
    assert report["skipped"] == ["laptop"]


def test_what_stopped_disks_still_cost_a_month_is_said_apart(instances_file):
    """The running VM's disk is in its month; the stopped one's is the bill people forget."""
    report = json.loads(forja_cost("--instances", str(instances_file), "--now", NOW, "--json").stdout)
    assert report["stopped_disks"] == {"instances": ["spot-box"], "usd_per_month": pytest.approx(10.0)}
    table = " ".join(forja_cost("--instances", str(instances_file), "--now", NOW).stdout.split())
    assert "stopped, disk still billed: $10.00/month (spot-box)" in table
