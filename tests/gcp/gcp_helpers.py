"""Helpers the GCP tests share (kept out of conftest.py so tests can import them by a unique name)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: The module options the gcp_instance role fills from its defaults: the VM, as the role states it
#: (the module states none; tests that call it directly pass these, read from the one home).
ROLE_VM_OPTIONS = (
    "zone",
    "machine_type",
    "image_family",
    "image_project",
    "boot_disk_size_gb",
    "boot_disk_type",
    "boot_disk_interface",
    "network",
    "external_ip",
    "spot",
    "scopes",
)


def role_vm() -> dict:
    """gcp_gpu_instance options for the gcp_instance role's default VM (its defaults/main.yml)."""
    import yaml

    defaults = yaml.safe_load((REPO / "roles/gcp_instance/defaults/main.yml").read_text())
    return {option: defaults[f"gcp_instance_{option}"] for option in ROLE_VM_OPTIONS}


def offline_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for ansible subprocesses: loopback only, no user config, our repo's ansible.cfg."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORJA_GCP_", "GOOGLE_", "ANSIBLE_"))}
    dead = "http://127.0.0.1:9"
    env.update(
        {
            "HTTP_PROXY": dead,
            "HTTPS_PROXY": dead,
            "http_proxy": dead,
            "https_proxy": dead,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true",
            "ANSIBLE_LOCALHOST_WARNING": "false",
            "GCE_METADATA_HOST": "127.0.0.1:9",
            "GCE_METADATA_IP": "127.0.0.1:9",
        }
    )
    env.update(extra or {})
    return env


def emulator_env(emulator, key_file: Path, project: str = "forja-sandbox") -> dict[str, str]:
    """The FORJA_GCP_* settings that point Ansible at the emulator."""
    return offline_env(
        {
            "FORJA_GCP_API_URL": emulator.base_url,
            "FORJA_GCP_CREDENTIALS_FILE": str(key_file),
            "FORJA_GCP_PROJECT": project,
        }
    )


def run_module_tasks(tmp_path: Path, env: dict[str, str], tasks: list[dict], *extra_args: str) -> dict:
    """Run tasks on localhost through ansible-playbook; return {register name: result} and the run itself.

    Each task registers its result; failures are kept (ignore_errors) so one playbook run can check
    several behaviours, and the results are written to a JSON file we read back.
    """
    import json
    import subprocess

    import yaml

    names = []
    play_tasks = []
    for index, task in enumerate(tasks):
        name = task.pop("register", f"step{index}")
        names.append(name)
        play_tasks.append({"name": f"Step {name}", "register": name, "ignore_errors": True, **task})
    out = tmp_path / "results.json"
    play_tasks.append(
        {
            "name": "Write the results",
            "ansible.builtin.copy": {
                "content": "{{ {" + ", ".join(f"'{n}': {n}" for n in names) + "} | to_json }}",
                "dest": str(out),
                "mode": "0600",
            },
        }
    )
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Exercise the module",
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                    "tasks": play_tasks,
                }
            ],
            sort_keys=False,
        )
    )
    if out.exists():
        out.unlink()
    proc = subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", str(playbook), *extra_args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.exists(), f"playbook did not finish:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    results = json.loads(out.read_text())
    results["_stdout"] = proc.stdout
    return results


def plain(value):
    """ansible-inventory marks values from the cloud as untrusted ({"__ansible_unsafe": v}); unwrap them."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def inventory_json(proc) -> dict:
    import json

    return plain(json.loads(proc.stdout))


def run_inventory(env: dict[str, str], *sources: Path, extra: tuple[str, ...] = ()):
    """ansible-inventory --list over the given sources, from the repo root (its ansible.cfg)."""
    import subprocess

    args = [str(REPO / ".venv/bin/ansible-inventory")]
    for source in sources:
        args += ["-i", str(source)]
    return subprocess.run(
        [*args, "--list", *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


def run_playbook(env: dict[str, str], inventory: Path | str, name: str,
                 *extra: str) -> subprocess.CompletedProcess:
    """ansible-playbook NAME from the repo with INVENTORY (no check of the outcome: callers assert)."""
    return subprocess.run(
        [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inventory), name, *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
