"""A re-run finds drift and repairs it, and a re-run of a converged host skips every repair.

The host phases of site.yml (bench/rerun_play.yml: nvidia_stack, jupyter_colab, autostop, set up
as the sandbox sets up its VMs) converge a real test host (th25, with the Deep Learning VM layer).
Then each test changes one thing on the host as a person or a package upgrade might (a unit file
deleted, a service stopped, a configuration edited, a file's mode loosened, a file in the server's
venv removed), re-runs the play and checks that the run reports a change, that the task meant to
repair it is the one that changed, and that the host is as it should be again. The roles check the
host in one call each (the host_state module) and run their repair tasks only for what it found:
these tests are what proves that nothing is taken on trust.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import playout
import pytest
import yaml

from forja_sandbox import hostlayers, testhosts

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
INDEX = 25  # the re-run tests' reserved test host
PLAY = ROOT / "bench" / "rerun_play.yml"
UNIT = "/etc/systemd/system/forja-jupyter.service"
CONFIG = "/etc/forja/jupyter/jupyter_notebook_config.json"
TOKEN = "/var/lib/forja/jupyter/token"
PREF = "/etc/apt/preferences.d/forja-nvidia-stack.pref"
UNATTENDED = "/etc/apt/apt.conf.d/51forja-nvidia-stack"
KERNEL_RECORD = "/home/jupyter/kernels/python3/.forja-env.json"  # the default kernel's environment
# The modules that install or write. A converged host's re-run may detect and compare (read-only
# modules), set facts and say things; every task of these modules must be skipped.
WRITERS = {"apt", "pip", "template", "copy", "file", "user", "replace", "dpkg_selections", "systemd_service",
           "command", "uri", "reboot", "forja_torch_env"}
READ_ONLY_COMMANDS = {"Read the fingerprints of the installed key"}  # command tasks that only read

@dataclass
class Run:
    rc: int
    out: str

    @property
    def changed(self) -> int:
        return sum(counts["changed"] for counts in playout.recap(self.out).values())

    def task_results(self) -> dict[str, str]:
        return playout.task_results(self.out)

    def changed_tasks(self) -> list[str]:
        return playout.changed_tasks(self.out)


@dataclass
class Site:
    host: testhosts.Host
    inventory: Path

    def ssh(self, script: str) -> str:
        return self.host.run_as_root(script)

    def play(self, *extra: str) -> Run:
        playbook = str(Path(sys.executable).with_name("ansible-playbook"))
        proc = subprocess.run(
            [playbook, "-i", str(self.inventory), *extra, str(PLAY)],
            cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False,
            env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                 "ANSIBLE_FORCE_COLOR": "0"})
        return Run(proc.returncode, proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    folder = tmp_path_factory.mktemp("rerun")
    testhosts.down(INDEX)
    # over the roles' environments (the site-env layer): what is tested here is the repair of a host
    # as site.yml left it, not pip; the install from scratch is the molecule scenarios' and the e2e's
    host = testhosts.up(INDEX, image="dlvm", over=hostlayers.site_env())
    inventory = folder / "hosts.ini"
    inventory.write_text(
        "[forja_gpu]\n"
        f"th{INDEX} ansible_host={host.address} ansible_user={host.user} "
        f"ansible_ssh_private_key_file={host.key}\n"
        "[forja_gpu:vars]\n"
        f"ansible_ssh_common_args='{' '.join(testhosts.SSH_OPTIONS)}'\n"
        # as the sandbox's VMs: no GPU, NVIDIA's repository out of reach
        "nvidia_stack_allow_no_gpu=true\nnvidia_stack_install_packages=false\n"
        f"jupyter_colab_token_fetch_path={folder}/token\n")
    site = Site(host, inventory)
    first = site.play()
    assert first.rc == 0 and first.changed > 0, first.out[-5000:]
    yield site
    testhosts.down(INDEX)


def writing_tasks(role: str) -> set[str]:
    """The names of the role's tasks that install or write, as the play prints them."""
    names: set[str] = set()

    def walk(tasks: list[dict]) -> None:
        for task in tasks or []:
            walk(task.get("block", []))
            modules = {key.rsplit(".", 1)[-1] for key in task}
            if modules & WRITERS and task.get("name") not in READ_ONLY_COMMANDS:
                names.add(f"forja.gpu.{role} : {task['name']}")

    for path in (ROOT / "roles" / role / "tasks").glob("*.yml"):
        walk(yaml.safe_load(path.read_text()))
    return names


