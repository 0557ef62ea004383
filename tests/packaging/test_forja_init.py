"""`forja init` writes a starting inventory for a real Google Cloud project, and forja uses it.

No host, no Google: the inventory is checked by Ansible's own parsing (up to the credentials it
lacks, which must be the gcp_gpu plugin's "credentials: none found" sentence, never a plugin-name
error) and, against the in-process Compute API emulator, by the variables a host of it gets from the
linked shared settings. A bad option writes nothing; an existing inventory is kept unless --force.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from forja import inventory
from forja.cli import app
from forja.init import PROJECT_RULE
from forja_sandbox.compute_emulator import ComputeEmulator

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PROJECT = "my-project-123"
#: What picks a cloud or credentials from the environment: none of it reaches these tests.
CHOOSING_ENV = ("ANSIBLE_INVENTORY", "FORJA_INVENTORY", "FORJA_GCP_PROJECT", "FORJA_GCP_CREDENTIALS_FILE",
                "FORJA_GCP_ACCESS_TOKEN", "FORJA_GCP_API_URL", "GOOGLE_APPLICATION_CREDENTIALS",
                "XDG_CONFIG_HOME")
runner = CliRunner()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME (no ~/.config/forja, no application default credentials) and forja home."""
    for name in CHOOSING_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "forja-home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def _init(*args: str) -> object:
    return runner.invoke(app, ["init", *args], terminal_width=200)


