"""The sandbox from the command line, as the README shows it: `forja sandbox up`, then the usual
commands with the sandbox's inventory named (`forja up` creates the VM on the sandbox, a real local
host), `forja sandbox status` names that host, and `forja sandbox down` leaves nothing behind. A
private sandbox folder and port keep it apart from the machine's own sandbox (the one `make sandbox`
uses), so the inventory is a copy of inventory/sandbox pointed at that port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from forja_sandbox import testhosts

pytestmark = [pytest.mark.hosts, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
FORJA = str(Path(sys.executable).with_name("forja"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _private_inventory(folder: Path, endpoint: dict[str, str]) -> tuple[Path, list[str]]:
    """inventory/sandbox with its fixed endpoint replaced by a private sandbox's: the gcp_gpu source
    rewritten, the group variables shared (a link) and their endpoints (Compute, Cloud Storage)
    overridden with -e."""
    folder.mkdir()
    source = yaml.safe_load((REPO / "inventory" / "sandbox" / "gcp_gpu.yml").read_text())
    source.update(api_url=endpoint["api_url"], credentials_file=endpoint["credentials_file"])
    (folder / "gcp_gpu.yml").write_text(yaml.safe_dump(source))
    (folder / "group_vars").symlink_to(REPO / "inventory" / "sandbox" / "group_vars")
    return folder, ["-e", f"gcp_instance_api_url={endpoint['api_url']}",
                    "-e", f"gcp_instance_credentials_file={endpoint['credentials_file']}",
                    "-e", f"gcp_bucket_storage_emulator_host={endpoint['storage_url']}"]


def test_sandbox_up_then_forja_up_then_sandbox_down(tmp_path: Path) -> None:
    # Its own hosts too (th60, th61): not the test run's sandbox's (tests/testsandbox.py).
    env = dict(os.environ, FORJA_SANDBOX_DIR=str(tmp_path / "sandbox"), FORJA_SANDBOX_PORT=str(_free_port()),
               FORJA_SANDBOX_HOSTS="60-61", FORJA_HOME=str(tmp_path / "home"))

    def forja(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([FORJA, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=900, check=False)

    try:
        up = forja("sandbox", "up", "--json")
        assert up.returncode == 0, up.stderr
        endpoint = json.loads(up.stdout)
        assert endpoint["api_url"] == f"http://127.0.0.1:{env['FORJA_SANDBOX_PORT']}/compute/v1/"
        inventory, overrides = _private_inventory(tmp_path / "inventory", endpoint)
        env["FORJA_INVENTORY"] = str(inventory)
        made = forja("--json", *overrides, "up")
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        assert json.loads(made.stdout)["status"] == "successful"
        status = json.loads(forja("sandbox", "status", "--json").stdout)
        assert status["running"] is True
        (row,) = status["instances"]
        assert row["up"] is True and row["instance"].endswith("forja-l4")
        index = int(row["host"].removeprefix("th"))
        assert testhosts.is_up(index)
    finally:
        down = forja("sandbox", "down")
    assert down.returncode == 0 and "sandbox cloud removed" in down.stdout
    after = json.loads(forja("sandbox", "status", "--json").stdout)
    assert after == {**after, "running": False, "instances": []}
    assert not testhosts.is_up(index)
