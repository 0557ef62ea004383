"""Every role entry point that a play calls has an argument spec, and plays name roles by FQCN.

Ansible validates `include_role`/`import_role` arguments against the spec named like the entry point
(`tasks_from: fetch` -> `argument_specs.fetch`) only when `tasks_from` carries no `.yml` suffix, so a
suffix silently turns validation off; this test refuses it. The plays are read from the tree, so a
new playbook or entry point without a spec fails here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir())
PLAYS = sorted([REPO / "site.yml", *(REPO / "playbooks").glob("*.yml"), *(REPO / "molecule").glob("*/*.yml"),
                *(REPO / "molecule").glob("*/tasks/*.yml")])
INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role")


def _specs(role: str) -> dict:
    path = REPO / "roles" / role / "meta" / "argument_specs.yml"
    return yaml.safe_load(path.read_text())["argument_specs"] if path.is_file() else {}


def _calls(node: object) -> Iterator[tuple[str, str]]:
    """(role name, entry point) for every role a play or task list applies."""
    if isinstance(node, list):
        for item in node:
            yield from _calls(item)
    elif isinstance(node, dict):
        for key in INCLUDES:
            if isinstance(node.get(key), dict):
                yield node[key]["name"], str(node[key].get("tasks_from", "main"))
        for entry in node.get("roles", []) if isinstance(node.get("roles"), list) else []:
            yield (entry if isinstance(entry, str) else entry.get("role") or entry["name"]), "main"
        for value in node.values():
            yield from _calls(value)


def _play_calls() -> list[tuple[str, str, str]]:
    found = []
    for path in PLAYS:
        for role, entry in _calls(yaml.safe_load(path.read_text())):
            found.append((str(path.relative_to(REPO)), role, entry))
    return found


@pytest.mark.parametrize("role", ROLES)
def test_every_role_has_a_main_spec(role: str):
    assert "main" in _specs(role), f"roles/{role}/meta/argument_specs.yml has no main entry point"


@pytest.mark.parametrize("role", ROLES)
def test_every_spec_names_an_entry_point_that_exists(role: str):
    for entry in _specs(role):
        tasks = REPO / "roles" / role / "tasks" / f"{entry}.yml"
        assert tasks.is_file(), f"{role}: spec {entry} has no tasks file"


def test_the_plays_call_roles_and_entry_points():
    calls = _play_calls()
    assert ("playbooks/train_fetch.yml", "forja.gpu.trainer_run", "fetch") in calls
    assert ("playbooks/gpu.yml", "forja.gpu.nvidia_stack", "main") in calls


@pytest.mark.parametrize(("play", "role", "entry"), _play_calls(), ids=lambda v: str(v))
def test_every_role_a_play_calls_is_named_by_fqcn_and_validated(play: str, role: str, entry: str):
    assert role.startswith("forja.gpu."), f"{play}: name the role forja.gpu.{role}"
    short = role.removeprefix("forja.gpu.")
    if play.startswith(("playbooks/", "site.yml")) or entry == "main":
        assert not entry.endswith((".yml", ".yaml")), (
            f"{play}: tasks_from: {entry} skips the argument spec; write tasks_from: {Path(entry).stem}")
        assert entry in _specs(short), f"{play}: roles/{short}/meta/argument_specs.yml lacks {entry}"
