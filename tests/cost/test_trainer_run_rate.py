"""The trainer_run role hands the VM's hourly rate to the trainer, so cost_usd uses forja's price.

Two halves, neither needing a test host: the real launcher run with a stand-in Python that records
the trainer's argv (parsed back with the trainer's own CLI and config loader), and the role's rate
tasks plus its env-file template applied by ansible-playbook to local-connection hosts writing
into a temporary folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainer import run_folder
from trainer.cli import _parser
from trainer.config import load

pytestmark = pytest.mark.slow  # its plays take 10 s (bench/suite_times.py), not make check

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "roles" / "trainer_run" / "files" / "forja-train-launch"

needs_tools = pytest.mark.skipif(
    shutil.which("flock") is None or shutil.which("bash") is None, reason="the launcher needs bash and flock"
)


def launch(tmp_path: Path, config: dict, price: str | None) -> list[str]:
    """Run the launcher as systemd would; return the argv it gave `python -m trainer`."""
    argv_file = tmp_path / "argv"
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/bash\n"
        "# Stands in for the trainer venv's python: records a trainer start, runs anything else.\n"
        f'if [ "$1 $2" = "-m trainer" ]; then shift 2; printf "%s\\n" "$@" > {argv_file}; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(config))
    (tmp_path / "code").mkdir(exist_ok=True)
    env = {
        "PATH": os.environ["PATH"],
        "FORJA_RUN": "demo",
        "FORJA_OUT": str(tmp_path / "out"),
        "FORJA_CODE": str(tmp_path / "code"),
        "FORJA_CONFIG": str(config_file),
        "FORJA_PYTHON": str(fake),
        "FORJA_NNODES": "1",
    }
    if price is not None:
        env["FORJA_PRICE_PER_HOUR"] = price
    run = subprocess.run(
        ["bash", str(LAUNCHER)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out" / run_folder.COMPLETED_MARKER).exists()
    return argv_file.read_text().splitlines()


def trainer_price(argv: list[str]) -> float:
    """The price_per_hour the trainer resolves from that argv (its own parser and loader)."""
    args = _parser().parse_args(argv)
    return load(args.config, args.overrides).price_per_hour


DIGITS = {"model": "trainer.demo:digits_cnn", "data": "trainer.demo:digits", "steps": 10}


@needs_tools
def test_the_launcher_passes_the_rate_when_the_config_has_none(tmp_path):
    argv = launch(tmp_path, DIGITS, "0.8536")
    assert argv == [
        "train",
        "--config",
        str(tmp_path / "run.yaml"),
        "--out",
        str(tmp_path / "out"),
        "--set",
        "price_per_hour=0.8536",
    ]
    assert trainer_price(argv) == pytest.approx(0.8536)


@needs_tools
@pytest.mark.parametrize("own", [1.5, 0.0])
def test_a_price_in_the_users_config_wins_even_zero(tmp_path, own):
    argv = launch(tmp_path, {**DIGITS, "price_per_hour": own}, "0.8536")
    assert "--set" not in argv
    assert trainer_price(argv) == own


@needs_tools
def test_without_a_rate_the_launcher_adds_nothing(tmp_path):
    argv = launch(tmp_path, DIGITS, None)
    assert "--set" not in argv
    assert trainer_price(argv) == 0.0


# The role's rate tasks and env template, on local-connection hosts: (host vars, expected rate).
L4 = {"machine_type": "g2-standard-8", "zone": "us-east1-d", "gpu_type": "nvidia-l4", "gpu_count": 1}
GOOD = {
    "gcp_on_demand": ({**L4, "provisioning_model": "STANDARD"}, "0.8536"),
    "gcp_spot": ({**L4, "provisioning_model": "SPOT", "preemptible": True}, "0.56"),
    "gcp_empty_means_look_up": ({**L4, "trainer_run_price_per_hour": ""}, "0.8536"),
    "gcp_own_rate": ({**L4, "trainer_run_price_per_hour": "1.25"}, "1.25"),
    "not_gcp": ({}, "0.0"),
    "not_gcp_own_rate": ({"trainer_run_price_per_hour": 0.5}, "0.5"),
}
BAD = {
    "unknown_machine": ({**L4, "machine_type": "z9-mega-8"}, "no price for machine type 'z9-mega-8'"),
    "negative_rate": ({"trainer_run_price_per_hour": -1}, "trainer_run_price_per_hour: -1 must be a number"),
    "word_rate": ({"trainer_run_price_per_hour": "cheap"}, 'trainer_run_price_per_hour: "cheap" must be'),
}


def _play(work: Path) -> list[subprocess.CompletedProcess]:
    """Apply the role's rate tasks and write each host's env file, twice (the second must not change)."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {name: values for name, (values, _) in {**GOOD, **BAD}.items()}
    (work / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts, "vars": local}}))
    (work / "play.yml").write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Render the trainer's env file with the role's hourly rate",
                    "hosts": "all",
                    "gather_facts": False,
                    # What validate.yml and bundle.yml would have set by then.
                    "vars": {
                        "trainer_run_config": "/nowhere/demo.yaml",
                        "trainer_run_code_dir": "/opt/forja/code/0123456789abcdef",
                    },
                    "tasks": [
                        {
                            "name": "Decide the rate as the role does",
                            "ansible.builtin.include_role": {
                                "name": "forja.gpu.trainer_run",
                                "tasks_from": "price.yml",
                                "public": True,
                            },
                        },
                        {
                            "name": "Write the env file as the role does",
                            "ansible.builtin.template": {
                                "src": str(REPO / "roles/trainer_run/templates/run.env.j2"),
                                "dest": str(work / "{{ inventory_hostname }}.env"),
                                "mode": "0600",
                            },
                        },
                    ],
                }
            ]
        )
    )
    playbook = Path(sys.executable).with_name("ansible-playbook")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FORJA_"))},
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CACHE_PLUGIN": "memory",
        "ANSIBLE_LOCALHOST_WARNING": "false",
    }
    # -i names the test inventory, so the sandbox inventory of ansible.cfg is never read.
    cmd = [str(playbook), "-i", str(work / "inventory.yml"), str(work / "play.yml")]
    return [
        subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
        for _ in range(2)
    ]


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[subprocess.CompletedProcess]]:
    work = tmp_path_factory.mktemp("trainer_run_rate")
    return work, _play(work)


