"""Bad jupyter_colab variables stop the play before anything changes, with a message naming the variable.

One ansible-playbook run covers every case: each inventory host carries one bad value and points at
a port where nothing listens, so a task that got past validation would show up as UNREACHABLE
instead of changing anything. The host with good values proves the checks do not refuse them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from jupyter_helpers import REPO, ansible_playbook

# host name: (its bad values, a piece of the expected message)
BAD = {
    "star_origin": (
        {"jupyter_colab_allow_origin": "*"}, "jupyter_colab_allow_origin='*' must be one exact https"),
    "pattern_origin": (
        {"jupyter_colab_allow_origin": "https://.*\\.google\\.com"}, "jupyter_colab_allow_origin="),
    "http_origin": (
        {"jupyter_colab_allow_origin": "http://colab.research.google.com"}, "jupyter_colab_allow_origin="),
    "port_too_high": ({"jupyter_colab_port": 70000}, "jupyter_colab_port=70000 is out of range"),
    "port_too_low": (
        {"jupyter_colab_port": 80, "jupyter_colab_local_port": 80}, "jupyter_colab_port=80 is out of range"),
    "port_not_a_number": ({"jupyter_colab_port": "eighty"}, "jupyter_colab_port"),
    "unequal_ports": ({"jupyter_colab_local_port": 9999}, "jupyter_colab_local_port=9999 differs"),
    "root_user": ({"jupyter_colab_user": "root"}, "jupyter_colab_user='root' must be a plain unprivileged"),
    "relative_dir": (
        {"jupyter_colab_notebook_dir": "notebooks"}, "jupyter_colab_notebook_dir='notebooks' must be"),
    "short_token": ({"jupyter_colab_token_bytes": 8}, "jupyter_colab_token_bytes=8 is too small"),
    "bad_log_level": ({"jupyter_colab_log_level": "LOUD"}, "jupyter_colab_log_level"),
}


@pytest.fixture(scope="module")
def play(tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("validation")
    hosts = {name: values for name, (values, _) in BAD.items()} | {"good": {}}
    inventory = {"all": {"hosts": hosts, "vars": {
        "ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_user": "nobody",
        "ansible_ssh_common_args": "-o ConnectTimeout=3 -o BatchMode=yes",
    }}}
    (work / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (work / "play.yml").write_text(yaml.safe_dump([
        {"name": "Apply the role", "hosts": "all", "gather_facts": False,
         "roles": ["forja.gpu.jupyter_colab"]}
    ]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_CALLBACK_FORMAT_PRETTY": "false",
           "ANSIBLE_RETRY_FILES_ENABLED": "false"}
    run = subprocess.run(
        [ansible_playbook(), "-i", str(work / "inventory.yml"), str(work / "play.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert run.returncode != 0
    return run.stdout


def _failure(output: str, host: str) -> dict:
    """The first failure reported for ``host`` (a looped task reports ``failed: [h] (item=...)``)."""
    match = re.search(
        rf"^(?:fatal|failed): \[{host}\](?: \(item=[^)]*\))?(?:: (FAILED|UNREACHABLE)!)? => (.*)$",
        output, re.MULTILINE,
    )
    assert match, f"no failure reported for {host}:\n{output}"
    return {"kind": match.group(1) or "FAILED", **json.loads(match.group(2))}


@pytest.mark.parametrize("host", sorted(BAD))
def test_a_bad_value_fails_validation_naming_the_variable(play: str, host: str):
    failure = _failure(play, host)
    assert failure["kind"] == "FAILED", "the role got past validation and tried to reach the host"
    assert BAD[host][1] in failure["msg"]


@pytest.mark.parametrize("host", sorted(BAD))
def test_a_bad_value_changes_nothing(play: str, host: str):
    recap = re.search(
        rf"^{host}\s+: ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", play, re.MULTILINE
    )
    assert recap, play
    assert recap.groups() == ("0", "0", "1")


def test_the_unequal_ports_message_explains_why_and_the_fix(play: str):
    msg = _failure(play, "unequal_ports")["msg"]
    assert "Host header" in msg
    assert "jupyter_colab_port=9999" in msg


def test_the_defaults_pass_validation(play: str):
    """With good values the first task after the checks reaches for the host (and finds nothing)."""
    assert _failure(play, "good")["kind"] == "UNREACHABLE"


def test_the_defaults_file_documents_every_variable_the_spec_validates():
    role = Path(REPO / "roles" / "jupyter_colab")
    defaults_text = (role / "defaults" / "main.yml").read_text()
    defaults = yaml.safe_load(defaults_text)
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    spec = specs["argument_specs"]["main"]["options"]
    assert set(defaults) == set(spec)
    lines = defaults_text.splitlines()
    for name in defaults:
        index = next(i for i, line in enumerate(lines) if line.startswith(f"{name}:"))
        assert lines[index - 1].startswith("# "), f"{name} has no one-line comment above it"
