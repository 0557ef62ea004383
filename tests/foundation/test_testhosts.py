"""The test-host fixture boots real systemd hosts and leaves nothing behind when removed."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from forja_sandbox import testhosts

INDEX = 8  # reserved for the fixture's own tests


def _ssh(host: testhosts.Host, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(host.ssh_argv(command, options=("-o", "ConnectTimeout=10")),
                          capture_output=True, text=True, timeout=120, check=False)


def _ended(pid: int, within_s: float = 5.0) -> bool:
    """The process is gone, or dead and only waiting to be reaped by this machine's PID 1."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def _leftovers(index: int) -> list[str]:
    """Everything a host could leave on this machine: namespace, mount, process, bridge, nft table."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    if any(line.split()[0] == f"th{index}" for line in netns.splitlines() if line.strip()):
        found.append("netns")
    host_dir = testhosts.base_dir() / "hosts" / f"th{index}"
    if str(host_dir) in Path("/proc/mounts").read_text():
        found.append("mount")
    if host_dir.exists():
        found.append("folder")
    ps = subprocess.run(["pgrep", "-f", f"systemd-nspawn .*-M th{index} "], capture_output=True, text=True)
    if ps.stdout.strip():
        found.append("process")
    if not testhosts.running():
        if subprocess.run(["ip", "link", "show", "thbr0"], capture_output=True).returncode == 0:
            found.append("bridge")
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        if "testhosts" in tables:
            found.append("nft table")
    return found


def test_addresses_follow_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TH_NET", raising=False)
    assert testhosts.address(1) == "10.213.0.11"
    monkeypatch.setenv("TH_NET", "10.99.1")
    assert testhosts.address(3) == "10.99.1.13"


def test_unknown_release_is_refused_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(testhosts.TestHostError, match="jammy, bookworm"):
        testhosts.ensure_golden("xenial")


@pytest.mark.hosts
def test_a_host_boots_with_systemd_sshd_sudo_and_python() -> None:
    host = testhosts.up(INDEX)
    try:
        out = _ssh(host, "systemctl is-system-running; sudo -n id -u; python3 -V; cat /etc/os-release")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] in {"running", "degraded"}
        assert lines[1] == "0"
        assert lines[2].startswith("Python 3.")
        assert "jammy" in out.stdout or "bookworm" in out.stdout
        # a second `up` of a running host changes nothing
        assert testhosts.up(INDEX).address == host.address
        assert testhosts.is_up(INDEX)
    finally:
        testhosts.down(INDEX)
    assert _leftovers(INDEX) == []


@pytest.mark.hosts
def test_a_stopped_host_keeps_its_disk_like_a_stopped_vm() -> None:
    host = testhosts.up(INDEX)
    try:
        assert _ssh(host, "echo kept > ~/marker").returncode == 0
        testhosts.stop(INDEX)
        assert not testhosts.is_up(INDEX)
        host = testhosts.up(INDEX)
        assert _ssh(host, "cat ~/marker").stdout.strip() == "kept"
    finally:
        testhosts.down(INDEX)
    assert _leftovers(INDEX) == []


@pytest.mark.hosts
def test_down_all_cleans_up_after_a_killed_run() -> None:
    """A run killed mid-way leaves a host half-alive; removal (what CI's trap calls) cleans it all.

    The trap calls `down-all`, which is `down` for every index found; the test uses `down` on its
    own index so that hosts of other runs on this machine are left alone.
    """
    testhosts.up(INDEX)
    try:
        # simulate the kill: the nspawn process dies without an orderly teardown
        host_dir = testhosts.base_dir() / "hosts" / f"th{INDEX}"
        pid = int((host_dir / "pid").read_text())
        leader = int((host_dir / "leader").read_text())  # the container's systemd, which outlives nspawn
        subprocess.run(["kill", "-KILL", str(pid)], check=True)
        assert INDEX in testhosts.running()
    finally:
        testhosts.down(INDEX)  # also what a failed assertion above leaves for the next test
    assert _leftovers(INDEX) == []
    assert _ended(leader), "the container's init survived its host's removal"
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert f"th{INDEX}-h" not in links, "the host's veth survived (its namespace is still held)"
    testhosts.down(INDEX)  # idempotent: a second removal is a no-op
    assert _leftovers(INDEX) == []


@pytest.mark.hosts
def test_a_cached_layer_is_built_once_and_rebuilt_when_what_it_is_built_from_changes(tmp_path: Path) -> None:
    """`ensure_layer`: a converge kept as a layer, booted by other hosts as their own start; a changed
    input names a new layer (the stale one is never booted again, and is removed)."""
    recipe = tmp_path / "recipe"
    recipe.write_text("one")
    builds: list[str] = []

    def build(host: testhosts.Host) -> None:
        builds.append(host.name)
        # a file written, one of the image's removed (a whiteout in the layer), the builder's name
        host.run_as_root(f"echo {recipe.read_text()} > /etc/forja-layer; rm /etc/issue; "
                         "hostname > /root/built-on")

    images = testhosts.base_dir() / "images"
    key = testhosts.layer_key([recipe], "golden")
    try:
        layer = testhosts.ensure_layer("layer-test", key, build, builder=9, image="golden")
        assert testhosts.ensure_layer("layer-test", key, build, builder=9, image="golden") == layer
        assert builds == ["th9"] and not testhosts.is_up(9)  # built once; the builder is gone
        host = testhosts.up(INDEX, over=layer)
        out = _ssh(host, "sudo cat /etc/forja-layer /root/built-on; hostname; "
                         "test -e /etc/issue || echo no-issue")
        assert out.stdout.split() == ["one", "th9", "th8", "no-issue"], out.stdout + out.stderr
        testhosts.down(INDEX)

        recipe.write_text("two")
        new_key = testhosts.layer_key([recipe], "golden")
        assert new_key != key
        new_layer = testhosts.ensure_layer("layer-test", new_key, build, builder=9, image="golden")
        assert builds == ["th9", "th9"] and new_layer != layer and not layer.exists()
        host = testhosts.up(INDEX, over=new_layer)
        assert _ssh(host, "cat /etc/forja-layer").stdout.strip() == "two"
    finally:
        testhosts.down(INDEX)
        testhosts.down(9)
        for old in images.glob("layer-test-*"):
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()
    assert _leftovers(INDEX) == [] and _leftovers(9) == []


@pytest.mark.hosts
def test_an_open_connection_outlives_a_host_joining_and_leaving_the_bridge() -> None:
    """The bridge's MAC is its own: a bridge otherwise takes its ports' lowest MAC, so a host joining
    or leaving changed it under the others, and their open ssh connections (Ansible's ControlPersist,
    the IAP stand-in's) hung until their ARP entries expired: a VM created or deleted in the sandbox
    made the next task on another VM fail with "Timeout waiting for privilege escalation prompt"."""
    host = testhosts.up(INDEX)
    control = testhosts.base_dir() / "hosts" / f"th{INDEX}" / "tmp" / "cm"  # a path on this machine
    master = ("-o", "ControlMaster=auto", "-o", f"ControlPath={control}", "-o", "ControlPersist=60s",
              "-o", "ConnectTimeout=10")  # fmt: skip

    def over_the_open_connection() -> str:
        done = subprocess.run(host.ssh_argv("echo up", options=master), capture_output=True, text=True,
                              timeout=15, check=False)  # fmt: skip
        return done.stdout.strip()

    bridge = Path("/sys/class/net/thbr0/address")
    try:
        assert over_the_open_connection() == "up"
        address = bridge.read_text()
        testhosts.up(9)
        # the lowest MAC a port can have: a bridge that inherits its ports' would take it now
        subprocess.run(["ip", "link", "set", "th9-h", "address", "02:00:00:00:00:01"], check=True)
        assert bridge.read_text() == address
        testhosts.down(9)
        assert bridge.read_text() == address
        assert over_the_open_connection() == "up"
    finally:
        subprocess.run(["ssh", "-o", f"ControlPath={control}", "-O", "exit", "th"], capture_output=True,
                       check=False)  # fmt: skip
        testhosts.down(9)
        testhosts.down(INDEX)
    assert _leftovers(INDEX) == [] and _leftovers(9) == []
