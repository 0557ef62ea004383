"""The suite's own tools: where its time goes, one run of host tests at a time, a host-free check tier.

Each is run as a person runs it: a real pytest process over a small test file, the real script
over what it wrote, a second run against a held lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import testsandbox
import yaml

from forja_sandbox import service, testhosts

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = '''
import time
import pytest

@pytest.fixture(scope="session")
def slow_bring_up():
    time.sleep(0.4)
    yield "up"

def test_uses_it(slow_bring_up):
    time.sleep(0.2)
    assert slow_bring_up == "up"

def test_fails():
    assert 1 == 2
'''


def _pytest(
    *args: str, cwd: Path, env: dict[str, str], times: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """A pytest of its own: not an xdist worker, as this test's process may be (`make check`), and
    recording its times in ``times``, never in the run's own (.ci-logs/test-times.jsonl)."""
    env = {k: v for k, v in env.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    env["FORJA_TEST_TIMES"] = str(times) if times else os.devnull
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_run_records_its_phases_and_bring_ups_and_the_script_tables_them(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    times = tmp_path / "times.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    run = _pytest("-p", "timings", "test_sample.py", cwd=tmp_path, env=env, times=times)
    assert run.returncode == 1, run.stdout + run.stderr  # one test fails on purpose

    records = [json.loads(line) for line in times.read_text().splitlines()]
    (fixture,) = [r for r in records if r["kind"] == "fixture"]
    assert (fixture["fixture"], fixture["scope"]) == ("slow_bring_up", "session")
    assert 0.4 <= fixture["duration"] < 5
    calls = {r["nodeid"]: r for r in records if r["kind"] == "phase" and r["when"] == "call"}
    assert calls["test_sample.py::test_uses_it"]["outcome"] == "passed"
    assert calls["test_sample.py::test_fails"]["outcome"] == "failed"
    assert [r["event"] for r in records if r["kind"] == "session"] == ["start", "finish"]

    table = subprocess.run([sys.executable, str(ROOT / "bench" / "suite_times.py"), str(times),
                            "--bring-up-min", "0.3", "--ci-elapsed", "600"],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert "| slow_bring_up | session | test_sample.py | 1 |" in table  # the file of the test that paid
    assert "| test_sample.py | 2 |" in table  # the per-file row: both tests
    assert "CI run so far: 600 s of 5,400 s (11%); margin 4,800 s (80.0 min)." in table
    assert table.rstrip().endswith("1 failed: test_sample.py::test_fails")


@pytest.mark.slow  # 7 s or more: the host tier's CPU lane, not make check
@pytest.mark.skipif(os.geteuid() != 0, reason="host tests (and so the lock) need root")
def test_a_second_run_of_host_tests_refuses_while_the_first_holds_the_hosts(tmp_path: Path) -> None:
    lock = tmp_path / ".test-run.lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("pid 1234, started earlier: pytest tests\n")
        held.flush()
        env = {**os.environ, "TH_BASE": str(tmp_path)}
        env.pop("FORJA_TIER", None)
        run = _pytest("--collect-only", "tests/foundation/test_testhosts.py", cwd=ROOT, env=env)
    assert run.returncode == 4, run.stdout + run.stderr
    said = " ".join(run.stderr.split())
    assert "another test run holds the test hosts (pid 1234, started earlier: pytest tests)" in said
    assert str(lock) in said
    # Without host tests nothing is locked: the check tier runs beside a host run.
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        run = _pytest("--collect-only", "tests/foundation/test_dpkg_filter.py", cwd=ROOT, env=env)
        assert run.returncode == 0, run.stdout + run.stderr
        # nor when `-m` leaves none of a file's host tests
        run = _pytest("--collect-only", "-m", "not hosts", "tests/foundation/test_testhosts.py", cwd=ROOT,
                      env=env)
        assert run.returncode == 0, run.stdout + run.stderr  # its other tests, and no refusal


def test_the_host_tier_runs_every_host_file_in_one_lane_and_each_other_file_alone() -> None:
    from lanes import lane_of

    hosts = frozenset({"tests/sandbox/test_site_e2e.py", "tests/molecule/test_scenarios.py",
                       "tests/api/test_long_runs.py"})
    lanes = {n: lane_of(n, hosts) for n in (
        "tests/sandbox/test_site_e2e.py::test_a", "tests/molecule/test_scenarios.py::test_scenario[autostop]",
        "tests/api/test_long_runs.py::test_b", "tests/training/test_trainer_ddp.py::test_c",
        "tests/training/test_trainer_ddp.py::test_d", "tests/api/test_runner.py::test_e")}
    assert set(list(lanes.values())[:3]) == {"hosts"}
    assert lanes["tests/training/test_trainer_ddp.py::test_c"] == "tests/training/test_trainer_ddp.py"
    assert lanes["tests/training/test_trainer_ddp.py::test_d"] == "tests/training/test_trainer_ddp.py"
    assert lanes["tests/api/test_runner.py::test_e"] == "api"  # shares th6 with the api host tests' files
    # two host lanes: the test sandbox's files apart from the other host files
    assert lane_of("tests/sandbox/test_site_e2e.py::test_a", hosts, 2) == "sandbox"
    assert lane_of("tests/api/test_long_runs.py::test_b", hosts, 2) == "hosts"
    cpu = "tests/training/test_trainer_ddp.py"
    assert lane_of(f"{cpu}::test_c", hosts, 2) == cpu
    # a host file with a host of its own, in the sandbox's lane to even the two lanes
    drift = hosts | {"tests/rerun/test_drift.py"}
    assert lane_of("tests/rerun/test_drift.py::test_f", drift, 2) == "sandbox"
    assert lane_of("tests/rerun/test_drift.py::test_f", drift) == "hosts"


def test_the_check_tier_names_a_test_that_reaches_a_host_or_the_sandbox(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FORJA_TIER", "check")
    monkeypatch.setenv("TH_BASE", str(tmp_path))
    monkeypatch.setenv("FORJA_SANDBOX_DIR", str(tmp_path / "sandbox"))
    with pytest.raises(testhosts.TestHostError, match=r"booted test host th99: mark it `@pytest.mark.hosts`"):
        testhosts.up(99)
    with pytest.raises(testhosts.TestHostError, match="started the sandbox service: mark it"):
        service.ensure_running()
    assert list(tmp_path.iterdir()) == []  # refused before anything was made


def test_the_test_runs_sandbox_inventory_states_that_sandboxs_endpoint_and_no_other(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The tests' copy of inventory/sandbox reaches the test run's sandbox (its port, key and
    buckets' services), so nothing a test does lands in the sandbox `make sandbox` made."""
    monkeypatch.setenv("TH_BASE", str(tmp_path))
    for name, value in testsandbox.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TH_NET", raising=False)
    folder = testsandbox.write_inventory(tmp_path / "checkout" / "sandbox")
    endpoint = service.endpoint()
    assert endpoint["api_url"] == "http://127.0.0.1:8189/compute/v1/"
    assert endpoint["credentials_file"] == str(tmp_path / "test-sandbox" / "service-account.json")
    assert service.host_slots() == (50, 59)
    source = yaml.safe_load((folder / "gcp_gpu.yml").read_text())
    group_vars = yaml.safe_load((folder / "group_vars" / "all" / "sandbox.yml").read_text())
    assert source["api_url"] == endpoint["api_url"] == group_vars["gcp_instance_api_url"]
    key = endpoint["credentials_file"]
    assert source["credentials_file"] == key == group_vars["gcp_instance_credentials_file"]
    assert group_vars["autostop_metadata_url"] == endpoint["metadata_url"]
    assert group_vars["gcp_instance_ssh_address_url"] == service.address_url()
    assert group_vars["gcp_instance_os_login_url"] == service.oslogin_url()
    assert group_vars["gcp_bucket_storage_emulator_host"] == endpoint["storage_url"]
    assert group_vars["trainer_run_env"]["STORAGE_EMULATOR_HOST"] == service.storage_url(bridge=True)
    token = str(tmp_path / "test-sandbox" / "tokens" / "{{ inventory_hostname }}.jupyter-token")
    assert group_vars["jupyter_colab_token_fetch_path"] == token
    shared = sorted(p.name for p in (folder / "group_vars" / "all").iterdir() if p.is_symlink())
    assert shared == ["access.yml", "gcp.yml"]
    assert all(p.resolve().is_file() for p in (folder / "group_vars" / "all").iterdir())


def test_a_bad_host_range_for_the_sandbox_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FORJA_SANDBOX_HOSTS", "59-50")
    with pytest.raises(ValueError, match=r"FORJA_SANDBOX_HOSTS='59-50': give the first and last host index"):
        service.host_slots()
    monkeypatch.delenv("FORJA_SANDBOX_HOSTS")
    assert service.host_slots() == (10, 19)
