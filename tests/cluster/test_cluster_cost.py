"""A cluster costs every member: `forja cost`, a run's cost, the estimate, the budget and the trainer's rate.

Real parts: the gcp_instance role makes a 2-VM cluster (g2-standard-24) and a lone VM (g2-standard-8)
on the Compute emulator over real HTTP; forja reads them through the gcp_gpu inventory plugin
(`ansible-inventory`), exactly as a user's inventory; the expected figures come from forja's price
table read here as plain YAML, so they do not come from the code under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_plays import role_play
from gcp_helpers import REPO, emulator_env, run_playbook

from forja.api import Forja
from forja.cost.spend import parse_time
from forja.history import History

PROJECT = "forja-sandbox"
TABLE = json.loads((REPO / "plugins/module_utils/forja_gcp_prices.json").read_text())
MEMBER_RATE = TABLE["machine_types"]["g2-standard-24"]["us-east1"]["on_demand"]
SOLO_RATE = TABLE["machine_types"]["g2-standard-8"]["us-east1"]["on_demand"]
DISK_GB_MONTH = TABLE["disks"]["pd-balanced"]["us-east1"]["per_gb_month"]
HOURS_PER_MONTH = TABLE.get("hours_per_month", 730)
FORJA = str(Path(sys.executable).with_name("forja"))  # the command a user runs
DISK_GB = yaml.safe_load((REPO / "roles/gcp_instance/defaults/main.yml").read_text())[
    "gcp_instance_boot_disk_size_gb"
]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The cluster `team` (2 × g2-standard-24) and the VM `solo`, made by the role, listed by the plugin."""
    from forja_sandbox.compute_emulator import ComputeEmulator

    root = tmp_path_factory.mktemp("cluster_cost")
    with ComputeEmulator() as emu, pytest.MonkeyPatch.context() as patch:
        env = emulator_env(emu, emu.write_service_account_key(root / "sa-key.json"))
        play = role_play(root)
        for extra in (("-e", "gcp_instance_name=team", "-e", "gcp_instance_count=2",
                       "-e", "gcp_instance_machine_type=g2-standard-24"),
                      ("-e", "gcp_instance_name=solo")):  # fmt: skip
            made = run_playbook(env, "localhost,", str(play), *extra)
            assert made.returncode == 0, made.stdout[-4000:]
        source = root / "forja.gcp_gpu.yml"
        source.write_text("plugin: forja.gpu.gcp_gpu\n")
        for key in ("FORJA_GCP_API_URL", "FORJA_GCP_CREDENTIALS_FILE", "FORJA_GCP_PROJECT"):
            patch.setenv(key, env[key])  # Forja reads the inventory with ansible-inventory, as a user does
        starts = {vm["name"]: parse_time(vm["lastStartTimestamp"]) for vm in emu.instances(PROJECT)}
        history = History(root / "history.sqlite")
        yield {"root": root, "env": env, "source": source, "emulator": emu, "starts": starts,
               "started": max(starts.values()),
               "forja": Forja(project_dir=root, inventory=source, history=history), "history": history}


def team_spend(made: dict[str, Any], now: datetime) -> float:
    """What the two members cost from their own last starts (the emulator's timestamps) until `now`."""
    return sum(MEMBER_RATE * (now - made["starts"][n]).total_seconds() / 3600 for n in ("team-0", "team-1"))


def test_forja_cost_adds_a_clusters_members_up_and_says_how_many(made):
    an_hour_later = made["started"] + timedelta(hours=1)
    report = made["forja"].cost(now=an_hour_later)
    assert sorted(line.name for line in report.lines) == ["solo", "team-0", "team-1"]
    [team] = report.clusters
    assert (team.name, team.members, team.machine, team.running) == ("team", ("team-0", "team-1"),
                                                                     "2 × g2-standard-24", 2)
    assert team.usd_per_hour == pytest.approx(2 * MEMBER_RATE)
    assert team.session_usd == pytest.approx(team_spend(made, an_hour_later), abs=1e-5)  # 2 × about an hour
    assert team.monthly_if_running_usd == pytest.approx(
        2 * (MEMBER_RATE * HOURS_PER_MONTH + DISK_GB * DISK_GB_MONTH), abs=1e-3)
    assert team.disk_usd_per_month == pytest.approx(2 * DISK_GB * DISK_GB_MONTH)


