"""autostop_delete_after, checked by the autostop role before anything is written: a duration no shorter
than the idle window, or '' (off). The prune that acts on it is tests/gcp/test_prune.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from localplay import REPO

ROLE = REPO / "roles/autostop"


def validate(tmp_path: Path, **given: object) -> subprocess.CompletedProcess[str]:
    """The role's validate.yml over its defaults and the host contract, with `given` as inventory vars."""
    tasks = [
        {"name": "Load autostop's defaults",
         "ansible.builtin.include_vars": {"file": str(ROLE / "defaults/main.yml")}},
        {"name": "Validate as the role does",
         "ansible.builtin.include_tasks": str(ROLE / "tasks/validate.yml")},
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "name": "The autostop role's checks", "hosts": "localhost", "gather_facts": False,
        "roles": ["forja.gpu.host_contract"], "tasks": tasks}]))
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(given))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FORJA_"))},
           "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCALHOST_WARNING": "false"}
    return subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'vars.yml'}",
         str(tmp_path / "play.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )


def test_a_week_passes(tmp_path: Path) -> None:
    proc = validate(tmp_path, autostop_delete_after="7d")
    assert proc.returncode == 0, proc.stdout[-3000:]


@pytest.mark.parametrize("given", ["20m", "7 days"])
def test_shorter_than_the_idle_window_or_no_duration_is_refused_naming_the_fix(
    tmp_path: Path, given: str,
) -> None:
    proc = validate(tmp_path, autostop_delete_after=given, autostop_idle_minutes=30)
    assert proc.returncode != 0
    said = " ".join(proc.stdout.split())
    assert f"autostop_delete_after={given} must be a duration" in said
    assert "no shorter than the idle window (autostop_idle_minutes=30 minutes)" in said
    assert "Raise it, or set '' to never delete a stopped VM" in said
