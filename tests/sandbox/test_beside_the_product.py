"""The sandbox sits beside the product: the product installs, runs and chooses its cloud without it.

- The `forja` wheel, installed without the `sandbox` extra in a fresh venv, runs `forja --help`;
  `forja sandbox` is simply not there, and importing the sandbox names the extra to install.
- Nothing chooses the cloud for a user: a command without `-i` (Ansible's or forja's) stops and
  names `-i inventory/gcp_gpu.yml` and `-i inventory/sandbox`; the GCP source without credentials
  fails saying how to give them.
- Inventories start nothing: the sandbox's endpoint is plain variables (the service's own values),
  and with the service stopped its source fails saying it cannot connect.
- No role, plugin or playbook knows the sandbox; forja imports none of it.
"""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from installed_wheel import help_commands

from forja_sandbox import service, testhosts
from forja_sandbox.compute_emulator import ComputeEmulator

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SANDBOX = REPO / "inventory" / "sandbox"
CHOICES = ("-i inventory/gcp_gpu.yml", "-i inventory/sandbox")
#: What picks a cloud or credentials from the environment; each test below sets what it means to.
CHOOSING_ENV = ("ANSIBLE_INVENTORY", "FORJA_INVENTORY", "FORJA_GCP_PROJECT", "FORJA_GCP_CREDENTIALS_FILE",
                "FORJA_GCP_ACCESS_TOKEN", "FORJA_GCP_API_URL", "GOOGLE_APPLICATION_CREDENTIALS")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CHOOSING_ENV}
    return {**env, "ANSIBLE_NOCOLOR": "1", **extra}


