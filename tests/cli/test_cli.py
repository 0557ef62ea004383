"""The `forja` command: exit codes, --json output and tables, run for real (typer's CliRunner in
process for fast cases, the installed `forja` entry point against a real test host for the rest)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from forja.cli import app
from forja.errors import ExitCode
from forja.history import History
from forja_sandbox import testhosts

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def inventory(path: Path, hosts: dict[str, dict[str, object]]) -> Path:
    path.write_text(yaml.safe_dump({"all": {"children": {"forja_gpu": {"hosts": hosts}}}}))
    return path


def test_help_lists_every_command_and_the_exit_codes() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("up", "configure", "tunnel", "train", "status", "logs", "fetch", "down", "runs"):
        assert command in result.output
    assert "Exit codes" in result.output


def test_runs_lists_the_history_as_json_including_stopped_runs(home: Path) -> None:
    history = History()
    history.start("digits-1", name="digits-1", hosts=["th6"])
    history.update("digits-1", status="completed", steps=300, last_loss=0.04)
    history.start("mnist-1", name="mnist-1", hosts=["th6"])
    history.record_event("mnist-1", "preempted", lost_steps=12)
    history.update("mnist-1", status="preempted")
    result = runner.invoke(app, ["--json", "runs"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["run_id"], r["status"]) for r in rows] == [("mnist-1", "preempted"), ("digits-1", "completed")]
    assert rows[0]["preemptions"] == 1 and rows[0]["lost_steps"] == 12


def test_runs_prints_a_table_for_people(home: Path) -> None:
    History().start("digits-1", name="digits-1", hosts=["th6"])
    result = runner.invoke(app, ["runs"])
    assert result.exit_code == 0 and "digits-1" in result.output and "running" in result.output


def test_a_missing_config_is_bad_usage_naming_the_field(home: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["--json", "train", str(tmp_path / "nope.yaml")])
    assert result.exit_code == ExitCode.USAGE
    error = json.loads(result.stdout)
    assert error["error"] == "ConfigError" and error["field"] == "config"
    assert History().list() == [], "bad input changes nothing"


def test_a_bad_run_status_filter_is_bad_usage(home: Path) -> None:
    result = runner.invoke(app, ["runs", "--status", "exploded"])
    assert result.exit_code != 0


def test_an_unreachable_host_exits_3_and_names_it(home: Path, tmp_path: Path) -> None:
    inv = inventory(tmp_path / "inv.yml", {"ghost": {"ansible_host": "127.0.0.1", "ansible_port": 1}})
    result = runner.invoke(app, ["-i", str(inv), "--no-host-key-checking", "--json", "status"])
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    error = json.loads(result.stdout)
    assert error["error"] == "HostUnreachable" and error["host"] == "ghost"


def test_tunnel_prints_the_ssh_command_and_a_colab_url_without_the_token(home: Path, tmp_path: Path) -> None:
    host = {"ansible_host": "10.213.0.17", "ansible_user": "ansible", "ansible_ssh_private_key_file": "/k"}
    inv = inventory(tmp_path / "inv.yml", {"th7": host})
    result = runner.invoke(app, ["-i", str(inv), "--json", "tunnel", "--print"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["command"][0] == "ssh" and "127.0.0.1:8888:127.0.0.1:8888" in plan["command"]
    assert plan["command"][-1] == "ansible@10.213.0.17"
    assert plan["colab_url"] == "http://localhost:8888/?token=<token>"


def test_tunnel_uses_iap_when_asked(home: Path, tmp_path: Path) -> None:
    inv = inventory(tmp_path / "inv.yml", {"forja-gpu-1": {"zone": "us-east1-d"}})
    result = runner.invoke(app, ["-i", str(inv), "--json", "tunnel", "--print", "--iap"])
    plan = json.loads(result.stdout)
    assert plan["command"][:5] == ["gcloud", "compute", "ssh", "forja-gpu-1", "--tunnel-through-iap"]
    assert "--zone=us-east1-d" in plan["command"]


def test_tunnel_refuses_unequal_ports_because_colab_needs_them_equal(home: Path, tmp_path: Path) -> None:
    inv = inventory(tmp_path / "inv.yml", {"th7": {"ansible_host": "10.213.0.17"}})
    result = runner.invoke(app, ["-i", str(inv), "--json", "tunnel", "--print", "--local-port", "9999"])
    assert result.exit_code == ExitCode.USAGE
    assert json.loads(result.stdout)["field"] == "--local-port"


@pytest.fixture(scope="module")
def th7() -> Iterator[testhosts.Host]:
    if os.geteuid() != 0:
        pytest.skip("test hosts need root")
    host = testhosts.up(7)
    try:
        yield host
    finally:
        testhosts.down(7)


@pytest.mark.hosts
def test_the_installed_command_reads_a_real_host(th7: testhosts.Host, tmp_path: Path) -> None:
    inv = inventory(tmp_path / "inv.yml", {"th7": {
        "ansible_host": th7.address, "ansible_user": th7.user, "ansible_ssh_private_key_file": str(th7.key)}})
    env = {**os.environ, "FORJA_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        ["forja", "-i", str(inv), "--no-host-key-checking", "--json", "status"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], "a fresh host has no training runs"
    proc = subprocess.run(
        ["forja", "-i", str(inv), "--no-host-key-checking", "--json", "logs", "no-such-run"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout) == {}
