"""The host_state module, run by ansible on this machine against real files, dpkg, a venv and HTTP.

The drift tests (test_drift.py) prove the roles repair what it reports on a test host; these pin
down each comparison on its own: what counts as different, and that nothing is reported when the
host is as asked.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_module(name: str, params: dict) -> subprocess.CompletedProcess[str]:
    """Run a forja.gpu module on localhost as a play would."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), "localhost", "-i", "localhost,", "-c", "local", "-o",
         "-e", f"ansible_python_interpreter={sys.executable}",
         "-m", f"forja.gpu.{name}", "-a", json.dumps(params)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"})


def host_state(**params: object) -> dict:
    """Run forja.gpu.host_state on localhost as a play would, and return its result."""
    proc = run_module("host_state", params)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.split("=>", 1)[1])


@pytest.fixture
def server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            self.send_response(200 if self.path == "/api" else 400)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_host_as_asked_has_no_differences(tmp_path, server):
    conf = tmp_path / "app.conf"
    conf.write_text("port = 8888\n")
    conf.chmod(0o640)
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    result = host_state(
        packages=["dpkg"] if shutil.which("dpkg-query") else [],
        directories=[{"path": str(tmp_path), "owner": user}],
        files=[{"path": str(conf), "checksum": hashlib.sha1(b"port = 8888\n").hexdigest(),
                "mode": "0640", "contains": "8888"}],
        pip=[{"python": sys.executable, "packages": [f"ansible-core=={metadata.version('ansible-core')}"]}],
        http=[{"url": f"{server}/api", "status": [200]}, {"url": f"{server}/ws", "status": [400]}],
    )
    assert result["ok"] is True and result["differences"] == [] and result["changed"] is False
    assert result["pip"][0]["purelib"]


def test_each_kind_of_drift_is_named(tmp_path, server):
    conf = tmp_path / "app.conf"
    conf.write_text("port = 9999\n")
    conf.chmod(0o644)
    tmp_path.chmod(0o755)
    result = host_state(
        packages=["forja-no-such-package"] if shutil.which("dpkg-query") else [],
        directories=[{"path": str(tmp_path / "gone")}, {"path": str(tmp_path), "mode": "0700"}],
        files=[{"path": str(conf), "checksum": hashlib.sha1(b"port = 8888\n").hexdigest(),
                "mode": "0640", "contains": "8888", "what": "config"},
               {"path": str(tmp_path / "unit.service")}],
        exists=[str(conf), str(tmp_path / "nothing")],
        pip=[{"python": sys.executable, "packages": ["ansible-core<1", "forja-no-such-dist"]},
             {"python": str(tmp_path / "venv/bin/python"), "packages": ["notebook==6.5.7"]}],
        http=[{"url": f"{server}/ws", "status": [200]}, {"url": "http://127.0.0.1:9/", "status": [200]}],
    )
    assert result["ok"] is False
    assert [d["reason"] for d in result["directories_differ"]] == [
        "missing", "mode 0755, not 0700"]
    config, unit = result["files_differ"]
    assert config["what"] == "config"  # the caller's own keys come back, to act on
    assert config["reason"] == "mode 0644, not 0640; content differs; lacks the required text"
    assert unit["reason"] == "missing"
    assert result["exists"] == {str(conf): True, str(tmp_path / "nothing"): False}
    assert result["pip"][0]["missing"] == ["ansible-core<1", "forja-no-such-dist"]
    assert result["pip"][1] == {"python": str(tmp_path / "venv/bin/python"), "purelib": None,
                                "missing": ["notebook==6.5.7"], "files_differ": []}
    got = [(d["url"].rsplit("/", 1)[-1], d["got"]) for d in result["http_differ"]]
    assert got == [("ws", 400), ("", None)]
    if shutil.which("dpkg-query"):
        assert result["packages_missing"] == ["forja-no-such-package"]
        assert "package forja-no-such-package: not installed" in result["differences"]


def test_an_entry_without_its_key_is_refused_with_the_field_named():
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), "localhost", "-i", "localhost,", "-c", "local", "-o",
         "-e", f"ansible_python_interpreter={sys.executable}",
         "-m", "forja.gpu.host_state", "-a", json.dumps({"files": [{"mode": "0644"}]})],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})
    assert proc.returncode != 0 and "files[0] has no 'path'" in proc.stdout


def test_nvidia_facts_makes_host_states_comparison_in_its_own_call(tmp_path):
    # nvidia_stack detects the stack and compares what it manages in one remote call: the state
    # option must report exactly what host_state reports for the same options.
    conf = tmp_path / "pins.pref"
    conf.write_text("Package: nvidia-*\n")
    conf.chmod(0o644)
    options = {"holds": ["forja-no-such-kernel"] if shutil.which("dpkg-query") else [],
               "files": [{"what": "pref", "path": str(conf), "mode": "0600"},
                         {"what": "unattended", "path": str(tmp_path / "gone")}],
               "exists": [str(conf)]}
    proc = run_module("nvidia_facts", {"state": options, "dlvm_markers": []})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = json.loads(proc.stdout.split("=>", 1)[1])["state"]
    assert [(f["what"], f["reason"]) for f in state["files_differ"]] == [
        ("pref", "mode 0644, not 0600"), ("unattended", "missing")]
    assert state["holds_installed"] == [] and state["ok"] is False
    alone = host_state(**options)
    assert state == {key: value for key, value in alone.items() if key != "changed"}


