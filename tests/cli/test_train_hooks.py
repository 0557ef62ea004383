"""`forja train --hook EVENT=SCRIPT` and `Forja.train(hooks=...)`: a hook that cannot run is refused
before anything is recorded or sent, naming the field and the fix; a good one becomes the role's
trainer_run_hooks (typer's CliRunner in process; no host is contacted).

What the hooks do on the host is tests/training/test_launcher_hooks.py's; the role's own check of
the same inputs is tests/training/test_trainer_script_inputs.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from forja import host_contract
from forja.cli import app
from forja.errors import ConfigError, ExitCode
from forja.history import History
from forja.training import plan_hooks

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project with a script, an executable hook and one without its x bit."""
    folder = tmp_path / "project"
    (folder / "hooks").mkdir(parents=True)
    (folder / "train.py").write_text("print('training')\n")
    (folder / "hooks" / "push.sh").write_text("#!/bin/sh\necho pushed\n")
    (folder / "hooks" / "push.sh").chmod(0o755)
    (folder / "hooks" / "plain.sh").write_text("#!/bin/sh\necho plain\n")
    (folder / "hooks" / "plain.sh").chmod(0o644)
    return folder


def refused(project: Path, *hooks: str) -> dict:
    """`forja --json train --script train.py --project P --hook ...`: its error document (exit 2)."""
    argv = ["--json", "train", "--script", "train.py", "--project", str(project), "--detach"]
    for hook in hooks:
        argv += ["--hook", hook]
    result = runner.invoke(app, argv)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert History().list() == [], "bad input records no run"
    return json.loads(result.stdout)


def test_a_hook_without_its_x_bit_is_refused_naming_the_chmod(home: Path, project: Path) -> None:
    err = refused(project, "stop=hooks/plain.sh")
    assert err["field"] == "hooks"
    assert "stop=hooks/plain.sh is not executable" in err["message"]
    assert "chmod +x hooks/plain.sh" in err["message"]


def test_a_hook_missing_from_the_project_is_refused_naming_where_it_looked(home: Path, project: Path) -> None:
    err = refused(project, "preemption=hooks/psuh.sh")
    assert err["field"] == "hooks" and str(project / "hooks" / "psuh.sh") in err["message"]


def test_a_hook_outside_the_project_is_refused(home: Path, project: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.sh"
    outside.write_text("#!/bin/sh\n")
    outside.chmod(0o755)
    err = refused(project, f"down={outside}")
    assert err["field"] == "hooks" and "is not inside the project" in err["message"]


def test_an_unknown_event_is_refused_naming_the_events(home: Path, project: Path) -> None:
    err = refused(project, "preempted=hooks/push.sh")
    assert err["field"] == "hooks" and "'preempted' is not a hook event" in err["message"]
    for event in host_contract.value("hook_events"):
        assert event in err["message"]


@pytest.mark.parametrize("given", ["stop", "=hooks/push.sh", "stop="])
def test_a_hook_not_written_event_equals_script_is_bad_usage(home: Path, project: Path, given: str) -> None:
    err = refused(project, given)
    assert err["field"] == "--hook" and "EVENT=SCRIPT" in err["message"]


def test_one_script_per_event(home: Path, project: Path) -> None:
    err = refused(project, "stop=hooks/push.sh", "stop=hooks/plain.sh")
    assert err["field"] == "--hook" and "stop is given twice" in err["message"]


def test_a_hook_timeout_below_one_second_is_bad_usage(home: Path, project: Path) -> None:
    result = runner.invoke(app, ["--json", "train", "--script", "train.py", "--project", str(project),
                                 "--hook", "stop=hooks/push.sh", "--hook-timeout", "0"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert json.loads(result.stdout)["field"] == "hook_timeout_s" and History().list() == []


def test_hooks_need_the_project_they_travel_with() -> None:
    with pytest.raises(ConfigError) as info:
        plan_hooks({"stop": "hooks/push.sh"}, None)
    assert info.value.field == "hooks" and "--project" in info.value.message


def test_good_hooks_become_paths_relative_to_the_project(project: Path) -> None:
    """The role takes them so (trainer_run_hooks), whether given relative or absolute."""
    hooks = plan_hooks({"stop": "hooks/push.sh", "down": project / "hooks" / "push.sh"}, project)
    assert hooks == {"stop": "hooks/push.sh", "down": "hooks/push.sh"}
    assert plan_hooks(None, None) == {}
