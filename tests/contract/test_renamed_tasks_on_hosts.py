"""The data contract on a real host (th28), in a copy of the tree whose role tasks are all renamed.

Renaming a task for wording must change nothing forja reads (issue 13, part 1): every `name:` of
every task in roles/*/tasks/*.yml (and of the plays' own tasks) gets a prefix in a copy of the
tree, then forja (the same code, pointed at the copy with FORJA_ROOT) sets up Jupyter on a
non-default port, trains the digits demo, reads the run's status and prints and opens the tunnel.
The facts the roles published in those plays are checked field by field against forja's pydantic
models.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from apihosts import REPO, ensure_wheelhouse, host_vars, write_inventory
from renamed_tree import PREFIX, renamed_copy

from forja import contract
from forja_sandbox import testhosts

pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.timeout(2400)]
INDEX = 28
PORT = 18800 + INDEX  # not the default 8888: forja must read the port the host serves
FORJA = Path(sys.executable).with_name("forja")
#: Runs one playbook of the tree FORJA_ROOT names through forja's runner; prints what was published.
PUBLISHED = """
import json, sys
from forja.events import TaskStarted
from forja.runner import PlaybookRun, run
tasks = []
result = run(PlaybookRun(playbook=sys.argv[1], inventory=sys.argv[2], extravars=json.loads(sys.argv[3]),
                         host_key_checking=False),
             on_event=lambda e: tasks.append(e.task) if isinstance(e, TaskStarted) else None)
