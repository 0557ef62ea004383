"""One variable says what the host is (host_contract_platform), and autostop's stop follows it.

The defaults are resolved by Ansible itself (a localhost play loading the roles' defaults); bad values
go through the real roles in check mode, so the argument specs refuse them before any task runs.
The agent's once-per-idle-stretch rule is pinned with exact inputs, as tests/cost/test_agent.py does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
AGENT_PATH = ROOT / "roles" / "autostop" / "files" / "forja_autostop.py"
spec = importlib.util.spec_from_file_location("forja_autostop_own", AGENT_PATH)
agent = importlib.util.module_from_spec(spec)
spec.loader.exec_module(agent)

CONTRACT = yaml.safe_load((ROOT / "roles" / "host_contract" / "defaults" / "main.yml").read_text())
BOOT = "bbbbbbbb-1111-2222-3333-444444444444"
NOW = 1_800_000_000.0


def playbook(tmp_path: Path, play: dict, *extra: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump([play]))
    return subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(path), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**{k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FORJA_"))},
             "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_LOCALHOST_WARNING": "false"})


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        ("gce", {"action": "poweroff", "hours": 72,
                 "metadata": "http://metadata.google.internal/computeMetadata/v1"}),
        ("own", {"action": "stop", "hours": 0, "metadata": ""}),
    ],
)
def test_autostop_defaults_follow_the_platform(tmp_path, platform, expected):
    shown = ("RESOLVED {{ {'action': autostop_action, 'hours': autostop_max_runtime_hours | int,"
             " 'metadata': autostop_metadata_url} | to_json }}")
    play = {
        "name": "Resolve autostop's defaults", "hosts": "localhost", "gather_facts": False,
        "vars_files": [str(ROOT / "roles/host_contract/defaults/main.yml"),
                       str(ROOT / "roles/autostop/defaults/main.yml")],
        "tasks": [{"name": "Show them", "ansible.builtin.debug": {"msg": shown}}],
    }
    default = platform == CONTRACT["host_contract_platform"]
    extra = () if default else ("-e", f"host_contract_platform={platform}")
    proc = playbook(tmp_path, play, *extra)
    assert proc.returncode == 0, proc.stdout[-2000:]
    line = next(line for line in proc.stdout.splitlines() if "RESOLVED" in line)
    assert json.loads(line.split("RESOLVED ", 1)[1].rstrip('"').replace('\\"', '"')) == expected


@pytest.mark.parametrize(
    ("variable", "value", "choices"),
    [("autostop_action", "reboot", "poweroff, stop, warn"), ("host_contract_platform", "aws", "gce, own")],
)
def test_a_bad_value_is_refused_naming_the_variable_before_any_task(tmp_path, variable, value, choices):
    play = {"name": "Apply autostop", "hosts": "localhost", "gather_facts": False,
            "roles": [{"role": "forja.gpu.autostop"}]}
    proc = playbook(tmp_path, play, "--check", "-e", f"{variable}={value}")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert variable in out and choices in out and value in out, out[-2000:]
    assert "Install the agent" not in out


def config(**over):
    fields = {"jupyter_url": "http://127.0.0.1:1", "jupyter_token_file": "/nonexistent", "train_unit_pattern":
              CONTRACT["host_contract_train_unit_pattern"], "run_dir": CONTRACT["host_contract_run_dir"]}
    return {**agent.DEFAULTS, **fields, "idle_minutes": 1.0, "boot_grace_minutes": 0.0, **over}


IDLE = {"busy": [], "notes": ["no training unit"], "last_activity": None}
BUSY = {"busy": ["kernel 3f2c busy"], "notes": [], "last_activity": None}


def test_stop_acts_once_per_idle_stretch_and_leaves_no_stop_under_way():
    state = agent.fresh_state(BOOT, NOW - 120)
    first, state = agent.decide(config(action="stop"), IDLE, state, BOOT, 600, NOW)
    assert (first["decision"], first["action"], state["stopping"]) == ("stop", "stop", False)
    again, state = agent.decide(config(action="stop"), IDLE, state, BOOT, 660, NOW + 60)
    assert again["decision"] == "idle" and "already acted (stop)" in " ".join(again["reasons"])
    _, state = agent.decide(config(action="stop"), BUSY, state, BOOT, 720, NOW + 120)
    later, _ = agent.decide(config(action="stop"), IDLE, state, BOOT, 840, NOW + 240)
    assert later["decision"] == "stop"  # activity in between: a new idle stretch


def test_warn_only_logs_and_poweroff_still_marks_the_stop():
    state = agent.fresh_state(BOOT, NOW - 120)
    warned, after_warn = agent.decide(config(action="warn"), IDLE, state, BOOT, 600, NOW)
    assert (warned["decision"], warned["action"], after_warn["stopping"]) == ("warn", "warn", False)
    off, after_off = agent.decide(config(), IDLE, state, BOOT, 600, NOW)
    assert (off["decision"], off["action"], after_off["stopping"]) == ("stop", "poweroff", True)


def test_an_unknown_action_in_the_config_names_the_field(tmp_path):
    path = tmp_path / "autostop.json"
    fields = {k: v for k, v in config(action="halt").items() if k in (*agent.REQUIRED, "action")}
    path.write_text(json.dumps(fields))
    with pytest.raises(agent.ConfigError, match="'action' is 'halt'; give one of poweroff, stop, warn"):
        agent.load_config(str(path))
