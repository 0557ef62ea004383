"""The two modules every role uses to find and layer on the image's PyTorch.

``torch_python_facts`` (discovery) and ``forja_torch_env`` (an environment layered on it): their
pure decisions are fed with real probe output, and both modules also run for real, the way Ansible
runs them (the module file with its arguments), against this machine's own interpreters - the
controller venv has PyTorch, like an image, and a bare ``python3 -I`` is a Python without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "plugins" / "modules" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


facts = _load("torch_python_facts")
env_module = _load("forja_torch_env")

# What the probe printed on the Deep Learning VM test host (dlvm layer) and on a plain jammy host.
DLVM_PROBE = ('{"python_version": "3.10.12", "prefix": "/usr", "executable": "/usr/bin/python3", '
              '"torch": "2.7.1", "site_dirs": ["/usr/local/lib/python3.10/dist-packages", '
              '"/usr/lib/python3/dist-packages", "/usr/lib/python3.10/dist-packages"]}')
BARE_PROBE = ('{"python_version": "3.10.12", "prefix": "/usr", "executable": "/usr/bin/python3", '
              '"torch": null, "site_dirs": ["/usr/local/lib/python3.10/dist-packages"]}')


def run_module(name: str, args: dict) -> tuple[int, dict]:
    """Run a module file as Ansible does on a host: its arguments in a JSON file, its result on stdout."""
    with_args = {"ANSIBLE_MODULE_ARGS": {"_ansible_check_mode": False, **args}}
    module = ROOT / "plugins" / "modules" / f"{name}.py"
    # The collection's module_utils are found as Ansible's module packaging finds them: through the
    # clone's collections/ folder (ansible_collections.forja.gpu).
    proc = subprocess.run([sys.executable, str(module), json.dumps(with_args)],
                          capture_output=True, text=True, check=False, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "collections")})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{name} printed no result: {proc.stdout}{proc.stderr}"
    return proc.returncode, json.loads(lines[-1])


@pytest.fixture(scope="module")
def python_without_torch(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real interpreter that has no torch: a venv of this Python without system site-packages."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


# --------------------------------------------------------------------------------------------------
# Discovery: pure decisions


@pytest.mark.parametrize(("version", "spec", "expected"), [
    ("2.7.1", ">=2.7,<2.8", True),
    ("2.7.1+cu128", ">=2.7,<2.8", True),
    ("2.8.0", ">=2.7,<2.8", False),
    ("2.6.0", ">=2.7,<2.8", False),
    ("2.7.1", "==2.7.1", True),
    ("2.7", "==2.7.0", True),
    ("2.7.1", "==2.7.*", True),
    ("2.8.0", "==2.7.*", False),
    ("2.7.1", "!=2.7.*", False),
    ("2.7.3", "~=2.7.1", True),
    ("2.8.0", "~=2.7.1", False),
    ("2.13.0+cpu", "", True),
    (None, "", False),
])
def test_a_pytorch_version_fits_a_specifier_like_pip_reads_it(version, spec, expected):
    assert facts.fits(version, spec) is expected


@pytest.mark.parametrize("spec", ["2.7", ">=two", "~=2", ">=2.*"])
def test_an_unreadable_specifier_is_an_error_naming_it(spec):
    with pytest.raises(ValueError, match=r"specifier|wildcard|two numbers"):
        facts.fits("2.7.1", spec)


def test_the_probe_result_is_the_last_line_after_any_warnings():
    out = "/usr/lib/python3/dist-packages/x.py:1: UserWarning: noise\n" + DLVM_PROBE + "\n"
    assert facts.parse_probe(out)["torch"] == "2.7.1"
    with pytest.raises(ValueError):
        facts.parse_probe("\n")


def test_the_first_fitting_candidate_wins_in_order():
    probed = [{"path": "/opt/conda/bin/python", "fits": False, "torch": "2.5.0"},
              {"path": "/usr/bin/python3", "fits": True, "torch": "2.7.1"},
              {"path": "/usr/local/bin/python3", "fits": True, "torch": "2.7.0"}]
    assert facts.choose(probed)["path"] == "/usr/bin/python3"
    assert facts.choose([{"path": "/usr/bin/python3", "fits": False}]) is None


def test_candidates_expand_globs_in_order_and_drop_missing_and_repeated(tmp_path: Path):
    for env in ("b", "a"):
        (tmp_path / "envs" / env / "bin").mkdir(parents=True)
        (tmp_path / "envs" / env / "bin" / "python").touch()
    (tmp_path / "user-python").touch()
    wanted = [str(tmp_path / "user-python"), str(tmp_path / "missing"),
              str(tmp_path / "envs" / "*" / "bin" / "python"), str(tmp_path / "user-python")]
    assert facts.expand(wanted) == [str(tmp_path / "user-python"),
                                    str(tmp_path / "envs" / "a" / "bin" / "python"),
                                    str(tmp_path / "envs" / "b" / "bin" / "python")]


# --------------------------------------------------------------------------------------------------
# Discovery: the module on real interpreters


def test_discovery_skips_an_interpreter_without_torch_and_finds_the_one_with_it(python_without_torch):
    rc, result = run_module("torch_python_facts", {
        "candidates": [python_without_torch, "/nonexistent/python", sys.executable],
        "default_candidates": [], "spec": ">=2"})
    assert rc == 0 and result["changed"] is False
    assert result["python"] == sys.executable
    import torch
    assert result["torch_version"] == torch.__version__
    assert [p["path"] for p in result["probed"]] == [python_without_torch, sys.executable]
    assert result["probed"][0]["torch"] is None and not result["probed"][0]["fits"]
    assert any(d.endswith("site-packages") for d in result["site_dirs"])


def test_a_named_interpreter_without_torch_is_refused_when_required(python_without_torch):
    rc, result = run_module("torch_python_facts", {
        "candidates": [python_without_torch], "only_candidates": True, "required": True})
    assert rc != 0 and result["failed"]
    assert "no interpreter with PyTorch" in result["msg"] and python_without_torch in result["msg"]
    assert result["python"] is None


def test_nothing_found_is_not_an_error_unless_required(python_without_torch):
    rc, result = run_module("torch_python_facts", {"candidates": [python_without_torch],
                                                   "only_candidates": True})
    assert rc == 0 and result["python"] is None


def test_the_cuda_probe_reports_what_torch_sees():
    rc, result = run_module("torch_python_facts", {"candidates": [sys.executable], "only_candidates": True,
                                                   "probe_cuda": True})
    import torch
    assert rc == 0
    assert result["cuda"]["available"] is torch.cuda.is_available()
    assert result["cuda"]["device_count"] == torch.cuda.device_count()


# --------------------------------------------------------------------------------------------------
# The layered environment: pure decisions


def test_the_constraints_pin_exactly_the_installed_versions():
    text = env_module.constraints_text({"torch": "2.7.1+cu128", "numpy": "2.2.6"})
    assert text.splitlines()[1:] == ["numpy==2.2.6", "torch==2.7.1+cu128"]
    assert text.startswith("#")


@pytest.mark.parametrize(("record", "mutable", "action"), [
    (None, False, "create"),
    (None, True, "create"),
    ({"inputs_hash": "h"}, False, "none"),
    ({"inputs_hash": "old"}, False, "rebuild"),
    ({"inputs_hash": "old"}, True, "update"),
])
def test_what_happens_to_an_existing_environment(record, mutable, action):
    assert env_module.plan(record, "h", mutable) == action


def test_the_inputs_hash_changes_with_the_requirements_and_the_base():
    params = {"packages": ["ipykernel==6.29.5"], "pip_package": "", "pip_args": "", "owner": None}
    base = {"base_executable": "/usr/bin/python3", "site_dirs": [], "pins": {"torch": "2.7.1"}}
    one = env_module.inputs_hash(base, params, "tabulate==0.9.0\n")
    assert one == env_module.inputs_hash(base, params, "tabulate==0.9.0\n")
    assert one != env_module.inputs_hash(base, params, "tabulate==0.8.10\n")
    assert one != env_module.inputs_hash({**base, "pins": {"torch": "2.7.0"}}, params, "tabulate==0.9.0\n")


# --------------------------------------------------------------------------------------------------
# The layered environment: the module for real (offline: --no-index)


@pytest.mark.slow  # 7 s or more: the host tier's CPU lane, not make check
def test_an_environment_sees_the_base_torch_pins_it_and_is_made_once(tmp_path: Path):
    path = tmp_path / "env"
    args = {"base_python": sys.executable, "path": str(path), "pip_args": "--no-index"}
    rc, first = run_module("forja_torch_env", args)
    assert rc == 0 and first["changed"] and first["action"] == "create", first
    import torch
    assert (path / "forja-constraints.txt").read_text().splitlines()[-1] == f"torch=={torch.__version__}"
    code = "import sys, torch; print(torch.__file__); print(sys.prefix)"
    seen = subprocess.run([first["python"], "-c", code], capture_output=True, text=True,
                          check=True).stdout.split()
    assert seen[0] == torch.__file__, "the environment must use the base's torch, not a copy"
    assert seen[1] == str(path)
    rc, second = run_module("forja_torch_env", args)
    assert rc == 0 and second["changed"] is False and second["action"] == "none"


def test_an_install_that_would_replace_torch_fails_and_leaves_nothing(tmp_path: Path):
    path = tmp_path / "env"
    rc, result = run_module("forja_torch_env", {"base_python": sys.executable, "path": str(path),
                                                "packages": ["torch==2.6.0"], "pip_args": "--no-index"})
    assert rc != 0 and result["failed"]
    assert "nothing is left half-installed" in result["msg"]
    assert "torch==2.6.0" in result["msg"]
    assert not path.exists()


def test_a_requirements_file_that_cannot_resolve_fails_and_leaves_nothing(tmp_path: Path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("no-such-package-forja-test==1.0\n")
    path = tmp_path / "env"
    rc, result = run_module("forja_torch_env", {"base_python": sys.executable, "path": str(path),
                                                "requirements": str(requirements), "pip_args": "--no-index"})
    assert rc != 0
    assert "no-such-package-forja-test" in result["msg"]
    assert not path.exists()