def _forja(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "forja"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_init_writes_the_source_the_choices_and_links_to_the_shared_settings(home: Path, tmp_path: Path):
    key = tmp_path / "sa-key.json"
    key.write_text('{"type": "service_account", "private_key": "SECRET-NEVER-COPIED"}')
    folder = tmp_path / "inv"
    result = _init("--project", PROJECT, "--zone", "europe-west4-a", "--spot", "--ssh", "direct",
                   "--bucket", "my-ckpts", "--credentials-file", str(key), "--dir", str(folder))
    assert result.exit_code == 0, result.output
    source = yaml.safe_load((folder / "gcp_gpu.yml").read_text())
    shipped = yaml.safe_load((REPO / "inventory" / "gcp_gpu.yml").read_text())
    assert source == {**shipped, "projects": [PROJECT], "credentials_file": str(key)}
    assert list(source)[:2] == ["plugin", "projects"]
    chosen = yaml.safe_load((folder / "group_vars" / "all" / "project.yml").read_text())
    assert chosen["gcp_instance_project"] == PROJECT and chosen["gcp_instance_zone"] == "europe-west4-a"
    assert chosen["gcp_instance_spot"] is True and chosen["gcp_instance_ssh_mode"] == "direct"
    assert chosen["gcp_instance_credentials_file"] == str(key) and chosen["gcp_bucket_name"] == "my-ckpts"
    written = "".join(p.read_text() for p in folder.rglob("*.yml") if not p.is_symlink())
    assert "SECRET-NEVER-COPIED" not in written, "the key's content was copied"
    shared = sorted((REPO / "inventory" / "group_vars" / "all").glob("*.yml"))
    for path in shared:  # one home: the shipped files, linked, never copied
        link = folder / "group_vars" / "all" / path.name
        assert link.is_symlink() and link.resolve() == path.resolve(), link
    said = " ".join(result.output.split())
    assert f"forja -i {folder} check" in said and f"forja -i {folder} up" in said, said
    assert said.index("check") < said.index(f"forja -i {folder} up")


def test_a_bad_project_id_is_refused_naming_the_rule_and_nothing_is_written(home: Path, tmp_path: Path):
    for bad in ("My_Project", "short", "1project-abc", "project-ends-with-", "a" * 31, ""):
        result = _init("--project", bad, "--dir", str(tmp_path / "inv"))
        assert result.exit_code == 2, (bad, result.output)
        said = " ".join(result.output.split())
        assert "--project" in said and " ".join(PROJECT_RULE.split()) in said, said
        assert not (tmp_path / "inv").exists(), bad
    assert not (home / ".config").exists()


def test_other_bad_options_are_refused_naming_the_option(home: Path, tmp_path: Path):
    for option, value in (("--zone", "us-east1"), ("--ssh", "telnet"), ("--bucket", "No_Caps!"),
                          ("--credentials-file", str(tmp_path / "missing.json"))):
        result = _init("--project", PROJECT, option, value, "--dir", str(tmp_path / "inv"))
        assert result.exit_code == 2 and option in result.output, result.output
        assert not (tmp_path / "inv").exists()


def test_an_existing_inventory_is_kept_unless_force(home: Path, tmp_path: Path):
    folder = tmp_path / "inv"
    assert _init("--project", PROJECT, "--dir", str(folder)).exit_code == 0
    again = _init("--project", "other-project-1", "--dir", str(folder))
    assert again.exit_code == 2 and "--force" in again.output, again.output
    assert yaml.safe_load((folder / "gcp_gpu.yml").read_text())["projects"] == [PROJECT]
    (folder / "notes.txt").write_text("mine")
    forced = _init("--project", "other-project-1", "--dir", str(folder), "--force")
    assert forced.exit_code == 0, forced.output
    assert yaml.safe_load((folder / "gcp_gpu.yml").read_text())["projects"] == ["other-project-1"]
    assert (folder / "notes.txt").read_text() == "mine", "--force replaces init's files only"


def test_the_default_folder_honours_xdg_config_home_and_becomes_forjas_default(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    assert inventory.chosen() is None, "no inventory before init"
    result = _init("--project", PROJECT)
    assert result.exit_code == 0, result.output
    assert (home / ".config" / "forja" / "inventory" / "gcp_gpu.yml").is_file()
    assert inventory.chosen() == str(home / ".config" / "forja" / "inventory")
    said = " ".join(result.output.split())
    assert "forja check" in said and "forja up" in said and "-i " not in said, said
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert inventory.chosen() is None, "$XDG_CONFIG_HOME/forja/inventory is the one looked for"
    assert _init("--project", PROJECT).exit_code == 0
    assert inventory.chosen() == str(tmp_path / "xdg" / "forja" / "inventory")
    monkeypatch.setenv("FORJA_INVENTORY", str(tmp_path / "elsewhere"))
    assert inventory.chosen() == str(tmp_path / "elsewhere"), "FORJA_INVENTORY wins over the default"


def test_without_an_inventory_forja_names_init_among_the_choices(home: Path):
    error = inventory.not_chosen()
    assert "forja init --project PROJECT_ID" in error.message
    assert str(home / ".config" / "forja" / "inventory") in error.message


def test_without_credentials_the_inventory_fails_with_the_plugins_credentials_sentence(
        home: Path, tmp_path: Path):
    """From a folder outside the clone, with -i and with the default: the collection is found and its
    gcp_gpu plugin read the config, and what stops it is the credentials, said by the plugin."""
    folder = tmp_path / "inv"
    assert _init("--project", PROJECT, "--dir", str(folder)).exit_code == 0
    assert _init("--project", PROJECT).exit_code == 0  # ~/.config/forja/inventory
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for args in (["-i", str(folder), "status"], ["status"]):
        proc = _forja(*args, cwd=elsewhere, env=dict(os.environ))
        said = " ".join(proc.stderr.split())
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "credentials: none found" in said and PROJECT in said, said
        assert "Incorrect plugin name" not in said and "No inventory was parsed" not in said, said
    listed = subprocess.run([str(BIN / "ansible-inventory"), "-i", str(folder), "--list"], cwd=REPO,
                            capture_output=True, text=True, timeout=300, check=False)
    assert listed.returncode != 0 and "credentials: none found" in listed.stderr, listed.stderr[-3000:]


def test_a_host_of_the_inventory_gets_the_choices_and_the_shared_settings(home: Path, tmp_path: Path):
    """The linked shared settings (SSH path, guest attributes, the demo's trainer config) and the
    user's choices reach the play, read by Ansible from the written inventory."""
    folder = tmp_path / "inv"
    with ComputeEmulator(projects=(PROJECT,)) as emulator:
        key = emulator.write_service_account_key(tmp_path / "sa-key.json")
        assert _init("--project", PROJECT, "--ssh", "direct", "--credentials-file", str(key),
                     "--dir", str(folder)).exit_code == 0
        source = yaml.safe_load((folder / "gcp_gpu.yml").read_text())
        (folder / "gcp_gpu.yml").write_text(yaml.safe_dump({**source, "api_url": emulator.base_url,
                                                            "cache": False}))
        shown = ("gcp_instance_project", "gcp_instance_ssh_mode", "gcp_bucket_project", "ansible_user",
                 "jupyter_colab_tunnel_via_iap", "gcp_instance_metadata", "trainer_run_config")
        msg = "{{ {" + ", ".join(f"'{name}': {name}" for name in shown) + "} | to_json }}"
        env = {**os.environ, "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_NOCOLOR": "1"}
        argv = [str(BIN / "ansible"), "localhost", "-i", str(folder), "-m", "ansible.builtin.debug",
                "-a", f"msg={msg}"]
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                              check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # ad-hoc's one line: localhost | SUCCESS => {"msg": ...}
    got = json.loads(proc.stdout.split("=>", 1)[1])["msg"]
    got = json.loads(got) if isinstance(got, str) else got
    defaults = yaml.safe_load((REPO / "roles" / "gcp_instance" / "defaults" / "main.yml").read_text())
    assert got["gcp_instance_project"] == got["gcp_bucket_project"] == PROJECT
    assert got["gcp_instance_ssh_mode"] == "direct"
    assert got["jupyter_colab_tunnel_via_iap"] in (False, "False")
    assert got["ansible_user"] == defaults["gcp_instance_ssh_user"]
    assert got["gcp_instance_metadata"] == {"enable-guest-attributes": "TRUE"}
    assert got["trainer_run_config"] == str(REPO / "trainer" / "configs" / "mnist.yaml")


def test_a_link_to_shared_settings_that_are_gone_is_named(home: Path, tmp_path: Path):
    folder = tmp_path / "inv"
    assert _init("--project", PROJECT, "--dir", str(folder)).exit_code == 0
    link = folder / "group_vars" / "all" / "access.yml"
    link.unlink()
    link.symlink_to(tmp_path / "old-forja" / "access.yml")
    with pytest.raises(Exception) as raised:
        inventory.required(str(folder))
    said = str(raised.value)
    assert str(link) in said and "forja init --force" in said, said


def test_forjas_own_inventories_are_never_written(home: Path, tmp_path: Path):
    """--force replaces files: not in the shipped inventory/, nor through a folder linked to it."""
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "group_vars").symlink_to(REPO / "inventory" / "group_vars")
    before = {p: p.read_bytes() for p in (REPO / "inventory").rglob("*") if p.is_file()}
    for folder in (REPO / "inventory", REPO / "inventory" / "sandbox", linked):
        result = _init("--project", PROJECT, "--dir", str(folder), "--force")
        assert result.exit_code == 2 and "forja's own inventories" in result.output, result.output
    assert {p: p.read_bytes() for p in (REPO / "inventory").rglob("*") if p.is_file()} == before
