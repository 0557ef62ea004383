"""forja.gpu installed from its tarball works with no forja package beside it.

One direction between Python and Ansible: forja reads the collection's module_utils, and nothing
under plugins/ imports forja, so a user who installs the collection alone (`ansible-galaxy
collection install`) gets filters that work. The test builds the tarball, installs it into a
throwaway collections path and runs a small localhost play with a Python that has ansible-core and
nothing of forja: the rate and format filters give forja's figures, and `import forja` (nor
`import trainer`) does not work there.

The Python: a fresh venv (no pip) whose site-packages holds links to ansible-core and its
dependencies, the very releases of forja's own venv (found through their installed metadata), and
nothing else; so it is the same ansible-core as `pip install ansible-core==<version>` would give,
without the package index.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())


def _dependency_closure(name: str) -> dict[str, metadata.Distribution]:
    """The installed distribution `name` and every distribution it needs here, by canonical name."""
    found: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        dist = metadata.distribution(todo.pop())
        key = canonicalize_name(dist.metadata["Name"])
        if key in found:
            continue
        found[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def _bare_venv(where: Path) -> Path:
    """A venv with ansible-core (and what it needs) and nothing of forja; returns its bin folder."""
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert made.returncode == 0, made.stderr
    (site,) = (where / "lib").glob("python3*/site-packages")
    dists = _dependency_closure("ansible-core")
    assert "forja" not in dists
    for dist in dists.values():
        tops = {Path(str(f)).parts[0] for f in dist.files or ()}
        for top in sorted(tops - {"..", "__pycache__"}):
            link = site / top
            if not link.exists():
                link.symlink_to(Path(str(dist.locate_file(top))).resolve())
    bin_dir = where / "bin"
    # pip's console scripts, for this venv's Python
    for tool in ("ansible-doc", "ansible-galaxy", "ansible-playbook"):
        lines = (BIN / tool).read_text().splitlines()
        assert lines[0].startswith("#!"), tool
        (bin_dir / tool).write_text("\n".join([f"#!{bin_dir / 'python'}", *lines[1:]]) + "\n")
        (bin_dir / tool).chmod(0o755)
    return bin_dir


PLAY = """
- name: Use forja.gpu's filters from the installed collection, without forja
  hosts: localhost
  gather_facts: false
  vars:
    l4: {machine_type: g2-standard-8, zone: us-east1-d, gpu_type: nvidia-l4, gpu_count: 1,
         provisioning_model: STANDARD, inventory_hostname: forja-l4}
    t4: {machine_type: n1-standard-8, zone: us-central1-a, gpu_type: nvidia-tesla-t4, gpu_count: 2,
         provisioning_model: SPOT, inventory_hostname: forja-t4}
    outcome:
      python: "{{ ansible_playbook_python }}"
      l4: "{{ l4 | forja.gpu.forja_hourly_rate }}"
      l4_spot: "{{ l4 | combine({'preemptible': true}) | forja.gpu.forja_hourly_rate }}"
      t4_spot: "{{ t4 | forja.gpu.forja_hourly_rate }}"
      l4_own: "{{ l4 | forja.gpu.forja_hourly_rate(prices=own_prices) }}"
      loss: "{{ 0.008180368691682816 | forja.gpu.forja_format('final_loss') }}"
      cost: "{{ 0.0019884954039891124 | forja.gpu.forja_format('cost_usd') }}"
      wall: "{{ 187 | forja.gpu.forja_format('wall_s') }}"
      rate: "{{ (l4 | forja.gpu.forja_hourly_rate) | forja.gpu.forja_format('hourly') }}"
  tasks:
    - name: Check the figures in the play itself
      ansible.builtin.assert:
        that:
          - (l4 | forja.gpu.forja_hourly_rate) == 0.8536
          - (0.97222 | forja.gpu.forja_format('accuracy')) == '97.2%'
          - (1249.6 | forja.gpu.forja_format('samples_per_s')) == '1,250 samples/s'

    - name: Record them
      ansible.builtin.copy:
        dest: "{{ out }}"
        mode: "0600"
        content: "{{ outcome | to_json }}"
