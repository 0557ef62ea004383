"""The `forja` command: exit codes, --json output and tables, run for real (typer's CliRunner in
process for fast cases, the installed `forja` entry point against a real test host for the rest)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from forja import format as fmt
from forja.api import Forja
from forja.cli import EXIT_CODES_HELP, app
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


#: Every verb of the command and the `Forja` method it calls.
VERBS = {"up": Forja.up, "configure": Forja.configure, "down": Forja.down, "train": Forja.train,
         "follow": Forja.follow, "status": Forja.status, "logs": Forja.logs, "fetch": Forja.fetch,
         "stop": Forja.stop, "runs": Forja.runs, "tunnel": Forja.tunnel, "cost": Forja.cost,
         "prune": Forja.prune}


def test_help_lists_every_command_and_the_exit_codes() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in VERBS:
        assert command in result.output
    assert "Exit codes" in result.output
    for code in ExitCode:  # each one, said for people
        assert f" {code.value} " in EXIT_CODES_HELP.replace(",", " "), code


@pytest.mark.parametrize("command", sorted(VERBS))
def test_a_verbs_help_is_its_own_not_the_api_docstring(command: str) -> None:
    """The API's docstring speaks Python (`wait=False`, `timeout_s`); the verb's help is written for
    the command line (tests/cli/test_cli_help.py checks its words)."""
    result = runner.invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    first_paragraph = " ".join((inspect.getdoc(VERBS[command]) or "").split("\n\n")[0].split())
    assert first_paragraph and first_paragraph not in " ".join(result.output.split())


def test_cost_rate_is_forja_rate(home: Path) -> None:
    shown = runner.invoke(app, ["cost", "rate", "--machine-type", "g2-standard-8", "--zone", "us-east1-d"])
    exact = runner.invoke(app, ["--json", "cost", "rate", "--machine-type", "g2-standard-8",
                                "--zone", "us-east1-d"])
    usd = json.loads(exact.stdout)["usd_per_hour"]
    assert shown.exit_code == 0 and shown.stdout.startswith(fmt.hourly(usd) + " (")


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


#: The digits demo's figures on the sandbox, as `forja runs` once printed them in full.
LOSS, COST = 0.008180368691682816, 0.0019884954039891124


def test_runs_shows_loss_and_cost_for_people_and_json_keeps_every_digit(home: Path) -> None:
    History().start("digits-1", name="digits-1", hosts=["th6"])
    History().update("digits-1", status="completed", steps=12000, last_loss=LOSS, cost_usd=COST)
    table = runner.invoke(app, ["runs"], terminal_width=200)
    assert table.exit_code == 0, table.output
    assert "0.008180" in table.output and "0.2¢" in table.output and "12,000" in table.output
    assert "0.0081803" not in table.output and "0.0019884" not in table.output
    (row,) = json.loads(runner.invoke(app, ["--json", "runs"]).stdout)
    assert (row["last_loss"], row["cost_usd"], row["steps"]) == (LOSS, COST, 12000)


INSTANCE = {"name": "forja-l4", "zone": "us-east1-d", "machine_type": "g2-standard-8",
            "provisioning_model": "STANDARD", "status": "RUNNING", "boot_disk_size_gb": 300,
            "last_start_timestamp": "2026-11-20T13:00:00Z"}


def test_cost_shows_rates_and_money_for_people_and_json_keeps_every_digit(home: Path, tmp_path: Path) -> None:
    instances = tmp_path / "instances.yml"
    instances.write_text(yaml.safe_dump([INSTANCE]))
    args = ["cost", "--instances", str(instances), "--now", "2026-11-20T15:05:00Z"]
    exact = runner.invoke(app, ["--json", *args])
    assert exact.exit_code == 0, exact.output
    (line,) = json.loads(exact.stdout)["instances"]
    table = runner.invoke(app, args, terminal_width=200)
    assert table.exit_code == 0, table.output
    row = next(r for r in table.stdout.splitlines() if "forja-l4" in r)
    for key, show in (("usd_per_hour", fmt.hourly), ("uptime_s", fmt.duration), ("session_usd", fmt.money),
                      ("monthly_if_running_usd", fmt.money), ("disk_usd_per_month", fmt.money)):
        assert show(line[key]) in row, (key, line[key], row)
    assert "2h 05m" in row, "2 h 5 min of uptime"


def test_a_bad_cost_scope_is_bad_usage_naming_the_field(home: Path, tmp_path: Path) -> None:
    instances = tmp_path / "instances.yml"
    instances.write_text(yaml.safe_dump([INSTANCE]))
    result = runner.invoke(app, ["--json", "cost", "--instances", str(instances), "--scope", "everything"])
    assert result.exit_code == ExitCode.USAGE
    assert json.loads(result.stdout)["field"] == "scope"


def test_a_missing_config_is_bad_usage_naming_the_field(home: Path, tmp_path: Path) -> None:
    inv = inventory(tmp_path / "inv.yml", {})
    result = runner.invoke(app, ["-i", str(inv), "--json", "train", str(tmp_path / "nope.yaml")])
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


@pytest.fixture(scope="module")
def served_th7(th7: testhosts.Host) -> testhosts.Host:
    """th7 as `forja configure` leaves it for `forja tunnel`: the notebook server's configuration
    (the port it serves) and its token, where the jupyter_colab role writes them."""
    script = ("sudo install -d -m 0755 /etc/forja/jupyter && echo '{\"NotebookApp\": {\"port\": 8888}}' "
              "| sudo tee /etc/forja/jupyter/jupyter_notebook_config.json >/dev/null && "
              "sudo install -d -m 0700 /var/lib/forja/jupyter && "
              "printf tok3n | sudo tee /var/lib/forja/jupyter/token >/dev/null")
    subprocess.run(th7.ssh_argv(script), check=True, timeout=60)
    return th7


def tunnel(host: testhosts.Host, tmp_path: Path, *args: str) -> Any:
    """`forja --json tunnel --print ARGS` against th7, the token copied into tmp_path, not ~/.config."""
    inv = inventory(tmp_path / "inv.yml", {"th7": {
        "ansible_host": host.address, "ansible_user": host.user,
        "ansible_ssh_private_key_file": str(host.key), "zone": "us-east1-d"}})
    token = tmp_path / "th7.jupyter-token"
    fetch_to = f"jupyter_colab_token_fetch_path={token}"
    return runner.invoke(app, ["-i", str(inv), "--no-host-key-checking", "-e", fetch_to,
                               "--json", "tunnel", "--print", *args])


@pytest.mark.hosts
def test_tunnel_prints_the_ssh_command_and_a_colab_url_without_the_token(
    served_th7: testhosts.Host, home: Path, tmp_path: Path
) -> None:
    result = tunnel(served_th7, tmp_path)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["command"][0] == "ssh" and "8888:127.0.0.1:8888" in plan["command"]
    assert plan["command"][-1] == f"ansible@{served_th7.address}"
    assert plan["colab_url"] == "http://localhost:8888/?token=<token>"


@pytest.mark.hosts
def test_tunnel_puts_the_token_in_the_url_only_when_asked(
    served_th7: testhosts.Host, home: Path, tmp_path: Path
) -> None:
    shown = tunnel(served_th7, tmp_path, "--show-token")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["colab_url"] == "http://localhost:8888/?token=tok3n"


@pytest.mark.hosts
def test_tunnel_prints_gcloud_when_asked(served_th7: testhosts.Host, home: Path, tmp_path: Path) -> None:
    result = tunnel(served_th7, tmp_path, "--gcloud")
    assert result.exit_code == 0, result.output
    command = json.loads(result.stdout)["command"]
    assert command[:3] == ["gcloud", "compute", "ssh"] and "--tunnel-through-iap" in command
    assert "us-east1-d" in command


@pytest.mark.hosts
def test_tunnel_refuses_unequal_ports_because_colab_needs_them_equal(
    served_th7: testhosts.Host, home: Path, tmp_path: Path
) -> None:
    result = tunnel(served_th7, tmp_path, "--local-port", "9999")
    assert result.exit_code == ExitCode.USAGE
    assert json.loads(result.stdout)["field"] == "--local-port"


@pytest.mark.parametrize("pair", ["a key=1", "key\nwith_newline=1", "1st=1", "=1", "no_equals"])
def test_an_extra_var_that_names_no_variable_is_refused(home: Path, pair: str) -> None:
    result = runner.invoke(app, ["-e", pair, "runs"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "--extra-var/-e" in result.output
