"""One source per host fact: the host contract (roles/host_contract) is read by every role and by forja.

Jupyter's port and token file, the run folder, the training unit pattern, what a run name may be and
which run statuses are final are defined once, as the defaults of forja.gpu.host_contract. The
roles that serve, watch or read them depend on that role; forja's Python reads the same file
(forja.host_contract). These tests hold each side to it and run the real templating.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from localplay import run_local_play

from forja import host_contract, runstate

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "roles/host_contract/defaults/main.yml"
DEFAULTS = yaml.safe_load(CONTRACT.read_text())
SPECS = yaml.safe_load((REPO / "roles/host_contract/meta/argument_specs.yml").read_text())
USERS = ("jupyter_colab", "autostop", "trainer_run")


def test_every_contract_variable_is_documented_and_validated():
    lines = CONTRACT.read_text().splitlines()
    options = SPECS["argument_specs"]["main"]["options"]
    assert DEFAULTS and set(DEFAULTS) == set(options)
    for name in DEFAULTS:
        assert name.startswith("host_contract_")
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{name}:"))
        assert lines[at - 1].startswith("# "), f"{name} has no comment line above it"


def test_contract_values_are_literals_python_can_read():
    """forja reads the file as plain YAML: a Jinja expression there would reach Python unrendered."""
    assert not [name for name, value in DEFAULTS.items() if "{{" in json.dumps(value)]


@pytest.mark.parametrize("role", USERS)
def test_the_roles_that_share_host_facts_depend_on_the_contract(role):
    meta = yaml.safe_load((REPO / f"roles/{role}/meta/main.yml").read_text())
    assert {"role": "forja.gpu.host_contract"} in meta["dependencies"]


def _role_files() -> list[Path]:
    files = []
    for role in sorted((REPO / "roles").iterdir()):
        if role.name == "host_contract":
            continue
        files += [p for p in role.rglob("*") if p.is_file() and p.suffix in (".yml", ".j2", ".py", "")]
    return files + sorted((REPO / "playbooks").glob("*.yml"))


@pytest.mark.parametrize(
    "literal",
    [
        str(DEFAULTS["host_contract_jupyter_port"]),
        DEFAULTS["host_contract_jupyter_token_file"],
        DEFAULTS["host_contract_run_dir"],
        DEFAULTS["host_contract_run_name_pattern"],
        DEFAULTS["host_contract_train_unit_pattern"],
        str(DEFAULTS["host_contract_metrics_port"]),
        "'completed', 'failed'",
    ],
)
def test_no_role_or_playbook_keeps_a_copy_of_a_contract_value(literal):
    """Comments may name a value; no default, task, template or script may hold one."""
    copies = []
    for path in _role_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            code = line.split("#", 1)[0] if path.suffix in (".yml", ".py", "") else line
            if literal in code and "README" not in path.name:
                copies.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert copies == []


def test_forja_reads_the_same_contract():
    assert host_contract.contract_path() == CONTRACT
    assert host_contract.value("jupyter_port") == DEFAULTS["host_contract_jupyter_port"]
    assert runstate.final_statuses() == frozenset(DEFAULTS["host_contract_run_final_statuses"])
    assert runstate.RUN_NAME.pattern == DEFAULTS["host_contract_run_name_pattern"]
    forja_sources = "\n".join(p.read_text() for p in sorted((REPO / "forja").rglob("*.py")))
    assert DEFAULTS["host_contract_run_name_pattern"] not in forja_sources
    assert not re.search(r"\(\s*\"completed\",\s*\"failed\"", forja_sources)


@pytest.mark.parametrize(
    ("status", "final"),
    [
        ("completed", True),
        ("failed", True),
        ("preempted", True),
        ("stopped", True),
        ("running", False),
        ("unknown", False),
    ],
)
def test_a_state_is_final_by_the_contract(status, final):
    state = runstate.parse({"forja_train_state": 1, "run": "r", "status": status})
    assert state is not None and state.final is final


NAMES = [
    "digits",
    "digits-1",
    "a_b",
    "9lives",
    "x" * 63,
    "x" * 64,
    "-lead",
    "_lead",
    "has space",
    "dots.no",
    "",
    "ünï",
]


def _ansible(tmp_path: Path, tasks: list[dict], result: str, *extra: str) -> object:
    """Run the tasks after the host contract role on localhost; return the Jinja `result`, rendered."""
    out = tmp_path / "result.json"
    write = {
        "name": "Write the result",
        "ansible.builtin.copy": {
            "content": "{{ (" + result + ") | to_json }}",
            "dest": str(out),
            "mode": "0600",
        },
    }
    play = tmp_path / "play.yml"
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Read the host contract as the roles do",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "roles": ["forja.gpu.host_contract"],
                    "tasks": [*tasks, write],
                }
            ]
        )
    )
    run_local_play(play, *extra)
    return json.loads(out.read_text())


def test_ansible_and_forja_accept_the_same_run_names(tmp_path):
    """The role's check (`is match(host_contract_run_name_pattern)`) and forja's agree name by name."""
    ansible = _ansible(
        tmp_path,
        [],
        "names | select('match', host_contract_run_name_pattern) | list",
        "-e",
        json.dumps({"names": NAMES}),
    )
    forja = [name for name in NAMES if runstate.RUN_NAME.match(name)]
    assert ansible == forja and 0 < len(forja) < len(NAMES)


def test_one_e_moves_jupyter_and_the_autostop_agent_together(tmp_path):
    """-e host_contract_jupyter_port reaches jupyter_colab's port and autostop's URL (their defaults)."""
    tasks = [
        {
            "name": "Load jupyter_colab's defaults",
            "ansible.builtin.include_vars": {"file": str(REPO / "roles/jupyter_colab/defaults/main.yml")},
        },
        {
            "name": "Load autostop's defaults",
            "ansible.builtin.include_vars": {"file": str(REPO / "roles/autostop/defaults/main.yml")},
        },
    ]
    seen = _ansible(
        tmp_path,
        tasks,
        "{'port': jupyter_colab_port, 'url': autostop_jupyter_url, "
        "'jupyter_token': jupyter_colab_token_file, 'autostop_token': autostop_jupyter_token_file}",
        "-e",
        "host_contract_jupyter_port=9999",
    )
    assert int(seen["port"]) == 9999 and seen["url"] == "http://127.0.0.1:9999"
    assert seen["jupyter_token"] == seen["autostop_token"] == DEFAULTS["host_contract_jupyter_token_file"]