def test_the_cost_command_shows_the_cluster_as_a_count_of_its_machine_type(made):
    moment = (made["started"] + timedelta(hours=1)).isoformat()
    env = {**os.environ, "COLUMNS": "250"}
    def forja(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([FORJA, *args, "-i", str(made["source"]), "cost", "--now", moment],
                              capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)

    shown = forja()
    assert shown.returncode == 0, shown.stderr[-2000:]
    row = next(line for line in shown.stdout.splitlines() if "cluster team" in line)
    assert "2 × g2-standard-24" in row and "2/2 running" in row
    assert f"${2 * MEMBER_RATE:.2f}/h" in row
    [team] = json.loads(forja("--json").stdout)["clusters"]
    assert (team["count"], team["machine"]) == (2, "2 × g2-standard-24")
    assert team["usd_per_hour"] == 2 * MEMBER_RATE


def test_a_per_instance_cap_counts_a_clusters_members_together(made):
    an_hour_later = made["started"] + timedelta(hours=1)
    cap = 1.5 * MEMBER_RATE  # above one member's hour, below the cluster's two
    report = made["forja"].cost(now=an_hour_later, cap=cap)
    levels = {line.name: chk.level.value for line, chk in zip(report.lines, report.checks, strict=True)}
    assert levels == {"solo": "ok", "team-0": "cap", "team-1": "cap"}
    checks = {line.name: chk for line, chk in zip(report.lines, report.checks, strict=True)}
    assert checks["team-0"] is checks["team-1"]
    assert checks["team-0"].spend_usd == pytest.approx(team_spend(made, an_hour_later), abs=1e-5)


def record(made: dict[str, Any], run_id: str, hosts: list[str], seconds: float) -> None:
    history = made["history"]
    began = history.start(run_id, name=run_id, hosts=hosts, config_path="", config_hash="").started_at
    ended = datetime.fromisoformat(began) + timedelta(seconds=seconds)
    history.update(run_id, status="completed", ended_at=ended.isoformat())


def test_a_run_recorded_on_rank_0_costs_the_whole_cluster(made):
    record(made, "team-run", ["team-0"], 1800)
    cost = made["forja"].run_cost("team-run")
    assert cost.vm_count == 2
    assert cost.usd_per_hour == pytest.approx(2 * MEMBER_RATE)
    assert cost.rate_source.startswith("2 × g2-standard-24 on_demand in us-east1")
    assert cost.vm_usd == pytest.approx(2 * MEMBER_RATE * 1800 / 3600)
    assert cost.disk_usd == pytest.approx(2 * DISK_GB * DISK_GB_MONTH * 1800 / 3600 / HOURS_PER_MONTH)

    record(made, "solo-run", ["solo"], 1800)
    alone = made["forja"].run_cost("solo-run")
    assert (alone.vm_count, alone.usd_per_hour) == (1, SOLO_RATE)


def test_the_estimate_before_sending_counts_every_vm_it_will_keep_up(made, tmp_path):
    config = tmp_path / "digits.yaml"
    config.write_text(yaml.safe_dump({"model": "trainer.demo:digits_cnn", "data": "trainer.demo:digits",
                                      "steps": 10}))  # fmt: skip
    found = made["forja"].estimate(config)
    assert found.usd_per_hour == pytest.approx(2 * MEMBER_RATE + SOLO_RATE)
    assert found.rate_what == "g2-standard-8 on_demand in us-east1 + 2 × g2-standard-24 on_demand in us-east1"
    assert "2 × g2-standard-24" in found.describe()


def test_the_trainer_of_a_cluster_member_gets_the_clusters_rate(made):
    """trainer_run's rate tasks on the inventory's hosts (local connection)."""
    work = made["root"] / "rate"
    work.mkdir()
    play = work / "play.yml"
    play.write_text(yaml.safe_dump([{
        "name": "Decide each host's hourly rate as trainer_run does",
        "hosts": "forja_gpu",
        "connection": "local",
        "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable},
        "tasks": [
            {"name": "Decide the rate as the role does",
             "ansible.builtin.include_role": {"name": "forja.gpu.trainer_run", "tasks_from": "price.yml",
                                              "public": True}},
            {"name": "Write down the rate the role decided (what its env file hands the trainer)",
             "ansible.builtin.copy": {"content": "{{ trainer_run_price_per_hour_used }}",
                                      "dest": str(work / "{{ inventory_hostname }}.rate"), "mode": "0600"}},
        ],
    }]))  # fmt: skip
    ran = run_playbook(made["env"], made["source"], str(play))
    assert ran.returncode == 0, ran.stdout[-4000:]
    rates = {}
    for host in ("team-0", "team-1", "solo"):
        rates[host] = float((work / f"{host}.rate").read_text())
    assert rates == {"team-0": pytest.approx(2 * MEMBER_RATE), "team-1": pytest.approx(2 * MEMBER_RATE),
                     "solo": pytest.approx(SOLO_RATE)}  # fmt: skip
