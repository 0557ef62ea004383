"""A real notebook 6.5.7 server on the controller's loopback, configured from the role's own template.

The controller's venv carries the same stack the role installs (notebook 6.5.7, jupyter_http_over_ws
0.0.8), so the Colab-like clients and the role's log filter can be tested here in seconds, without a
test host. The server reads the JSON that the role's template renders, so a template mistake fails
here first, and runs the extension with the role's own Cookie fix applied (read from the role's
task), so a fix that stops matching the extension fails here too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest
import requests
import yaml
from jupyter_helpers import ROLE, LocalServer, free_port, render_config

from forja_sandbox.serving import end_process


def fixed_extension(into: Path) -> Path:
    """Copy jupyter_http_over_ws into ``into`` with the role's Cookie fix, as the role does on the host."""
    tasks = yaml.safe_load((ROLE / "tasks" / "venv.yml").read_text())
    fix = next(t["ansible.builtin.replace"] for t in tasks
               if t["name"].startswith("Fix the extension's Cookie"))
    spec = importlib.util.find_spec("jupyter_http_over_ws")
    assert spec is not None and spec.origin, "jupyter_http_over_ws is missing (pip install -e '.[test]')"
    package = into / "jupyter_http_over_ws"
    shutil.copytree(Path(spec.origin).parent, package)
    handlers = package / "handlers.py"
    # The replacement is the role's internal constant (vars/main.yml), named in the task.
    internal = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    replace = jinja2.Template(fix["replace"], undefined=jinja2.StrictUndefined).render(**internal)
    fixed, count = re.subn(fix["regexp"], replace, handlers.read_text(), flags=re.MULTILINE)
    assert count == 1, f"the role's Cookie fix matched {count} lines of the installed extension"
    handlers.write_text(fixed)
    return into


@pytest.fixture(scope="session")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    root = tmp_path_factory.mktemp("jupyter")
    port = free_port()
    token = os.urandom(24).hex()
    token_file = root / "token"
    token_file.write_text(token)  # no trailing newline, as the role writes it
    token_file.chmod(0o600)
    (root / "config").mkdir()
    (root / "notebooks").mkdir()
    config = render_config(jupyter_colab_port=port, jupyter_colab_notebook_dir=str(root / "notebooks"))
    (root / "config" / "jupyter_notebook_config.json").write_text(json.dumps(config))
    (root / "config" / "migrated").write_text("forja\n")
    env = {
        **os.environ,
        "HOME": str(root),
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_TOKEN_FILE": str(token_file),
        # the role copies forja_redact_log.py into site-packages and fixes the extension in place
        "PYTHONPATH": os.pathsep.join([str(ROLE / "files"), str(fixed_extension(root / "site"))]),
        "PYTHONWARNINGS": "ignore::DeprecationWarning",
    }
    log = root / "server.log"
    argv = [sys.executable, "-m", "notebook", "--allow-root"] if os.geteuid() == 0 else [
        sys.executable, "-m", "notebook"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=root)
    try:
        _wait_ready(port, proc, log)
        yield LocalServer(port, token, log)
    finally:
        end_process(proc, grace_s=15)


def _wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the notebook server exited early:\n{log.read_text()}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/api", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the notebook server did not answer within 60 s:\n{log.read_text()}")
