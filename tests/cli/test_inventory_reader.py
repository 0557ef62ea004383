"""Every reader of the inventory sees plain values, with or without a filled fact cache.

The inventory is the real one forja uses on GCP and on the sandbox: the `gcp_gpu` plugin listing
VMs from the Compute emulator over HTTP. ansible-core 2.19 writes the plugin's values as
`{"__ansible_unsafe": ...}` in `ansible-inventory --list` and merges cached facts into them; the
fact cache is filled here as site.yml fills it (a real play gathering facts into the jsonfile cache
that ansible.cfg configures). Then `Forja.hosts()` and `forja cost` read it, and a stopped VM is
reported as stopped (exit 6) with autostop's reason, not as a network fault. (`forja tunnel` takes
its command from what the jupyter_colab role publishes, rendered by Ansible: tests/cli/test_cli.py.)
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from typer.testing import CliRunner

from forja import inventory
from forja.api import Forja
from forja.cli import app
from forja.errors import ExitCode
from forja_sandbox.compute_emulator import ComputeEmulator
from forja_sandbox.compute_emulator.metadata_server import MetadataServer
from forja_sandbox.compute_emulator.operations import Loopback

REPO = Path(__file__).resolve().parents[2]
PROJECT = "forja-sandbox"
runner = CliRunner()


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ComputeEmulator]:
    """The emulator with one running L4 VM, a fact cache of our own and a private forja home."""
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ANSIBLE_CACHE_PLUGIN_CONNECTION", str(tmp_path / "facts"))
    with ComputeEmulator() as emu:
        emu.seed_instances(PROJECT, "us-east1-d", 1, "forja-l4", {"forja": "managed"},
                           machine_type="g2-standard-8")
        yield emu


def source(emu: ComputeEmulator, path: Path, **options: Any) -> Path:
    """A gcp_gpu inventory source, as inventory/sandbox/gcp_gpu.yml writes it."""
    key = emu.write_service_account_key(path.with_suffix(".key.json"))
    path.write_text(yaml.safe_dump({"plugin": "forja.gpu.gcp_gpu", "projects": [PROJECT],
                                    "api_url": emu.base_url, "credentials_file": str(key), **options}))
    return path


def fill_fact_cache(src: Path) -> None:
    """Gather facts for every host into ansible.cfg's jsonfile cache, as site.yml's plays do."""
    play = src.with_name("gather.yml")
    play.write_text(yaml.safe_dump([{"name": "Gather facts", "hosts": "all", "gather_facts": True,
                                     "tasks": []}]))
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(src), str(play),
         "-e", "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    cached = list(src.parent.joinpath("facts").iterdir())
    assert cached, "the play filled the fact cache"


def markers(value: Any) -> list[Any]:
    """Every ansible-core unsafe marker left anywhere in a value."""
    if isinstance(value, dict):
        found = [value] if inventory.UNSAFE_MARKER in value else []
        return found + [m for v in value.values() for m in markers(v)]
    if isinstance(value, list):
        return [m for v in value for m in markers(v)]
    return []


def test_hosts_are_plain_and_the_fact_cache_changes_nothing(cloud: ComputeEmulator, tmp_path: Path) -> None:
    src = source(cloud, tmp_path / "cloud.gcp_gpu.yml")
    forja = Forja(tmp_path, inventory=src)
    (before,) = forja.hosts()
    fill_fact_cache(src)
    (after,) = forja.hosts()
    vm = cloud.instance(PROJECT, "us-east1-d", "forja-l4-0")
    nat_ip = vm["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
    assert after.address == nat_ip and type(after.address) is str
    assert after.vars["last_start_timestamp"] == vm["lastStartTimestamp"]
    assert markers(after.vars) == []
    assert after.vars == before.vars, "the fact cache must not change what forja reads"
    assert not [k for k in after.vars if k.startswith(("ansible_facts", "ansible_distribution"))]


def test_forja_cost_reads_the_inventory_after_the_fact_cache_is_filled(
    cloud: ComputeEmulator, tmp_path: Path,
) -> None:
    src = source(cloud, tmp_path / "cloud.gcp_gpu.yml")
    fill_fact_cache(src)
    result = runner.invoke(app, ["-i", str(src), "--json", "cost"])
    assert result.exit_code == 0, result.output
    (line,) = json.loads(result.stdout)["instances"]
    assert (line["name"], line["machine_type"], line["status"]) == ("forja-l4-0", "g2-standard-8", "RUNNING")
    assert line["uptime_s"] >= 0 and line["usd_per_hour"] > 0


def _call(emu: ComputeEmulator, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One Compute API call that returns an operation, waited on until DONE."""
    auth = {"Authorization": f"Bearer {emu.issue_token()}"}
    zone_url = f"{emu.base_url}projects/{PROJECT}/zones/us-east1-d"
    op = requests.request(method, f"{zone_url}/{path}", json=body, headers=auth, timeout=30).json()
    done = requests.post(f"{zone_url}/operations/{op['name']}/wait", headers=auth, timeout=60).json()
    assert done["status"] == "DONE" and "error" not in done, done
    return done