def _recap(output: str, host: str) -> dict[str, int]:
    match = re.search(rf"^{host}\s+:\s+(.*)$", output, re.MULTILINE)
    assert match, f"{host} is not in the recap:\n{output}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


@pytest.mark.parametrize("host", sorted(GOOD))
def test_the_env_file_carries_the_rate_the_role_decided(played, host):
    work, _ = played
    lines = (work / f"{host}.env").read_text().splitlines()
    assert f"FORJA_PRICE_PER_HOUR={GOOD[host][1]}" in lines


@pytest.mark.parametrize("host", sorted(GOOD))
def test_the_same_rate_changes_nothing_the_second_time(played, host):
    _, (first, second) = played
    assert _recap(first.stdout, host)["changed"] == 1
    again = _recap(second.stdout, host)
    # include_role, the host contract's argument check (a dependency of the role), assert, set_fact, template
    assert again["changed"] == 0 and again["ok"] == 5
    assert again["failed"] == again["unreachable"] == 0


@pytest.mark.parametrize("host", sorted(BAD))
def test_a_bad_rate_or_an_unpriced_vm_stops_the_host_naming_the_cause(played, host):
    work, (first, _) = played
    assert _recap(first.stdout, host)["failed"] == 1
    assert not (work / f"{host}.env").exists()
    failure = re.search(rf"^fatal: \[{host}\]: FAILED! => (.*)$", first.stdout, re.MULTILINE)
    assert failure, first.stdout
    assert BAD[host][1] in json.loads(failure.group(1))["msg"]
