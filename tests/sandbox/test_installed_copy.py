"""forja installed from its wheel works from any folder, with no clone.

- The wheel carries the Ansible content (playbooks, roles, plugins, meta, ansible.cfg, galaxy.yml,
  site.yml, the inventories, the trainer the trainer_run role bundles) as an installed collection,
  every file of it, and none of the clone's caches or its collections/ link.
- Installed into a fresh venv outside the clone (tests/sandbox/conftest.py: `installed_forja`), the
  wheel's forja is the one imported, and from another folder `forja --help`, `forja init` and
  `forja -i ... status` work: the collection forja.gpu is found (the gcp_gpu plugin reads the config
  and says what it lacks, never "Incorrect plugin name"), and the installed sandbox inventory lists
  the VMs of a Compute API.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import yaml
from installed_wheel import REPO, Installed, help_commands, shipped_content

from forja_sandbox.compute_emulator import ComputeEmulator

SHIPPED = "forja/_collection/ansible_collections/forja/gpu"
PROJECT = "my-project-123"


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_wheel_carries_the_content_as_an_installed_collection(product_wheel: Path) -> None:
    with zipfile.ZipFile(product_wheel) as whl:
        names = set(whl.namelist())
    content = {n.removeprefix(f"{SHIPPED}/") for n in names if n.startswith(f"{SHIPPED}/")}
    for expected in ("ansible.cfg", "galaxy.yml", "site.yml", "meta/runtime.yml", "playbooks/provision.yml",
                     "roles/gcp_instance/defaults/main.yml", "plugins/inventory/gcp_gpu.py",
                     "plugins/vars/gcp_ssh_path.py", "plugins/module_utils/forja_gcp.py",
                     "inventory/gcp_gpu.yml", "inventory/choose.yml", "inventory/group_vars/all/access.yml",
                     "inventory/sandbox/gcp_gpu.yml", "inventory/sandbox/group_vars/all/sandbox.yml",
                     # a link in the clone, a file in the wheel
                     "inventory/sandbox/group_vars/all/access.yml",
                     # bundled onto the hosts by trainer_run (trainer_run_trainer_src: roles/../trainer)
                     "trainer/train.py", "trainer/configs/digits.yaml"):
        assert expected in content, expected
    in_clone = {str(p.relative_to(REPO)) for name in shipped_content() for p in
                ([REPO / name] if (REPO / name).is_file() else (REPO / name).rglob("*"))
                if not p.is_dir() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert in_clone - content == set(), "files of the content the wheel lacks"
    assert not [n for n in content if "__pycache__" in n or n.endswith(".pyc") or n.startswith("collections")]


def test_the_installed_forja_is_the_wheels_and_finds_its_content(installed_forja: Installed,
                                                                  tmp_path: Path) -> None:
    code = ("import json, forja, forja.paths as p; "
            "print(json.dumps([forja.__file__, str(p.REPO_ROOT), p.ansible_env()]))")
    proc = _run([str(installed_forja.bin / "python"), "-c", code], tmp_path, installed_forja.env())
    assert proc.returncode == 0, proc.stderr
    module, root, env = json.loads(proc.stdout)
    assert Path(module).is_relative_to(installed_forja.venv), f"the clone's forja was imported: {module}"
    assert Path(root) == installed_forja.content
    assert env["ANSIBLE_CONFIG"] == str(installed_forja.content / "ansible.cfg")
    assert env["ANSIBLE_COLLECTIONS_PATH"].split(":")[0] == str(installed_forja.site_packages / "forja" /
                                                                 "_collection")
    shown = _run([str(installed_forja.bin / "forja"), "--help"], tmp_path, installed_forja.env())
    assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-3000:]
    commands = help_commands(shown.stdout)
    assert {"init", "up", "configure", "train", "status", "tunnel", "runs"} <= commands, shown.stdout


def test_init_then_status_from_any_folder_reaches_the_gcp_plugins_credentials_check(
        installed_forja: Installed, tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    env = installed_forja.env(HOME=str(home), FORJA_HOME=str(tmp_path / "forja-home"))
    env.pop("XDG_CONFIG_HOME", None)
    forja = str(installed_forja.bin / "forja")
    folder = tmp_path / "inv"
    made = _run([forja, "init", "--project", PROJECT, "--dir", str(folder)], elsewhere, env)
    assert made.returncode == 0, made.stdout + made.stderr
    link = folder / "group_vars" / "all" / "access.yml"
    assert link.resolve().is_relative_to(installed_forja.content), "links to the installed copy's settings"
    assert _run([forja, "init", "--project", PROJECT], elsewhere, env).returncode == 0  # the default folder
    for args in (["-i", str(folder), "status"], ["status"]):
        proc = _run([forja, *args], elsewhere, env)
        said = " ".join(proc.stderr.split())
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "credentials: none found" in said and PROJECT in said, said
        assert "Incorrect plugin name" not in said and "No inventory was parsed" not in said, said
    assert str(home / ".config" / "forja" / "inventory") in said, "without -i: ~/.config/forja/inventory"


def test_the_installed_sandbox_inventory_lists_a_compute_api(installed_forja: Installed,
                                                             tmp_path: Path) -> None:
    """The installed inventory/sandbox, pointed at an in-process Compute API (no VM): status and runs."""
    inventory = tmp_path / "sandbox"
    shutil.copytree(installed_forja.content / "inventory" / "sandbox", inventory)
    env = installed_forja.env(FORJA_HOME=str(tmp_path / "forja-home"))
    with ComputeEmulator(projects=("forja-sandbox",)) as emulator:
        key = emulator.write_service_account_key(tmp_path / "service-account.json")
        source = yaml.safe_load((inventory / "gcp_gpu.yml").read_text())
        (inventory / "gcp_gpu.yml").write_text(yaml.safe_dump({**source, "api_url": emulator.base_url,
                                                               "credentials_file": str(key)}))
        forja = [str(installed_forja.bin / "forja"), "--json", "-i", str(inventory)]
        status = _run([*forja, "status"], tmp_path, env)
        runs = _run([*forja, "runs"], tmp_path, env)
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-3000:]
    assert json.loads(status.stdout) == []
    assert runs.returncode == 0 and json.loads(runs.stdout) == [], runs.stdout + runs.stderr
