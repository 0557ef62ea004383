"""The user's own machine as forja's host: plain SSH, no Google Cloud, through the example inventory.

A real test host (th44, no metadata server, no GPU) stands in for a workstation. The inventory is
inventory/own_machine.example.yml with only the address, user and key changed (and autostop's
timings shortened), next to the same group_vars/all as in inventory/, so the precedence a user gets
is the one tested. site.yml must create no VM and refuse the NVIDIA driver on a machine without an
NVIDIA GPU before changing anything; trainer_run, Jupyter and autostop must run as on a VM (a run
priced at 0: no GCP price), and autostop, idle, must shut Jupyter's kernels down and leave the
machine and Jupyter up, once per idle stretch. The host boots with the Deep Learning VM layer for its
PyTorch (a workstation that has it already), so that training takes seconds, not a 5 GB install, and
over the roles' environments as they build them (the site-env layer, forja_sandbox/hostlayers.py):
what is tested here is the own machine, not pip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import playout
import pytest
import yaml

from forja_sandbox import hostlayers, testhosts
from trainer import run_folder

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "own_machine.example.yml"
CONTRACT = yaml.safe_load((ROOT / "roles" / "host_contract" / "defaults" / "main.yml").read_text())
TOKEN = CONTRACT["host_contract_jupyter_token_file"]
KERNELS = f"http://127.0.0.1:{CONTRACT['host_contract_jupyter_port']}/api/kernels"
INDEX = 44  # this suite's reserved test host
#: What nvidia_stack's install mode would write first (repository.yml, pin.yml): none may appear.
DRIVER_FILES = ["/etc/apt/preferences.d/forja-nvidia-stack.pref", "/etc/apt/keyrings/forja-nvidia-cuda.asc",
                "/etc/apt/apt.conf.d/51forja-nvidia-stack"]


@dataclass
class Machine:
    host: testhosts.Host
    inventory: Path

    def ssh(self, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A shell script as root on the machine (on stdin, so no quoting games)."""
        proc = subprocess.run(self.host.ssh_argv("sudo sh -s"), input=script, capture_output=True, text=True,
                              timeout=120, check=False)
        assert not check or proc.returncode == 0, proc.stderr
        return proc

    def play(self, playbook: str, *extra: str) -> tuple[int, str]:
        proc = subprocess.run(
            [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(self.inventory), *extra,
             playbook],
            cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
            env={**{k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FORJA_"))},
                 "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                 "ANSIBLE_FORCE_COLOR": "0", "FORJA_HOME": str(self.inventory.parent / "forja-home")})
        return proc.returncode, proc.stdout + proc.stderr

    def journal(self) -> list[dict]:
        out = self.ssh("journalctl -u forja-autostop.service -o cat --no-pager").stdout
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def own_inventory(folder: Path, host: testhosts.Host) -> Path:
    """The example inventory with the test host in place of the workstation, beside inventory/group_vars."""
    example = yaml.safe_load(EXAMPLE.read_text())
    group = example["all"]["children"]["forja_gpu"]
    (name, hostvars), = group["hosts"].items()
    hostvars.update(ansible_host=host.address, ansible_user=host.user,
                    ansible_ssh_private_key_file=str(host.key),
                    ansible_ssh_common_args=" ".join(testhosts.SSH_OPTIONS),
                    # seconds instead of half an hour; everything else is the example's
                    autostop_idle_minutes=0.1, autostop_interval_seconds=5, autostop_boot_grace_minutes=0,
                    jupyter_colab_token_fetch_path=str(folder / "token"))
    group["vars"].pop("autostop_action")  # under test: the own machine's default, not the example's choice
    group["hosts"] = {f"th{INDEX}": hostvars}
    assert name and example["all"]["vars"]["host_contract_platform"] == "own"
    inventory = folder / "own_machine.yml"
    inventory.write_text(yaml.safe_dump(example))
    (folder / "group_vars").symlink_to(ROOT / "inventory" / "group_vars")
    return inventory


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    folder = tmp_path_factory.mktemp("own_machine")
    testhosts.down(INDEX)
    # no metadata_url: no guest agent nor metadata server
    host = testhosts.up(INDEX, image="dlvm", over=hostlayers.site_env())
    yield Machine(host, own_inventory(folder, host))
    testhosts.down(INDEX)


def test_site_makes_no_vm_and_refuses_the_driver_without_a_gpu_changing_nothing(machine):
    rc, out = machine.play("site.yml")
    assert rc != 0, out[-3000:]
    assert f"No NVIDIA GPU on th{INDEX} (host_contract_platform: own" in out, out[-3000:]
    assert "nvidia_stack_install_packages: false" in out and "nvidia_stack_allow_no_gpu: true" in out
    assert "forja.gpu.gcp_instance" not in out  # provision.yml asked no cloud for a VM
    recap = playout.recap(out)
    assert f"th{INDEX}" in recap and not [h for h, counts in recap.items() if counts["changed"]], recap
    present = machine.ssh(" ".join(f"[ -e {p} ] && echo {p};" for p in DRIVER_FILES)
                          + " grep -ril nvidia /etc/apt/sources.list /etc/apt/sources.list.d || true")
    assert present.stdout.split() == [], present.stdout


def test_trainer_run_trains_and_fetches_the_results_at_no_cloud_price(machine):
    results = machine.inventory.parent / "results"
    config = ROOT / "trainer" / "configs" / "digits.yaml"
    rc, out = machine.play("playbooks/train.yml", "-e", f"trainer_run_config={config}",
                           "-e", f"trainer_run_fetch_dir={results}", "-e", "forja_history_record=false")
    assert rc == 0, out[-3000:]
    summary = json.loads((results / f"th{INDEX}" / run_folder.SUMMARY).read_text())
    assert (summary["status"], summary["cost_usd"]) == ("completed", 0.0)
    assert summary["steps"] == summary["total_steps"] > 0


def test_jupyter_and_autostop_run_and_an_idle_machine_stays_up_with_its_kernels_shut(machine):
    for playbook in ("playbooks/jupyter.yml", "playbooks/autostop.yml"):
        rc, out = machine.play(playbook)
        assert rc == 0, out[-3000:]
    config = json.loads(machine.ssh("cat /etc/forja/autostop.json").stdout)
    assert (config["action"], config["metadata_url"], config["max_runtime_hours"]) == ("stop", "", 0)

    kernel = machine.ssh(
        "python3 - <<'EOF'\nimport json, urllib.request\n"
        f"token = open('{TOKEN}').read().strip()\n"
        f"req = urllib.request.Request('{KERNELS}', data=b'{{}}', method='POST',"
        " headers={'Authorization': 'token ' + token, 'Content-Type': 'application/json'})\n"
        "print(json.load(urllib.request.urlopen(req, timeout=60))['id'])\nEOF\n").stdout.strip()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        shut = [r for r in machine.journal() if r.get("action") == "stop-kernels"
                and kernel in [k.get("kernel") for k in r["kernels"]]]
        if shut:
            break
        time.sleep(2)
    assert shut, machine.journal()[-5:]
    assert shut[0]["kernels"] == [{"kernel": kernel, "status": 204}]

    time.sleep(12)  # two more checks: the idle stretch was acted on once, the machine is up
    records = machine.journal()
    acted = [r for r in records if r.get("decision") == "stop"]
    after = records[records.index(shut[0]) + 1:]
    assert acted and all(r["action"] == "stop" for r in acted)
    assert after and not [r for r in after if r.get("decision") == "stop"]
    assert any("already acted (stop)" in " ".join(r.get("reasons", [])) for r in after), after
    assert not [r for r in records if r.get("action") == "poweroff"]
    state = machine.ssh(
        "systemctl is-system-running; systemctl is-active forja-jupyter.service forja-autostop.timer;"
        f" python3 -c \"import json, urllib.request; t = open('{TOKEN}').read().strip();"
        " print(json.dumps(json.load(urllib.request.urlopen(urllib.request.Request("
        f"'{KERNELS}', headers={{'Authorization': 'token ' + t}})))))\"", check=False).stdout
    system, *rest = state.split()
    assert system in ("running", "degraded") and rest == ["active", "active", "[]"], state


def test_the_forja_command_trains_lists_and_prices_the_own_machine(machine, tmp_path):
    """The README's commands with the own-machine inventory: a run trained, listed and priced at 0."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FORJA_"))},
           "FORJA_INVENTORY": str(machine.inventory), "FORJA_HOME": str(tmp_path / "home"),
           "NO_COLOR": "1"}

    def forja(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(Path(sys.executable).with_name("forja")), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    forja("train", str(ROOT / "trainer" / "configs" / "digits.yaml"), "--name", "own-digits")
    assert (tmp_path / "forja-runs" / "own-digits" / f"th{INDEX}" / run_folder.SUMMARY).is_file()
    runs = json.loads(forja("--json", "runs").stdout)
    assert [(r["name"], r["status"], r["hosts"], r["cost_usd"]) for r in runs] == [
        ("own-digits", "completed", [f"th{INDEX}"], 0.0)]
    status = json.loads(forja("--json", "status").stdout)
    mine = [(s["host"], s["status"]) for s in status if s["run"] == "own-digits"]
    assert mine == [(f"th{INDEX}", "completed")], status
    cost = json.loads(forja("--json", "cost").stdout)
    assert (cost["instances"], cost["skipped"], cost["own_machines"]) == ([], [], [f"th{INDEX}"]), cost
    assert f"own machine, no cloud price: th{INDEX}" in forja("cost").stdout


def test_teardown_leaves_the_own_machine_alone(machine):
    rc, out = machine.play("playbooks/teardown.yml")
    assert rc == 0 and "forja.gpu.gcp_instance" not in out, out[-3000:]
    assert machine.ssh("systemctl is-system-running", check=False).stdout.strip() in ("running", "degraded")
