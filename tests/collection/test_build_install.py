"""forja.gpu builds from the repository and works when installed from its tarball.

No Galaxy server is reachable here, so the test does what a user's `ansible-galaxy collection
install` from a release would do: build the tarball from this clone, install it into a temporary
collections path, and use it from a folder where the clone's own link
(collections/ansible_collections/forja/gpu) is not on any path: ansible-doc, a localhost play that
runs modules, a filter and the trainer_run role's input checks (which find the trainer package
shipped inside the collection), an entry point's argument spec, and every shipped playbook by FQCN.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
# Top-level folders that are the Python product, the sandbox, the tests or local state: never shipped.
NOT_CONTENT = ("tests", ".venv", "forja", "forja_sandbox", "molecule", "bench", "collections", "results",
               "inventory", "examples", ".git", ".ci")


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("build")
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    build = _run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(out)], env, REPO)
    assert build.returncode == 0, build.stdout + build.stderr
    assert "[WARNING]" not in build.stderr, build.stderr
    path = out / f"{GALAXY['namespace']}-{GALAXY['name']}-{GALAXY['version']}.tar.gz"
    assert path.is_file(), build.stdout
    return path


@pytest.fixture(scope="module")
def installed(tarball: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The collection installed into a fresh path, and the environment that sees only that copy."""
    work = tmp_path_factory.mktemp("installed")
    collections = work / "collections-installed"
    (work / "ansible.cfg").write_text(f"[defaults]\ncollections_path = {collections}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FORJA_"))}
    env |= {"ANSIBLE_CONFIG": str(work / "ansible.cfg"), "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",
            "ANSIBLE_HOME": str(work / "ansible-home"), "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"}
    install = _run([str(BIN / "ansible-galaxy"), "collection", "install", "--offline", str(tarball),
                    "-p", str(collections)], env, work)
    assert install.returncode == 0, install.stdout + install.stderr
    (work / "inventory.ini").write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    root = collections / "ansible_collections" / "forja" / "gpu"
    assert root.is_dir() and not root.is_symlink()
    return {"work": work, "env": env, "root": root}


def test_the_tarball_holds_the_content_and_nothing_else(tarball: Path):
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    tops = {name.split("/")[0] for name in names}
    assert not tops & set(NOT_CONTENT), tops & set(NOT_CONTENT)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    for expected in ("MANIFEST.json", "meta/runtime.yml", "plugins/modules/nvidia_facts.py",
                     "plugins/doc_fragments/gcp_auth.py", "plugins/module_utils/forja_gcp.py",
                     "roles/trainer_run/meta/argument_specs.yml", "playbooks/train.yml",
                     # bundled onto the hosts by trainer_run (trainer_run_trainer_src)
                     "trainer/train.py", "trainer/configs/digits.yaml"):
        assert expected in names, expected


def test_the_manifest_names_the_collection_and_the_ansible_it_needs(tarball: Path, installed: dict):
    with tarfile.open(tarball) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))["collection_info"]
    assert (manifest["namespace"], manifest["name"]) == ("forja", "gpu")
    assert manifest["version"] == GALAXY["version"]
    runtime = yaml.safe_load((installed["root"] / "meta" / "runtime.yml").read_text())
    assert runtime["requires_ansible"] == ">=2.19.0"


def test_only_the_installed_copy_is_seen(installed: dict):
    listed = _run([str(BIN / "ansible-galaxy"), "collection", "list", "forja.gpu", "--format", "json"],
                  installed["env"], installed["work"])
    assert listed.returncode == 0, listed.stderr
    paths = json.loads(listed.stdout)
    assert list(paths) == [str(installed["root"].parents[1])], paths


def test_ansible_doc_renders_the_installed_plugins(installed: dict):
    for kind, name in (("module", "forja.gpu.gcp_gpu_instance"), ("inventory", "forja.gpu.gcp_gpu"),
                       ("filter", "forja.gpu.forja_hourly_rate"), ("role", "forja.gpu.trainer_run"),
                       ("vars", "forja.gpu.gcp_ssh_path")):
        doc = _run([str(BIN / "ansible-doc"), "-t", kind, name], installed["env"], installed["work"])
        assert doc.returncode == 0 and "[WARNING]" not in doc.stderr, doc.stderr
        assert str(installed["root"]) in doc.stdout or kind == "role", doc.stdout[:300]
    # the shared auth options come from the installed doc fragment
    doc = _run([str(BIN / "ansible-doc"), "-t", "module", "forja.gpu.gcp_gpu_firewall"],
               installed["env"], installed["work"])
    assert "FORJA_GCP_CREDENTIALS_FILE" in doc.stdout and "operation_timeout" in doc.stdout