print(json.dumps({"rc": result.rc, "artifact_data": result.artifact_data, "tasks": tasks}))
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout with every role task renamed (tests/renamed_tree.py)."""
    return renamed_copy(tmp_path_factory.mktemp("renamed") / "tree")


@pytest.fixture(scope="module")
def th28() -> Iterator[testhosts.Host]:
    if os.geteuid() != 0:
        pytest.skip("test hosts need root")
    ensure_wheelhouse()
    host = testhosts.up(INDEX, image="dlvm")  # the image's own PyTorch: Jupyter's kernel and the trainer's
    try:
        yield host
    finally:
        testhosts.down(INDEX)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, th28: testhosts.Host) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("contract")
    token = folder / "tokens" / "th28.jupyter-token"
    inventory = write_inventory(folder / "inventory.yml", {"th28": {
        **host_vars(th28), "jupyter_colab_token_fetch_path": str(token)}})
    return {"folder": folder, "inventory": inventory, "token": token}


def _env(tree: Path, work: dict[str, Any]) -> dict[str, str]:
    return {**os.environ, "FORJA_ROOT": str(tree), "FORJA_HOME": str(work["folder"] / "home"),
            "ANSIBLE_CONFIG": str(tree / "ansible.cfg")}


def _published(tree: Path, work: dict[str, Any], playbook: str, extravars: dict[str, Any]) -> dict[str, Any]:
    argv = [sys.executable, "-c", PUBLISHED, playbook, str(work["inventory"]), json.dumps(extravars)]
    proc = subprocess.run(argv, cwd=tree, env=_env(tree, work), capture_output=True, text=True,
                          timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rc"] == 0, out
    # Ansible's own implicit tasks (facts, argument specs) and handlers keep their names.
    handlers = {h["name"] for f in tree.glob("roles/*/handlers/*.yml")
                for h in yaml.safe_load(f.read_text()) or []}
    ran = [t for t in out["tasks"] if t != "Gathering Facts" and t not in handlers
           and not t.startswith("Validating arguments against arg spec")]
    assert ran and all(t.startswith(PREFIX) for t in ran), f"tasks not of the renamed copy: {ran}"
    return out["artifact_data"]


def _forja(tree: Path, work: dict[str, Any], *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    argv = [str(FORJA), "-i", str(work["inventory"]), "--no-host-key-checking", *args]
    return subprocess.run(argv, cwd=tree, env=_env(tree, work), capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def configured(tree: Path, work: dict[str, Any]) -> dict[str, Any]:
    """Jupyter set up on th28 on a non-default port (playbooks/jupyter.yml of the renamed tree)."""
    return _published(tree, work, "jupyter.yml", {"jupyter_colab_port": PORT})


def test_configure_publishes_the_connection_in_the_contract_without_the_token(
    configured: dict[str, Any], work: dict[str, Any]
) -> None:
    facts = contract.read_stats(configured).hosts["th28"]
    assert facts.contract_version == contract.CONTRACT_VERSION and facts.runs == []
    conn = facts.jupyter
    assert conn is not None and conn.port == PORT
    assert conn.argv[:3] == ["ssh", "-N", "-L"] and conn.argv[3] == f"{PORT}:127.0.0.1:{PORT}"
    assert conn.argv[-1] == f"ansible@{testhosts.address(INDEX)}"
    assert conn.colab_url_template == f"http://localhost:{PORT}/?token=<token>"
    assert conn.token_file == "/var/lib/forja/jupyter/token" and conn.local_token_file == str(work["token"])
    token = work["token"].read_text()
    assert len(token) >= 32 and token not in json.dumps(configured)


def test_status_reads_a_trained_run_although_every_task_was_renamed(
    tree: Path, work: dict[str, Any], configured: dict[str, Any]
) -> None:
    run = _forja(tree, work, "train", str(tree / "trainer/configs/digits.yaml"), "--name", "renamed-digits",
                 "--project", str(work["folder"]))
    said = " ".join(run.stderr.split())  # progress and announcements go to stderr
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # the announcements, recognised by their result key, not by the (renamed) task names
    assert "th28: Sending" in said and "PyTorch" in said and "renamed-digits completed on th28" in said
    status = _forja(tree, work, "--json", "status", "renamed-digits", timeout=600)
    assert status.returncode == 0, status.stdout + status.stderr
    (state,) = json.loads(status.stdout)
    assert (state["host"], state["run"], state["status"]) == ("th28", "renamed-digits", "completed")
    assert state["step"] == 300


def test_the_status_play_publishes_the_run_state_documents(
    tree: Path, work: dict[str, Any], configured: dict[str, Any]
) -> None:
    published = _published(tree, work, "train_status.yml", {"trainer_run_status_runs": ["renamed-digits"]})
    ((host, state),) = contract.read_stats(published).runs
    assert (host, state.run, state.status, state.final) == ("th28", "renamed-digits", "completed", True)
    assert state.step == 300
    assert state.summary is not None and state.summary["steps"] == 300 and state.loss is not None


def test_the_tunnel_uses_the_port_the_host_serves_and_reaches_jupyter(
    tree: Path, work: dict[str, Any], configured: dict[str, Any]
) -> None:
    printed = _forja(tree, work, "--json", "tunnel", "--print", timeout=600)
    assert printed.returncode == 0, printed.stdout + printed.stderr
    plan = json.loads(printed.stdout)
    assert (plan["local_port"], plan["remote_port"]) == (PORT, PORT)
    assert f"{PORT}:127.0.0.1:{PORT}" in plan["command"] and plan["colab_url"].endswith("?token=<token>")
    argv = [str(FORJA), "-i", str(work["inventory"]), "--no-host-key-checking", "tunnel"]
    proc = subprocess.Popen(argv, cwd=tree, env=_env(tree, work), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, f"forja tunnel exited {proc.returncode}"
            assert time.monotonic() < deadline, "the tunnel did not open"
            try:
                socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
                break
            except OSError:
                time.sleep(0.3)
        token = work["token"].read_text().strip()
        url = f"http://127.0.0.1:{PORT}/api/kernelspecs?token={token}"
        with urllib.request.urlopen(url, timeout=30) as answer:
            assert answer.status == 200 and json.load(answer)["kernelspecs"]
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_the_tunnel_of_a_host_without_jupyter_says_to_configure_it(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("test hosts need root")
    host = testhosts.up(29)
    try:
        inventory = write_inventory(tmp_path / "inventory.yml", {"th29": host_vars(host)})
        argv = [str(FORJA), "-i", str(inventory), "--no-host-key-checking", "--json", "tunnel", "--print"]
        proc = subprocess.run(argv, cwd=REPO, env={**os.environ, "FORJA_HOME": str(tmp_path / "home")},
                              capture_output=True, text=True, timeout=600, check=False)
    finally:
        testhosts.down(29)
    error = json.loads(proc.stdout)
    assert proc.returncode == 1 and error["host"] == "th29"
    assert "no Jupyter configuration" in error["message"] and "forja configure" in error["message"]
