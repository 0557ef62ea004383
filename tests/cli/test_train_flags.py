"""`forja train` flags: --script and its arguments after --, --detach, --timeout, and the checks that
refuse bad input before anything is sent (typer's CliRunner in process; no host is contacted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from forja.api import Forja
from forja.cli import app
from forja.errors import ConfigError, ExitCode
from forja.history import History
from forja.training import plan_run

REPO = Path(__file__).resolve().parents[2]
DIGITS = str(REPO / "trainer/configs/digits.yaml")
runner = CliRunner()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    (folder / "src").mkdir(parents=True)
    (folder / "train.py").write_text("print('training')\n")
    (folder / "src" / "loop.py").write_text("print('loop')\n")
    return folder


def error(result: object) -> dict:
    return json.loads(result.stdout)  # type: ignore[attr-defined]


def test_a_script_missing_from_the_project_is_refused_naming_the_path_and_the_fix(
    home: Path, project: Path
) -> None:
    result = runner.invoke(app, ["--json", "train", "--script", "tran.py", "--project", str(project)])
    assert result.exit_code == ExitCode.USAGE
    err = error(result)
    assert err["field"] == "script"
    assert str(project / "tran.py") in err["message"] and "relative to the project folder" in err["message"]
    assert History().list() == [], "bad input changes nothing"


def test_a_script_outside_the_project_is_refused(home: Path, project: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere.py").write_text("")
    result = runner.invoke(app, ["--json", "train", "--script", "../elsewhere.py", "--project", str(project)])
    assert result.exit_code == ExitCode.USAGE
    assert error(result)["field"] == "script" and "not inside the project" in error(result)["message"]


def test_neither_a_config_nor_a_script_is_bad_usage(home: Path, project: Path) -> None:
    result = runner.invoke(app, ["--json", "train", "--project", str(project)])
    assert result.exit_code == ExitCode.USAGE
    assert error(result)["field"] == "config" and "--script" in error(result)["message"]


def test_arguments_after_the_double_dash_need_a_script(home: Path) -> None:
    result = runner.invoke(app, ["--json", "train", DIGITS, "--", "--lr", "1"])
    assert result.exit_code == ExitCode.USAGE
    assert error(result)["field"] == "args"


def test_everything_after_the_double_dash_belongs_to_the_script(home: Path, project: Path) -> None:
    # The bad --name before `--` is what fails: `--name`, `--lr` after it never reach forja's options
    # or its config argument.
    result = runner.invoke(app, ["--json", "train", "--script", "train.py", "--project", str(project),
                                 "--name", "bad name", "--", "--name", "x", "--lr", "3e-4"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert error(result)["field"] == "name"


def test_a_negative_timeout_is_bad_usage(home: Path) -> None:
    result = runner.invoke(app, ["--json", "train", DIGITS, "--timeout", "-5"])
    assert result.exit_code == ExitCode.USAGE
    assert error(result)["field"] == "timeout_s"
    assert History().list() == []


def test_zero_processes_is_bad_usage(home: Path) -> None:
    result = runner.invoke(app, ["--json", "train", DIGITS, "--procs", "0"])
    assert result.exit_code == ExitCode.USAGE
    assert error(result)["field"] == "procs" and History().list() == []


def test_a_wait_limit_given_with_e_is_checked_not_ignored(home: Path) -> None:
    result = runner.invoke(app, ["--json", "-e", "trainer_run_wait_timeout_s=soon", "train", DIGITS])
    assert result.exit_code == ExitCode.USAGE
    assert error(result)["field"] == "trainer_run_wait_timeout_s"


def test_the_script_and_its_arguments_become_the_role_s_command(project: Path) -> None:
    plan = plan_run(None, "src/loop.py", ["--lr", "3e-4"], project)
    assert plan.extravars == {"trainer_run_command": ["src/loop.py", "--lr", "3e-4"]}
    assert plan.name_source.stem == "loop", "the run name defaults from the script's name"


def test_a_script_may_come_with_a_config(project: Path) -> None:
    config = project / "c.yaml"
    config.write_text(yaml.safe_dump({"steps": 1}))
    plan = plan_run(config, project / "train.py", [], project)
    assert plan.extravars == {"trainer_run_config": str(config), "trainer_run_command": ["train.py"]}


def test_a_script_needs_a_project_to_travel_with(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        plan_run(None, "train.py", [], None)
    assert info.value.field == "script" and "--project" in info.value.message


def test_detach_on_an_inventory_without_gpu_hosts_fails_and_records_the_run_named_after_the_script(
    home: Path, project: Path, tmp_path: Path
) -> None:
    # No GPU host in this inventory: playbooks/require_hosts.yml stops train.yml (Ansible alone
    # skipped the play, exited 0, and the run read as started).
    inventory = tmp_path / "inv.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"forja_gpu": {"hosts": {}}}}}))
    result = runner.invoke(app, ["-i", str(inventory), "--json", "train", "--script", "train.py",
                                 "--project", str(project), "--detach", "--", "--lr", "3e-4"])
    assert result.exit_code == 1, result.output
    assert "No host to act on: 'forja_gpu' matches no host" in " ".join(result.output.split())
    (record,) = History().list()
    assert record.run_id.startswith("train-") and record.status == "failed"
    assert record.config_path == str(project / "train.py")


def test_following_has_no_limit_unless_one_is_asked_for(tmp_path: Path) -> None:
    f = Forja(project_dir=tmp_path, history=History(tmp_path / "h.sqlite"))
    assert f.follow_limit(None) is None and f.follow_limit(0) is None
    assert f.follow_limit(90) == 90
    limited = Forja(project_dir=tmp_path, history=f.history, extravars={"trainer_run_wait_timeout_s": 7200})
    assert limited.follow_limit(None) == 7200, "-e trainer_run_wait_timeout_s is the limit, not overridden"
    assert limited.follow_limit(60) == 60, "an explicit --timeout wins"