PLAY = """
- name: Use forja.gpu from the installed collection
  hosts: localhost
  gather_facts: false
  vars:
    trainer_run_command: [train.py]
    trainer_run_project_dir: "{work}/project"
    trainer_run_bundle_cache: "{work}/bundles"
    trainer_run_cpu_procs: 1
  tasks:
    - name: Check a run's inputs as the trainer_run role does
      ansible.builtin.include_role:
        name: forja.gpu.trainer_run
        tasks_from: validate.yml
        public: true

    - name: Pack the project
      forja.gpu.forja_bundle:
        sources: [{{path: "{work}/project", prefix: project}}]
        dest: "{work}/bundles"
      register: bundle

    - name: Ask the firewall module for a rule open to the internet
      forja.gpu.gcp_gpu_firewall:
        project: forja-test
        api_url: http://127.0.0.1:9/
        access_token: not-a-token
        source_ranges: [0.0.0.0/0]
      register: firewall
      ignore_errors: true

    - name: Record what happened
      ansible.builtin.copy:
        dest: "{work}/outcome.json"
        mode: "0600"
        content: >-
          {{{{ {{'run': trainer_run_name, 'nproc': trainer_run_nproc_used,
               'bundled': bundle.files, 'firewall': firewall.msg,
               'dpkg_query': ['bash'] | forja.gpu.forja_dpkg_query}} | to_json }}}}
"""


@pytest.fixture(scope="module")
def outcome(installed: dict) -> dict:
    work = installed["work"]
    (work / "project").mkdir()
    (work / "project" / "train.py").write_text("print('training')\n")
    (work / "play.yml").write_text(PLAY.format(work=work))
    run = _run([str(BIN / "ansible-playbook"), "-i", str(work / "inventory.ini"), str(work / "play.yml")],
               installed["env"], work, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return {"play": json.loads((work / "outcome.json").read_text())}


def test_the_roles_input_checks_pass_with_the_trainer_shipped_in_the_collection(outcome: dict):
    # validate.yml asserts that trainer_run_trainer_src (roles/trainer_run/../../trainer) is a folder
    assert outcome["play"]["run"] == "train"
    assert int(outcome["play"]["nproc"]) >= 1  # 1 CPU process here; one per GPU on a GPU controller
    assert outcome["play"]["bundled"] == 1


def test_the_role_looks_for_the_trainer_inside_the_installed_collection(installed: dict, outcome: dict):
    """Without the shipped trainer/ the role refuses to run, naming the folder it looked for."""
    work, trainer = installed["work"], installed["root"] / "trainer"
    trainer.rename(trainer.with_name("trainer.away"))
    try:
        run = _run([str(BIN / "ansible-playbook"), "-i", str(work / "inventory.ini"), str(work / "play.yml")],
                   installed["env"], work, timeout=600)
    finally:
        trainer.with_name("trainer.away").rename(trainer)
    assert run.returncode != 0
    looked_at = f"{installed['root']}/roles/trainer_run/../../trainer"
    assert f"trainer_run_trainer_src: {looked_at} is not a folder" in run.stdout, run.stdout[-3000:]


def test_the_modules_run_with_the_collections_module_utils(outcome: dict):
    assert "0.0.0.0/0" in outcome["play"]["firewall"], outcome["play"]["firewall"]
    assert outcome["play"]["dpkg_query"][:2] == ["dpkg-query", "--show"]


def test_a_shipped_playbook_validates_its_entry_points_arguments(installed: dict):
    """forja.gpu.train_fetch (trainer_run's fetch entry point) refuses a setting of the wrong type."""
    run = _run([str(BIN / "ansible-playbook"), "-i", str(installed["work"] / "inventory.ini"),
                "forja.gpu.train_fetch", "-e", "forja_hosts=localhost", "-e", "trainer_run_name=demo",
                "-e", "trainer_run_fetch_checkpoints=maybe"], installed["env"], installed["work"])
    assert run.returncode != 0
    assert "Validating arguments against arg spec 'fetch'" in run.stdout, run.stdout[-3000:]
    assert "trainer_run_fetch_checkpoints" in run.stdout.split("arg spec 'fetch'", 1)[1], run.stdout[-3000:]


def test_every_shipped_playbook_resolves_by_fqcn(installed: dict):
    playbooks = sorted(p.stem for p in (installed["root"] / "playbooks").glob("*.yml"))
    assert {"provision", "gpu", "jupyter", "train", "teardown"} <= set(playbooks)
    check = _run([str(BIN / "ansible-playbook"), "--syntax-check", "-i", "localhost,",
                  *[f"forja.gpu.{name}" for name in playbooks]], installed["env"], installed["work"])
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