@pytest.mark.parametrize(("state", "message"), [
    ({"filez": []}, "state: unknown host_state option(s) ['filez']"),
    ({"units": [{"enabled": True}]}, "state: units[0] has no 'name'"),
])
def test_nvidia_facts_refuses_a_bad_state_option_naming_it(state, message):
    proc = run_module("nvidia_facts", {"state": state})
    assert proc.returncode != 0 and message in proc.stdout, proc.stdout


def test_torch_python_facts_reports_the_missing_packages_in_its_own_call():
    # trainer_run finds its PyTorch and the setup packages that are missing in one remote call.
    packages = ["dpkg", "forja-no-such-package"] if shutil.which("dpkg-query") else []
    proc = run_module("torch_python_facts", {"candidates": [sys.executable], "only_candidates": True,
                                             "state": {"packages": packages}})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.split("=>", 1)[1])
    assert result["probed"][0]["path"] == sys.executable
    assert result["state"]["packages_missing"] == packages[1:]
    assert result["state"]["ok"] is (not packages)


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_a_layered_environment_is_compared_with_its_record_as_forja_torch_env_would(tmp_path):
    # jupyter_colab calls forja_torch_env only for a kernel environment host_state reports out of date:
    # both must decide alike, from the record and the base interpreter, whatever the inputs.
    base = getattr(sys, "_base_executable", sys.executable)
    env = {"base_python": base, "path": str(tmp_path / "env"), "pin": [], "mutable": True}
    built = run_module("forja_torch_env", env)
    assert built.returncode == 0 and '"action": "create"' in built.stdout, built.stdout + built.stderr
    result = host_state(torch_envs=[
        {**env, "name": "as built"},  # extra keys (a role's own) are ignored
        {**env, "packages": ["forja-some-dist==1.0"]},
        {**env, "path": str(tmp_path / "never-built")},
        {**env, "path": str(tmp_path / "other"), "base_python": str(tmp_path / "no-python")},
        {**env, "mutable": False, "owner": "root"},
    ])
    assert [(e["action"], e["reason"]) for e in result["torch_envs"]] == [
        ("none", ""),
        ("update", "its inputs changed since it was built"),
        ("create", "no finished environment (no record)"),
        ("check", f"base_python: {tmp_path / 'no-python'} is not an executable interpreter on the host"),
        ("rebuild", "its inputs changed since it was built"),
    ]
    assert result["ok"] is False and len(result["differences"]) == 4
    again = run_module("forja_torch_env", env)  # and forja_torch_env agrees on the one found as built
    assert again.returncode == 0 and '"action": "none"' in again.stdout, again.stdout


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_torch_python_facts_compares_the_environment_it_layers_on_the_interpreter_it_finds(tmp_path):
    # trainer_run finds its PyTorch and learns whether its environment is current in one call, and calls
    # forja_torch_env only when it is not: both must agree, and the options it returns are the ones to use.
    base = getattr(sys, "_base_executable", sys.executable)
    wanted = {"path": str(tmp_path / "env"), "packages": [], "fallback_python": base,
              "fallback_packages": []}

    def facts() -> dict:
        proc = run_module("torch_python_facts", {"candidates": [str(tmp_path / "none")],
                                                 "only_candidates": True, "env": wanted})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout.split("=>", 1)[1])["env"]

    before = facts()  # no interpreter fits: the fallback is the base, with nothing pinned
    assert before["action"] == "create" and before["options"]["base_python"] == base
    assert before["options"]["pin"] == [] and before["python"] == str(tmp_path / "env" / "bin" / "python")
    built = run_module("forja_torch_env", {k: v for k, v in before["options"].items() if v is not None})
    assert built.returncode == 0, built.stdout + built.stderr
    result = json.loads(built.stdout.split("=>", 1)[1])
    after = facts()
    assert after["action"] == "none" and after["inputs_hash"] == result["inputs_hash"]
    assert after["python"] == result["python"]
    wanted["packages"] = ["forja-some-dist==1.0"]  # a changed input makes it stale again
    assert facts()["action"] == "rebuild"


def test_torch_python_facts_refuses_an_env_option_it_cannot_use_naming_it():
    proc = run_module("torch_python_facts", {"env": {"path": "/tmp/x", "base_python": "/usr/bin/python3"}})
    assert proc.returncode != 0, proc.stdout
    assert "env: give path" in proc.stdout and "base_python" in proc.stdout, proc.stdout


def test_torch_python_facts_reports_the_gpus_as_nvidia_facts_does():
    # trainer_run sizes its processes by the GPUs from the same call that finds PyTorch.
    proc = run_module("torch_python_facts", {"candidates": [sys.executable], "only_candidates": True,
                                             "gpus": True})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gpus = json.loads(proc.stdout.split("=>", 1)[1])["gpus"]
    alone = run_module("nvidia_facts", {"dlvm_markers": []})
    assert alone.returncode == 0, alone.stdout + alone.stderr
    stack = json.loads(alone.stdout.split("=>", 1)[1])
    assert gpus == {"pci_gpus": stack["pci_gpus"], "smi": stack["smi"]}