"""


@pytest.fixture(scope="module")
def without_forja(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tarball built and installed, then a play run, all with the bare venv; what it recorded."""
    work = tmp_path_factory.mktemp("without-forja")
    bin_dir = _bare_venv(work / "venv")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANSIBLE_", "FORJA_", "PYTHON", "VIRTUAL_ENV"))}
    env |= {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(work), "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_CONFIG": str(work / "ansible.cfg"), "ANSIBLE_HOME": str(work / "ansible-home"),
            "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false", "ANSIBLE_LOCALHOST_WARNING": "false",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"}
    collections = work / "collections"
    (work / "ansible.cfg").write_text(f"[defaults]\ncollections_path = {collections}\n")

    def run(*argv: str, cwd: Path = work) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                              check=False)

    built = run(str(bin_dir / "ansible-galaxy"), "collection", "build", "-f", "--output-path", str(work),
                str(REPO))
    assert built.returncode == 0, built.stdout + built.stderr
    tarball = work / f"{GALAXY['namespace']}-{GALAXY['name']}-{GALAXY['version']}.tar.gz"
    installed = run(str(bin_dir / "ansible-galaxy"), "collection", "install", "--offline", str(tarball),
                    "-p", str(collections))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    own = {"machine_types": {"g2-standard-8": {"us-east1": {"on_demand": 0.70}}}}
    (work / "own-prices.yaml").write_text(yaml.safe_dump(own))
    (work / "play.yml").write_text(PLAY)
    out = work / "outcome.json"
    played = run(str(bin_dir / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                 "-e", json.dumps({"out": str(out), "own_prices": str(work / "own-prices.yaml"),
                                   "ansible_python_interpreter": str(bin_dir / "python")}),
                 str(work / "play.yml"))
    assert played.returncode == 0, played.stdout[-4000:] + played.stderr[-2000:]
    return {"bin": bin_dir, "env": env, "run": run, "work": work, "root": collections / "ansible_collections"
            / "forja" / "gpu", "outcome": json.loads(out.read_text())}


def test_the_play_ran_with_the_bare_python_where_forja_does_not_import(without_forja: dict):
    python = without_forja["bin"] / "python"
    assert without_forja["outcome"]["python"] == str(python)
    for package in ("forja", "trainer", "forja_sandbox"):
        tried = without_forja["run"](str(python), "-c", f"import {package}")
        assert tried.returncode != 0, package
        assert f"No module named '{package}'" in tried.stderr, tried.stderr
    shown = without_forja["run"](str(python), "-c", "import ansible; print(ansible.__version__)")
    assert shown.stdout.strip() == metadata.version("ansible-core")
    assert (without_forja["root"] / "plugins/module_utils/forja_gcp_prices.json").is_file()


def test_the_rate_filter_prices_hosts_with_the_collections_table(without_forja: dict):
    outcome = without_forja["outcome"]
    assert float(outcome["l4"]) == pytest.approx(0.8536)  # g2-standard-8 with its L4, on demand
    assert float(outcome["l4_spot"]) == pytest.approx(0.56)
    assert float(outcome["t4_spot"]) == pytest.approx(0.08 + 2 * 0.14)  # n1-standard-8 + 2 Spot T4s
    assert float(outcome["l4_own"]) == pytest.approx(0.70)  # the user's YAML merged over the table


def test_the_format_filter_shows_figures_as_forja_does(without_forja: dict):
    outcome = without_forja["outcome"]
    assert (outcome["loss"], outcome["cost"], outcome["wall"], outcome["rate"]) == (
        "0.008180", "0.2¢", "3m 07s", "$0.85/h")


def test_ansible_doc_renders_the_filters_without_forja(without_forja: dict):
    for name, expected in (("forja_hourly_rate", "FORJA_PRICES"), ("forja_format", "final_loss")):
        doc = without_forja["run"](str(without_forja["bin"] / "ansible-doc"), "-t", "filter",
                                   f"forja.gpu.{name}")
        assert doc.returncode == 0 and "[WARNING]" not in doc.stderr, doc.stderr
        assert str(without_forja["root"]) in doc.stdout and expected in doc.stdout, doc.stdout[:500]


def test_nothing_under_plugins_imports_forja():
    """The collection's Python reaches forja's facts in module_utils the Ansible way, never forja."""
    imports_forja = re.compile(r"^\s*(import|from)\s+forja\b|sys\.path\.(append|insert)")
    offenders = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
                 for path in sorted((REPO / "plugins").rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if imports_forja.search(line.split("#", 1)[0])]
    assert offenders == []


@pytest.mark.parametrize("where", ["module_utils/forja_cost", "plugin_utils/forja_format"])
def test_the_shared_module_utils_need_only_the_standard_library(where: str):
    """forja loads these files by path and the filters import them: no Ansible, no forja inside; a
    sibling or the collection's trainer (the Ansible way, else by bare name), and PyYAML only for a
    user's override file (ansible-core and forja both depend on it)."""
    tree = ast.parse((REPO / "plugins" / f"{where}.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    ours = {name for name in imported if name.startswith("ansible_collections.")}
    assert all(name.startswith("ansible_collections.forja.gpu.") for name in ours), ours
    others = {name.split(".")[0] for name in imported - ours}
    allowed = set(sys.stdlib_module_names) | {"__future__", "forja_gcp_machines", "trainer", "yaml"}
    assert others <= allowed, others - allowed
    assert "forja" not in others and "ansible" not in others
