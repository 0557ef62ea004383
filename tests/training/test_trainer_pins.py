"""The trainer's pins have one home, trainer/requirements.txt: the trainer_run role installs exactly
that list on the host, and pyproject.toml's `trainer` extra reads that file (after PyTorch)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from localplay import run_local_play
from packaging.requirements import Requirement
from setuptools import Distribution
from setuptools.config.pyprojecttoml import apply_configuration

REPO = Path(__file__).resolve().parents[2]


def _pins() -> list[str]:
    lines = (REPO / "trainer/requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_the_trainer_extra_is_read_from_the_requirements_file(monkeypatch):
    """setuptools builds the `trainer` extra from the file itself (pyproject.toml keeps no copy)."""
    monkeypatch.chdir(REPO)  # setuptools resolves the extras' files against the project folder
    extras = apply_configuration(Distribution(), "pyproject.toml").extras_require
    built = [Requirement(spec) for spec in extras["trainer"]]
    assert built[0].name == "torch"
    assert [str(r) for r in built[1:]] == [str(Requirement(pin)) for pin in _pins()]


def test_the_role_installs_the_requirements_file(tmp_path):
    """The role's default, rendered by Ansible as the role renders it, is the file's list."""
    out = tmp_path / "packages.json"
    play = [
        {
            "name": "Render trainer_run's package list",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Load the role's defaults as the role does",
                    "ansible.builtin.include_role": {
                        "name": "forja.gpu.trainer_run",
                        "tasks_from": "price.yml",
                        "public": True,
                    },
                },
                {
                    "name": "Write the list",
                    "ansible.builtin.copy": {
                        "content": "{{ trainer_run_pip_packages | to_json }}",
                        "dest": str(out),
                        "mode": "0600",
                    },
                    # Inside the role's own tasks Ansible sets role_path; this task is the play's.
                    "vars": {"role_path": str(REPO / "roles/trainer_run")},
                },
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    run_local_play(tmp_path / "play.yml")
    assert json.loads(out.read_text()) == _pins()


def test_the_role_keeps_no_list_of_its_own():
    defaults = (REPO / "roles/trainer_run/defaults/main.yml").read_text()
    assert not [pin for pin in _pins() if pin in defaults]