def test_a_converged_host_is_rerun_without_any_install_or_write(site):
    run = site.play("-v")
    assert run.rc == 0 and run.changed == 0, run.out[-5000:]
    results = run.task_results()
    # The play still checked everything: each role compared the host in one call and found it as it should be.
    compared = [name for name in results if " : Compare the " in name]
    assert len(compared) == 3 and all('"ok": true' in results[name] for name in compared), compared
    # No task that installs or writes reached the host; -v prints every result, skipped ones too.
    writers = writing_tasks("nvidia_stack") | writing_tasks("jupyter_colab") | writing_tasks("autostop")
    assert len(writers) > 20
    ran = sorted(name for name in writers & results.keys()
                 if re.search(r"^(ok|changed): ", results[name], re.M))
    # Not even forja_torch_env: jupyter_colab's one call compared the kernel's environment with its record.
    assert ran == [], ran
    token = site.ssh(f"cat {TOKEN}").strip()
    assert len(token) >= 32 and token not in run.out


def test_a_deleted_unit_file_is_written_again_and_the_service_runs(site):
    site.ssh(f"systemctl stop forja-jupyter.service; rm {UNIT}; systemctl daemon-reload")
    run = site.play()
    assert run.rc == 0 and run.changed > 0, run.out[-5000:]
    assert "forja.gpu.jupyter_colab : Install the systemd unit" in run.changed_tasks()
    assert site.ssh(f"test -f {UNIT} && systemctl is-active forja-jupyter.service").strip() == "active"


def test_a_stopped_service_is_started_again(site):
    site.ssh("systemctl stop forja-jupyter.service")
    run = site.play()
    assert run.rc == 0 and run.changed > 0, run.out[-5000:]
    assert "forja.gpu.jupyter_colab : Enable the service at boot and start it" in run.changed_tasks()
    assert site.ssh("systemctl is-active forja-jupyter.service").strip() == "active"


def test_a_disabled_service_is_enabled_again(site):
    site.ssh("systemctl disable forja-jupyter.service 2>/dev/null")
    run = site.play()
    assert run.rc == 0 and run.changed > 0, run.out[-5000:]
    assert site.ssh("systemctl is-enabled forja-jupyter.service").strip() == "enabled"


def test_a_changed_configuration_is_written_back_and_the_server_restarted(site):
    before = site.ssh(f"cat {CONFIG}; systemctl show -p MainPID --value forja-jupyter.service")
    site.ssh(f"sed -i 's/\"log_level\": \"INFO\"/\"log_level\": \"DEBUG\"/' {CONFIG}")
    assert '"DEBUG"' in site.ssh(f"cat {CONFIG}")
    run = site.play()
    assert run.rc == 0 and run.changed > 0, run.out[-5000:]
    assert "forja.gpu.jupyter_colab : Write the notebook server's configuration" in run.changed_tasks()
    after = site.ssh(f"cat {CONFIG}; systemctl show -p MainPID --value forja-jupyter.service")
    assert after.rsplit("}", 1)[0] == before.rsplit("}", 1)[0]  # the same configuration again
    assert after.split()[-1] != before.split()[-1]  # read by a restarted server