def _autostop_agent() -> Any:
    """The autostop agent as the role installs it on the VM (a standalone script)."""
    path = REPO / "roles" / "autostop" / "files" / "forja_autostop.py"
    spec = importlib.util.spec_from_file_location("forja_autostop", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # 7 s or more: the host tier's CPU lane, not make check
def test_a_stopped_vm_is_reported_stopped_since_when_why_and_how_to_start_it(
    cloud: ComputeEmulator, tmp_path: Path,
) -> None:
    cloud.backend = Loopback()
    _call(cloud, "POST", "instances", {
        "name": "forja-l4", "machineType": "zones/us-east1-d/machineTypes/g2-standard-8",
        "scheduling": {"onHostMaintenance": "TERMINATE"}, "labels": {"forja": "managed"},
        "disks": [{"boot": True, "initializeParams": {
            "sourceImage": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"}}],
        "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}],
        "metadata": {"items": [{"key": "enable-guest-attributes", "value": "TRUE"}]},
    })
    # The agent's own code records its decision through the VM's metadata server, then the VM stops.
    agent = _autostop_agent()
    with MetadataServer(cloud.api, "127.0.0.1", 0) as metadata:
        config = {**agent.DEFAULTS, "metadata_url": metadata.url}
        agent.record_stop_reason(config, {"time": "2026-11-24T06:00:00+00:00", "reasons": ["new boot"],
                                          "stop_reasons": ["idle for 1800 s (window 1800 s): no kernel"]})
    _call(cloud, "POST", "instances/forja-l4/stop")
    stopped_at = cloud.instance(PROJECT, "us-east1-d", "forja-l4")["lastStopTimestamp"]
    # SSH goes to a closed local port, so the "unreachable" part is quick and certain.
    src = source(cloud, tmp_path / "cloud.gcp_gpu.yml", guest_attributes=["forja/"],
                 compose={"ansible_host": "'127.0.0.1'", "ansible_port": 1})
    fill_fact_cache(src)

    result = runner.invoke(app, ["-i", str(src), "-l", "forja-l4", "--json", "logs", "digits"])
    assert result.exit_code == ExitCode.STOPPED == 6, result.output
    error = json.loads(result.stdout)
    assert (error["error"], error["host"], error["status"]) == ("HostStopped", "forja-l4", "TERMINATED")
    assert error["since"].startswith(stopped_at[:10]) and "ago" in error["since"]
    assert error["why"] == (
        "autostop stopped it (2026-11-24T06:00:00+00:00 idle for 1800 s (window 1800 s): no kernel)")
    assert "forja up" in error["message"] and "unreachable" not in error["message"]

    result = runner.invoke(app, ["-i", str(src), "tunnel", "--host", "forja-l4", "--print"])
    assert result.exit_code == ExitCode.STOPPED, result.output
    said = " ".join(result.output.split())
    assert "is stopped (status TERMINATED since" in said and "autostop stopped it" in said
    assert "forja up" in said


@pytest.mark.parametrize(
    ("listed", "plain_value"),
    [
        ({"__ansible_unsafe": "10.213.0.20"}, "10.213.0.20"),
        ([{"__ansible_unsafe": "a"}, 1, None], ["a", 1, None]),
        ({"labels": {"forja": {"__ansible_unsafe": "managed"}}}, {"labels": {"forja": "managed"}}),
        ({"__ansible_unsafe": "x", "other": 1}, {"__ansible_unsafe": "x", "other": 1}),  # not a marker
        (3, 3),
    ],
)
def test_plain_removes_every_unsafe_marker_and_nothing_else(listed: Any, plain_value: Any) -> None:
    assert inventory.plain(listed) == plain_value


def test_parse_keeps_inventory_variables_and_drops_cached_facts() -> None:
    listing = {
        "_meta": {"hostvars": {"vm": {
            "ansible_host": {"__ansible_unsafe": "10.0.0.2"}, "ansible_facts": {"distribution": "Ubuntu"},
            "ansible_local": {}, "zone": "us-east1-d"}}},
        "all": {"children": ["forja_gpu", "ungrouped"]},
        "forja_gpu": {"hosts": ["vm"]},
    }
    data = inventory.parse(listing)
    assert data.hostvars == {"vm": {"ansible_host": "10.0.0.2", "zone": "us-east1-d"}}
    assert data.group_hosts("all") == ["vm"] and data.group_hosts("forja_gpu") == ["vm"]


@pytest.mark.parametrize(
    ("stopped_at", "why", "expected"),
    [
        ("2026-11-24T06:00:00.000-08:00", None,
         "host vm is stopped (status TERMINATED since 2026-11-24 14:00 UTC, 30m 00s ago). "
         "Start it with `forja up` (or `forja tunnel --start`)."),
        (None, "idle for 1800 s",
         "host vm is stopped (status TERMINATED); autostop stopped it (idle for 1800 s). "
         "Start it with `forja up` (or `forja tunnel --start`)."),
    ],
)
def test_the_stopped_message_says_since_when_why_and_how_to_start(
    stopped_at: str | None, why: str | None, expected: str,
) -> None:
    hv: dict[str, Any] = {"status": "TERMINATED", "last_stop_timestamp": stopped_at}
    if why:
        hv["guest_attributes"] = {"forja/autostop": why}
    now = datetime(2026, 11, 24, 14, 30, tzinfo=timezone.utc)
    error = inventory.stopped_error(inventory.host_of("vm", hv), now=now)
    assert error.message == expected and error.exit_code == 6
