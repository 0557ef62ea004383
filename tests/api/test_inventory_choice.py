"""Which inventory a `Forja` acts on, and the start of a stopped VM, as the API says them.

`Forja(inventory=None)` reads FORJA_INVENTORY by the CLI's own rule (`forja.inventory.chosen`), and
with nothing named stops with the choices before a play runs or a run is recorded. A stopped VM
that `tunnel(start=True)` starts is announced as a `HostStarting` event on the call's listeners,
before its provision play, from the one reading of the inventory the call made.
Real ansible-inventory and ansible-playbook runs; the provision play fails at once for want of a
GCP project, which is as far as these tests need it to go.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from forja import errors
from forja import events as ev
from forja.api import Forja
from forja.history import History

REPO = Path(__file__).resolve().parents[2]
#: What names an inventory or a cloud from the environment; each test sets what it means to.
CHOOSING_ENV = (
    "ANSIBLE_INVENTORY",
    "FORJA_INVENTORY",
    "FORJA_GCP_PROJECT",
    "FORJA_GCP_CREDENTIALS_FILE",
    "FORJA_GCP_ACCESS_TOKEN",
    "FORJA_GCP_API_URL",
    "GOOGLE_APPLICATION_CREDENTIALS",
)
CHOICES = ("-i inventory/sandbox", "-i inventory/gcp_gpu.yml", "FORJA_INVENTORY")

#: An inventory script that lists one stopped VM and logs which program read it (its parent).
STOPPED_VM_SCRIPT = """#!{python}
import json, os
with open("/proc/%d/cmdline" % os.getppid(), "rb") as cmdline:
    reader = cmdline.read().replace(b"\\0", b" ").decode()
with open({log!r}, "a") as log:
    log.write(reader + "\\n")