def test_a_token_readable_by_others_is_made_private_again_and_stays_secret(site):
    site.ssh(f"chmod 0644 {TOKEN}")
    run = site.play()
    assert run.rc == 0 and run.changed > 0, run.out[-5000:]
    assert "forja.gpu.jupyter_colab : Give the token to the service user only" in run.changed_tasks()
    assert site.ssh(f"stat -c %a {TOKEN}").strip() == "600"
    assert site.ssh(f"cat {TOKEN}").strip() not in run.out


def test_a_host_that_lost_its_token_gets_the_controllers_copy_back_so_the_colab_url_holds(site):
    # as a VM made again in another zone: no token on the host, the controller's copy kept
    kept = (site.inventory.parent / "token").read_text()
    site.ssh(f"rm {TOKEN}")
    run = site.play()
    assert run.rc == 0 and run.changed > 0, run.out[-5000:]
    restored = "forja.gpu.jupyter_colab : Give a host without a token the controller's copy back"
    assert restored in run.changed_tasks()
    assert site.ssh(f"cat {TOKEN}") == kept and kept not in run.out
    assert site.ssh(f"stat -c '%a %U' {TOKEN}").strip() == "600 jupyter"
    assert site.ssh("systemctl is-active forja-jupyter.service").strip() == "active"


def test_a_file_removed_from_the_servers_venv_is_put_back(site):
    filt = site.ssh("ls /opt/forja/jupyter/lib/python3*/site-packages/forja_redact_log.py").strip()
    site.ssh(f"rm {filt}")
    run = site.play()
    assert run.rc == 0 and run.changed > 0, run.out[-5000:]
    assert "forja.gpu.jupyter_colab : Install the log filter that redacts the token" in run.changed_tasks()
    assert site.ssh(f"test -f {filt} && systemctl is-active forja-jupyter.service").strip() == "active"


def test_edited_apt_pins_and_unattended_upgrades_settings_are_written_back(site):
    site.ssh(f"echo '# edited' >> {PREF}; rm {UNATTENDED}")
    run = site.play()
    assert run.rc == 0 and run.changed > 0, run.out[-5000:]
    changed = run.changed_tasks()
    role = "forja.gpu.nvidia_stack : "
    assert role + "Pin the driver branch and the CUDA release by version" in changed
    assert role + "Keep unattended-upgrades away from the driver, CUDA and the kernel" in changed
    assert "# edited" not in site.ssh(f"cat {PREF}")
    assert site.ssh(f"test -f {UNATTENDED} && echo yes").strip() == "yes"


def test_a_stopped_autostop_timer_and_its_deleted_service_unit_are_repaired(site):
    site.ssh("systemctl stop forja-autostop.timer; rm /etc/systemd/system/forja-autostop.service")
    run = site.play()
    assert run.rc == 0 and run.changed > 0, run.out[-5000:]
    assert "forja.gpu.autostop : Install the agent's service and timer units" in run.changed_tasks()
    assert site.ssh("test -f /etc/systemd/system/forja-autostop.service && "
                    "systemctl is-active forja-autostop.timer").strip() == "active"


def test_a_kernel_environment_whose_inputs_changed_is_updated(site):
    # As after an upgrade of the image's PyTorch or of the kernel's pins: the record no longer matches.
    built = site.ssh(f"cat {KERNEL_RECORD}")
    site.ssh(f"sed -i 's/\"inputs_hash\": \"/\"inputs_hash\": \"0/' {KERNEL_RECORD}")
    assert site.ssh(f"cat {KERNEL_RECORD}") != built
    run = site.play()
    assert run.rc == 0 and run.changed > 0, run.out[-5000:]
    updated = "forja.gpu.jupyter_colab : Update each kernel's environment whose inputs changed"
    assert updated in run.changed_tasks()
    assert site.ssh(f"cat {KERNEL_RECORD}") == built


def test_after_the_repairs_a_rerun_changes_nothing(site):
    run = site.play()
    assert run.rc == 0 and run.changed == 0, run.out[-5000:]