def _run(argv: list[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- The inventory is chosen explicitly ------------------------------------------------------------


def test_ansible_without_an_inventory_stops_and_names_the_choices() -> None:
    for argv in ([str(BIN / "ansible-inventory"), "--list"],
                 [str(BIN / "ansible-playbook"), "--list-hosts", "site.yml"]):
        proc = _run(argv, _env())
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0, said
        assert "No inventory chosen" in said and all(choice in said for choice in CHOICES), said
        assert "FORJA_INVENTORY" in said, "the forja CLI's way to name it is in the message too"


def test_a_syntax_check_reaches_no_host_and_needs_no_inventory() -> None:
    """`ansible-playbook --syntax-check` (what ansible-lint runs) chooses no cloud: it passes."""
    proc = _run([str(BIN / "ansible-playbook"), "--syntax-check", "site.yml"], _env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "No inventory chosen" not in proc.stdout + proc.stderr


def test_forja_without_an_inventory_stops_before_running_anything(tmp_path: Path) -> None:
    proc = _run([str(BIN / "forja"), "status"], _env(FORJA_HOME=str(tmp_path)))
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no inventory chosen" in said and all(choice in said for choice in CHOICES), said
    assert "FORJA_INVENTORY" in said
    assert not (tmp_path / "runner").exists(), "no playbook was started"


def test_forja_takes_the_inventory_from_forja_inventory(tmp_path: Path) -> None:
    """FORJA_INVENTORY is `-i`: an inventory without GPU hosts gives an empty, successful status."""
    empty = tmp_path / "inventory.yml"
    empty.write_text(yaml.safe_dump({"all": {"children": {"forja_gpu": {"hosts": {}}}}}))
    proc = _run([str(BIN / "forja"), "--json", "status"],
                _env(FORJA_HOME=str(tmp_path), FORJA_INVENTORY=str(empty)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "no inventory chosen" not in proc.stderr


def test_the_gcp_inventory_without_credentials_says_how_to_give_them(tmp_path: Path) -> None:
    """No key, no token, no application default credentials (an empty HOME, no cached listing)."""
    proc = _run([str(BIN / "ansible-inventory"), "-i", "inventory/gcp_gpu.yml", "--list"],
                _env(HOME=str(tmp_path), FORJA_GCP_PROJECT="my-project"))
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    assert "credentials: none found" in said and "FORJA_GCP_CREDENTIALS_FILE" in said, said
    assert "gcloud auth application-default login" in said, said


# --- Inventories start nothing ---------------------------------------------------------------------


def test_the_sandbox_inventory_states_the_services_own_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint is fixed, so inventory/sandbox writes it as plain values: they must be the
    service's (forja_sandbox/service.py is their other home; this test ties the two)."""
    for name in ("FORJA_SANDBOX_PORT", "FORJA_SANDBOX_DIR", "TH_NET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TH_BASE", str(Path.home() / ".cache" / "forja"))
    endpoint = service.endpoint()
    source = yaml.safe_load((SANDBOX / "gcp_gpu.yml").read_text())
    group_vars = yaml.safe_load((SANDBOX / "group_vars" / "all" / "sandbox.yml").read_text())
    assert source["projects"] == [endpoint["project"]] == [group_vars["gcp_instance_project"]]
    assert source["api_url"] == endpoint["api_url"] == group_vars["gcp_instance_api_url"]
    key = endpoint["credentials_file"]
    assert str(Path(source["credentials_file"]).expanduser()) == key
    assert str(Path(group_vars["gcp_instance_credentials_file"]).expanduser()) == key
    assert group_vars["autostop_metadata_url"] == endpoint["metadata_url"]
    assert group_vars["gcp_instance_ssh_address_url"] == service.address_url()
    assert group_vars["gcp_instance_os_login_url"] == service.oslogin_url()
    assert group_vars["gcp_bucket_storage_emulator_host"] == endpoint["storage_url"] == service.storage_url()
    assert group_vars["trainer_run_env"]["STORAGE_EMULATOR_HOST"] == service.storage_url(bridge=True)
    assert group_vars["gcp_bucket_project"] == endpoint["project"]
    assert group_vars["trainer_run_checkpoint_bucket"].startswith(f"gs://{group_vars['gcp_bucket_name']}/")
    assert str(Path(group_vars["gcp_instance_ssh_key_file"]).expanduser()) == str(testhosts.key_path())
    assert group_vars["gcp_instance_ssh_iap_command"].endswith("-m forja_sandbox.iap start-iap-tunnel")
    assert sorted(p.name for p in SANDBOX.iterdir()) == ["gcp_gpu.yml", "group_vars"], (
        "the sandbox's inventory is its gcp_gpu source and variables: no source that starts a service")


def test_a_sandbox_source_whose_service_is_not_running_fails_saying_it_cannot_connect(tmp_path: Path) -> None:
    """inventory/sandbox/gcp_gpu.yml pointed at a sandbox that was started once and is stopped now:
    its key exists, nothing answers at its address, and listing starts nothing."""
    with ComputeEmulator(projects=("forja-sandbox",)) as emulator:
        key = emulator.write_service_account_key(tmp_path / "service-account.json")
        api_url = emulator.base_url
    source = yaml.safe_load((SANDBOX / "gcp_gpu.yml").read_text())
    source.update(api_url=api_url, credentials_file=str(key))
    (tmp_path / "gcp_gpu.yml").write_text(yaml.safe_dump(source))
    proc = _run([str(BIN / "ansible-inventory"), "-i", str(tmp_path / "gcp_gpu.yml"), "--list"], _env())
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    port = api_url.split(":")[2].split("/")[0]
    assert "Connection refused" in said and f"port={port}" in said, said
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", int(port))) != 0, "listing started a service"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in a Python file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def test_no_inventory_plugin_starts_a_process() -> None:
    for plugin in sorted((REPO / "plugins" / "inventory").glob("*.py")):
        imported = {package for _, package in _imports(plugin)}
        assert not imported & {"subprocess", "multiprocessing"}, f"{plugin.name} can start a process"


# --- Nothing of the product knows the sandbox ------------------------------------------------------
# (forja's Python importing nothing of forja_sandbox is one of the layers: tests/foundation/test_layers.py)


def test_no_role_plugin_or_playbook_names_the_sandbox_package_or_its_variables() -> None:
    files = [REPO / "site.yml", *(p for d in ("roles", "plugins", "playbooks") for p in (REPO / d).rglob("*")
                                  if p.is_file() and p.suffix in {".yml", ".yaml", ".j2", ".py", ".sh"})]
    named = [str(p.relative_to(REPO)) for p in files
             if "forja_sandbox" in p.read_text(errors="replace")]
    assert named == []


# --- The product's wheel installs and runs without the sandbox --------------------------------------


# product_wheel: tests/sandbox/conftest.py (one build for every test of the wheel).


def test_the_wheel_carries_the_sandbox_inert_and_its_needs_only_in_the_extra(product_wheel: Path) -> None:
    with zipfile.ZipFile(product_wheel) as whl:
        names = whl.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip() for line in whl.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "sandbox = forja_sandbox.cli:app" in whl.read(entry_points).decode()
    assert "forja/cli/__init__.py" in names and "forja_sandbox/service.py" in names
    for package in ("google-api-python-client", "websocket-client", "cryptography"):
        (line,) = [r for r in requires if r.startswith(package)]
        assert 'extra == "sandbox"' in line, f"{package} is a core dependency: {line}"


@pytest.mark.slow
def test_the_wheel_installed_without_the_extra_runs_forja_help(product_wheel: Path, tmp_path: Path) -> None:
    """A fresh venv, the wheel and its core dependencies only (from the package index, cached
    under ~/.cache/forja/wheel-test-pip): `forja --help` works and has no `sandbox` command."""
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)], _env()).returncode == 0
    pip_cache = testhosts.base_dir() / "wheel-test-pip"
    installed = _run([str(venv / "bin" / "pip"), "install", "-q", "--cache-dir", str(pip_cache),
                      str(product_wheel)], _env())
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    outside = tmp_path / "elsewhere"  # not the checkout: only what the wheel installed is importable
    outside.mkdir()
    shown = _run([str(venv / "bin" / "forja"), "--help"], _env(COLUMNS="200"), cwd=outside)
    assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-3000:]
    commands = help_commands(shown.stdout)
    assert {"up", "configure", "train", "status", "tunnel", "cost", "runs"} <= commands, shown.stdout
    assert "sandbox" not in commands, shown.stdout
    sandbox = _run([str(venv / "bin" / "python"), "-c", "import forja_sandbox"], _env(), cwd=outside)
    assert sandbox.returncode != 0 and "pip install 'forja[sandbox]'" in sandbox.stderr, sandbox.stderr
    listed = _run([str(venv / "bin" / "pip"), "list", "--format=freeze"], _env(), cwd=outside).stdout.lower()
    assert "google-api-python-client" not in listed and "websocket-client" not in listed, listed