stopped = {{"status": "TERMINATED", "ansible_host": "127.0.0.1"}}
print(json.dumps({{"forja_gpu": {{"hosts": ["gpu-1"]}}, "_meta": {{"hostvars": {{"gpu-1": stopped}}}}}}))
"""


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in CHOOSING_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    return tmp_path


def gpu_inventory(path: Path, *names: str) -> Path:
    hosts = {name: {"ansible_host": "127.0.0.1"} for name in names}
    path.write_text(yaml.safe_dump({"all": {"children": {"forja_gpu": {"hosts": hosts}}}}))
    return path


def stopped_vm_inventory(folder: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The script inventory and the log of its readers (script inventories enabled for this test)."""
    script, log = folder / "stopped_vm.py", folder / "readers.log"
    script.write_text(STOPPED_VM_SCRIPT.format(python=sys.executable, log=str(log)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("ANSIBLE_INVENTORY_ENABLED", "script,yaml")
    return script, log


def test_forja_reads_forja_inventory_as_the_command_does(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_inventory(clean_env / "inventory.yml", "gpu-a")
    monkeypatch.chdir(clean_env)
    monkeypatch.setenv("FORJA_INVENTORY", "inventory.yml")  # relative, as a user types it
    forja = Forja(history=History(clean_env / "h.sqlite"))
    assert forja.inventory == str(clean_env / "inventory.yml")
    assert [h.name for h in forja.hosts()] == ["gpu-a"]


def test_an_inventory_given_wins_over_forja_inventory(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORJA_INVENTORY", str(gpu_inventory(clean_env / "env.yml", "from-env")))
    given = gpu_inventory(clean_env / "given.yml", "given")
    assert [h.name for h in Forja(inventory=given).hosts()] == ["given"]


def test_with_no_inventory_named_nothing_runs_and_the_error_names_the_choices(clean_env: Path) -> None:
    runner_dir = clean_env / "runner"
    forja = Forja(private_data_dir=runner_dir, history=History(clean_env / "h.sqlite"))
    calls = {
        "up": forja.up,
        "status": forja.status,
        "hosts": forja.hosts,
        "tunnel": lambda: forja.tunnel(start=True),
        "cost": forja.cost,
        "train": lambda: forja.train(REPO / "trainer/configs/digits.yaml", project=clean_env),
    }
    for name, call in calls.items():
        with pytest.raises(errors.ConfigError) as caught:
            call()
        said = caught.value.message
        assert caught.value.field == "inventory", name
        assert "no inventory chosen" in said and all(choice in said for choice in CHOICES), f"{name}: {said}"
    assert not runner_dir.exists(), "no playbook was started"
    assert forja.history.list() == [], "no run was recorded"


DIGITS = REPO / "trainer/configs/digits.yaml"


def verbs_needing_hosts(forja: Forja, env: Path) -> dict[str, Callable[[], object]]:
    """Every call of `forja` that needs the inventory's hosts, by the verb's name."""
    return {
        "up": forja.up,
        "status": forja.status,
        "logs": lambda: forja.logs("digits"),
        "runs --sync": lambda: forja.runs(sync=True),
        "fetch": lambda: forja.fetch("digits", env / "out"),
        "stop": lambda: forja.stop("digits"),
        "hosts": forja.hosts,
        "tunnel": forja.tunnel,
        "cost": forja.cost,
        "train": lambda: forja.train(DIGITS, project=env),
    }


def test_a_misspelled_inventory_is_an_error_naming_it_for_every_verb(clean_env: Path) -> None:
    """Not "nothing is running": a path that is not there stops every call that needs hosts, before
    any playbook runs and before the history records anything."""
    runner_dir = clean_env / "runner"
    missing = clean_env / "invnetory.yml"
    forja = Forja(inventory=missing, private_data_dir=runner_dir, history=History(clean_env / "h.sqlite"))
    for name, call in verbs_needing_hosts(forja, clean_env).items():
        with pytest.raises(errors.ConfigError) as caught:
            call()
        assert caught.value.field == "inventory", name
        assert f"{missing} does not exist; check -i or FORJA_INVENTORY" in caught.value.message, name
        assert caught.value.exit_code == 2
    assert not runner_dir.exists(), "no playbook was started"
    assert forja.history.list() == [], "no run was recorded"


def test_an_inventory_ansible_cannot_parse_is_an_error_naming_it_for_every_verb(clean_env: Path) -> None:
    """A file that exists but is no inventory (a YAML typo) is not "nothing is running" either: every
    call that needs hosts stops with exit 2, the path and Ansible's own reason, and records nothing.
    The plays' verbs learn it from the play Ansible stopped; the readers' from ansible-inventory."""
    broken = clean_env / "inventory.yml"
    broken.write_text("all:\n  hosts:\n    gpu-a: [\n")
    forja = Forja(inventory=broken, private_data_dir=clean_env / "runner",
                  history=History(clean_env / "h.sqlite"))
    limited = Forja(inventory=broken, limit="gpu-a", private_data_dir=clean_env / "runner",
                    history=forja.history)
    calls = {**verbs_needing_hosts(forja, clean_env),
             "train --limit": lambda: limited.train(DIGITS, project=clean_env, name="digits")}
    for name, call in calls.items():
        with pytest.raises(errors.ConfigError) as caught:
            call()
        said = caught.value.message
        assert caught.value.field == "inventory" and caught.value.exit_code == 2, f"{name}: {said}"
        expected = f"inventory {broken}: YAML parsing failed"  # the file, then the cause in Ansible's words
        assert said.startswith(expected), f"{name}: {said}"
        assert "Incorrect plugin name" not in said and "ansible_collections" not in said, f"{name}: {said}"
    assert forja.history.list() == [], "no run was recorded"


def test_one_unparsable_source_of_several_is_an_error_too(clean_env: Path) -> None:
    """Ansible's default only warns and goes on with the sources that parsed: the hosts of the
    broken one would silently be missing."""
    good = gpu_inventory(clean_env / "good.yml", "gpu-a")
    broken = clean_env / "broken.ini"
    broken.write_text("[forja_gpu]\ngpu-b ansible_host\n")
    forja = Forja(inventory=[good, broken], private_data_dir=clean_env / "runner",
                  history=History(clean_env / "h.sqlite"))
    for call in (forja.hosts, forja.status):
        with pytest.raises(errors.ConfigError) as caught:
            call()
        said = caught.value.message
        assert said.startswith(f"inventory {broken}: Failed to parse inventory: Expected key=value"), said


def test_what_needs_no_hosts_works_with_no_inventory_named(clean_env: Path) -> None:
    forja = Forja(history=History(clean_env / "h.sqlite"))
    assert forja.runs() == []
    assert forja.rate("g2-standard-8", "us-east1-d").usd_per_hour > 0


def test_ansible_s_own_inventory_variable_still_names_one(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANSIBLE_INVENTORY", str(gpu_inventory(clean_env / "inventory.yml", "gpu-a")))
    forja = Forja(history=History(clean_env / "h.sqlite"))
    assert forja.inventory is None
    assert [h.name for h in forja.hosts()] == ["gpu-a"]


def test_starting_a_stopped_vm_is_announced_to_the_call_s_listeners_before_its_play(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, log = stopped_vm_inventory(clean_env, monkeypatch)
    seen: list[ev.Event] = []
    forja = Forja(
        inventory=script,
        private_data_dir=clean_env / "runner",
        on_event=seen.append,
        history=History(clean_env / "h.sqlite"),
    )
    with pytest.raises(errors.PlaybookFailed, match="FORJA_GCP_PROJECT"):
        forja.tunnel(start=True)
    starting = [e for e in seen if isinstance(e, ev.HostStarting)]
    assert starting == [ev.HostStarting(0, host="gpu-1", status="TERMINATED", playbook="provision.yml")]
    played = [e for e in seen if isinstance(e, ev.PlaybookStarted)]
    assert played and seen.index(starting[0]) < seen.index(played[0])
    readers = log.read_text().splitlines()
    assert sum("ansible-inventory" in r for r in readers) == 1, readers


def test_a_streamed_tunnel_start_yields_the_announcement_too(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, _ = stopped_vm_inventory(clean_env, monkeypatch)
    forja = Forja(
        inventory=script, private_data_dir=clean_env / "runner", history=History(clean_env / "h.sqlite")
    )
    seen: list[object] = []
    with pytest.raises(errors.PlaybookFailed):
        for item in forja.iter_events("tunnel", start=True):
            seen.append(item)
    assert isinstance(seen[0], ev.HostStarting) and seen[0].host == "gpu-1"


def test_the_command_announces_the_start_after_reading_the_inventory_once(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, log = stopped_vm_inventory(clean_env, monkeypatch)
    forja_bin = Path(sys.executable).parent / "forja"
    proc = subprocess.run(
        [str(forja_bin), "-i", str(script), "tunnel", "--start"],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, said
    assert "gpu-1 is TERMINATED: starting it (playbooks/provision.yml)" in said
    readers = log.read_text().splitlines()
    assert sum("ansible-inventory" in r for r in readers) == 1, readers
