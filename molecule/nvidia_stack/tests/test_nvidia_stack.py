"""What nvidia_stack leaves on a GPU-less test host, checked against real apt and dpkg.

The stand-in repository (standin_repo.py) offers driver 570.133.20 and 570.172.08, "570"
packages at a 580 version, drivers 575 and 580, CUDA 12.8.1 and 12.9.1, and Ubuntu's archive
offers the 580-server branch with the "570" stubs at a 570 version that depend on it (dstack PR
#3967's nvidia-driver-570-server-open), plus newer GCP kernel metas. Each test names the drift it
rules out; side_effect.yml forces 580 in past the pins and checks the role refuses it.
The tests at the end run real upgrades, so they come last in this file.
"""

from __future__ import annotations

import re

import pytest

NO_PREFS = "-o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/nonexistent"
# Only the stand-in repositories (sources.list.d), not Ubuntu's real archive: 0.1 s per simulation, not 1.6 s.
STANDIN_ONLY = "-o Dir::Etc::SourceList=/dev/null"
KERNEL = "5.15.0-9080-gcp"
KERNEL_HOLDS = {
    f"linux-image-{KERNEL}", f"linux-modules-{KERNEL}", f"linux-headers-{KERNEL}",
    "linux-gcp", "linux-image-gcp", "linux-headers-gcp",
}


def installed(host, name: str) -> str | None:
    out = host.run(f"dpkg-query -W -f='${{db:Status-Abbrev}} ${{Version}}' {name}")
    if out.rc != 0 or not out.stdout.startswith(("ii", "hi")):
        return None
    return out.stdout.split()[-1]


def simulate(host, args: str) -> list[tuple[str, str]]:
    """(package, new version) for every `Inst` line of an apt-get simulation."""
    out = host.run(f"LC_ALL=C apt-get -s -o Debug::NoLocking=1 {args}")
    assert out.rc == 0, out.stderr
    return re.findall(r"^Inst (\S+) (?:\[\S+\] )?\((\S+)", out.stdout, re.M)


# Every package name of the branch the pin has to cover (the role README's pin table).
BRANCH_PARTS = ["nvidia-driver", "libnvidia-compute", "nvidia-utils", "nvidia-compute-utils", "nvidia-dkms",
                "xserver-xorg-video-nvidia", "nvidia-fabricmanager", "cuda-drivers"]


@pytest.mark.parametrize(("name", "version"), [
    ("nvidia-driver-570", "570.172.08-0ubuntu1"),
    ("libnvidia-compute-570", "570.172.08-0ubuntu1"),
    ("nvidia-utils-570", "570.172.08-0ubuntu1"),
    ("nvidia-compute-utils-570", "570.172.08-0ubuntu1"),
    ("nvidia-dkms-570", "570.172.08-0ubuntu1"),
    ("xserver-xorg-video-nvidia-570", "570.172.08-0ubuntu1"),
    ("cuda-drivers-570", "570.172.08-1"),
    ("nvidia-driver-pinning-570", "570.172.08-1"),
    ("cuda-toolkit-12-8", "12.8.1-1"),
    ("cuda-toolkit", "12.8.1-1"),
])
def test_the_pinned_stack_is_installed_from_nvidias_repository(host, name, version):
    assert installed(host, name) == version


def test_no_newer_branch_or_cuda_release_came_in(host):
    names = [f"{part}-{branch}" for part in BRANCH_PARTS for branch in (575, 580)] + [
        "nvidia-driver-580-server-open", "nvidia-dkms-580-server-open", "cuda-toolkit-12-9"]
    listing = host.run(f"dpkg-query -W -f='${{Package}} ${{db:Status-Abbrev}}\\n' {' '.join(names)}").stdout
    assert [line for line in listing.splitlines() if line.split()[1:2] in (["ii"], ["hi"])] == []


def test_no_installed_driver_package_carries_another_branchs_version(host):
    listing = host.check_output("dpkg-query -W -f='${Package} ${Version}\\n'")
    family = re.compile(r"^(nvidia-|libnvidia-|xserver-xorg-video-nvidia-|cuda-drivers)")
    off = [line for line in listing.splitlines()
           if family.match(line) and re.search(r" (\d+:)?(?!570\.)\d{3}\.", line)]
    assert off == []


def test_the_repository_is_signed_and_trusted_only_through_its_own_keyring(host):
    keyring = host.file("/etc/apt/keyrings/forja-nvidia-cuda.asc")
    assert keyring.user == "root" and keyring.mode == 0o644
    assert "BEGIN PGP PUBLIC KEY BLOCK" in keyring.content_string
    source = host.file("/etc/apt/sources.list.d/forja-nvidia-cuda.sources").content_string
    assert "Signed-By: /etc/apt/keyrings/forja-nvidia-cuda.asc" in source
    assert "trusted" not in source.lower()
    update = host.run("LC_ALL=C apt-get update")
    assert update.rc == 0
    assert "NO_PUBKEY" not in update.stderr and "not signed" not in update.stderr


def test_the_pins_are_by_version_and_apt_honours_them(host):
    prefs = host.file("/etc/apt/preferences.d/forja-nvidia-stack.pref").content_string
    assert "Pin: version 570.*" in prefs and "Pin: version 12.8.*" in prefs
    policy = host.check_output("LC_ALL=C apt-cache policy nvidia-driver-570 cuda-toolkit")
    candidates = re.findall(r"Candidate: (\S+)", policy)
    assert candidates == ["570.172.08-0ubuntu1", "12.8.1-1"]


def test_every_package_of_the_branch_has_its_570_candidate_and_none_of_580(host):
    names = [f"{part}-{branch}" for part in BRANCH_PARTS for branch in (570, 580)]
    policy = host.check_output(f"LC_ALL=C apt-cache policy {' '.join(names)}")
    per_name = dict(re.findall(r"^(\S+):\n(.*?)(?=^\S|\Z)", policy, re.M | re.S))
    for part in BRANCH_PARTS:
        revision = "1" if part in ("cuda-drivers", "nvidia-fabricmanager") else "0ubuntu1"
        assert f"Candidate: 570.172.08-{revision}" in per_name[f"{part}-570"], per_name[f"{part}-570"]
        assert "Candidate: (none)" in per_name[f"{part}-580"], per_name[f"{part}-580"]
        assert re.search(r"580\.95\.05-\S+ -1", per_name[f"{part}-580"]), per_name[f"{part}-580"]


def test_dstacks_570_server_open_would_install_580_without_the_pins(host):
    """Canonical's stub is a 570 *version*: a "570.*" pin alone prefers it, and it depends on 580."""
    moves = dict(simulate(host, f"{NO_PREFS} {STANDIN_ONLY} install nvidia-driver-570-server-open"))
    assert moves.get("nvidia-driver-570-server-open", "").startswith("570.211.01"), moves
    assert moves.get("nvidia-driver-580-server-open", "").startswith("580."), moves
    assert moves.get("nvidia-dkms-580-server-open", "").startswith("580."), moves


def test_dstacks_570_server_open_cannot_bring_580_with_the_pins(host):
    out = host.run("LC_ALL=C apt-get -s -o Debug::NoLocking=1 install nvidia-driver-570-server-open")
    assert out.rc != 0
    assert not re.search(r"^Inst \S*580", out.stdout, re.M), out.stdout


def test_even_a_570_name_asked_for_at_580_cannot_pull_580_in(host):
    """apt takes the asked version of nvidia-driver-570, but its 580 dependency stays at -1, whatever
    the origin (this one is NVIDIA's): the record that refuses other branches' numbered names."""
    ask = "install nvidia-driver-570=580.95.05-0ubuntu1"
    unpinned = dict(simulate(host, f"{NO_PREFS} {STANDIN_ONLY} {ask}"))
    assert unpinned.get("nvidia-driver-580", "").startswith("580."), unpinned
    out = host.run(f"LC_ALL=C apt-get -s -o Debug::NoLocking=1 {ask}")
    assert out.rc != 0
    assert "nvidia-driver-580" in out.stdout + out.stderr
    assert not re.search(r"^Inst \S*580", out.stdout, re.M), out.stdout


def test_ubuntus_570_that_pulls_580_is_never_a_candidate(host):
    policy = host.check_output("LC_ALL=C apt-cache policy nvidia-driver-570")
    assert re.search(r"570\.211\.01-0ubuntu1\.22\.04\.1 -1", policy), policy


def test_without_the_pins_apt_would_move_to_580_and_cuda_12_9(host):
    """The control experiment: the same host and repositories, preferences ignored."""
    moves = dict(simulate(host, f"{NO_PREFS} dist-upgrade"))
    assert moves.get("nvidia-driver-580", "").startswith("580."), moves
    assert moves.get("cuda-toolkit", "").startswith("12.9."), moves
    assert "cuda-toolkit-12-9" in moves


def test_with_the_pins_dist_upgrade_moves_nothing_of_the_stack(host):
    moves = dict(simulate(host, "dist-upgrade"))
    stack_names = re.compile(r"(nvidia|libnvidia|cuda|linux-(image|modules|headers|gcp))")
    stack = {n: v for n, v in moves.items() if stack_names.match(n)}
    assert stack == {}


def test_the_kernel_is_held(host):
    held = set(host.check_output("apt-mark showhold").split())
    assert held >= KERNEL_HOLDS


def test_without_the_holds_apt_would_install_a_newer_kernel(host):
    """Either the stand-in 9090 or, from Ubuntu's own archive, a real newer linux-gcp (6.8 HWE)."""
    moves = dict(simulate(host, "--ignore-hold dist-upgrade"))
    assert moves.get("linux-gcp") not in (None, "5.15.0.9080.1"), moves
    assert any(name.startswith("linux-image-") and KERNEL not in name for name in moves), moves


def test_unattended_upgrades_blacklists_the_stack_and_the_kernel(host):
    conf = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    for pattern in ("nvidia-", "libnvidia-", "cuda-", "linux-image-", "linux-gcp"):
        assert f'"{pattern}"' in conf


def test_the_reboot_was_skipped_in_the_container_and_says_why(host):
    marker = host.file("/run/forja/nvidia-stack-reboot-required")
    assert marker.exists
    assert "container" in marker.content_string
    assert "no kernel of its own" in marker.content_string


def test_the_stand_in_nvidia_smi_fails_like_the_real_one_without_a_driver(host):
    smi = host.run("nvidia-smi --query-gpu=name --format=csv,noheader,nounits")
    assert smi.rc == 9
    assert "couldn't communicate with the NVIDIA driver" in smi.stderr


def test_real_upgrade_and_dist_upgrade_leave_570_128_and_the_kernel_in_place(host):
    env = "DEBIAN_FRONTEND=noninteractive LC_ALL=C"
    for command in ("upgrade", "dist-upgrade"):
        out = host.run(f"{env} apt-get -y -o Dpkg::Options::=--force-confold {command}")
        assert out.rc == 0, out.stderr
    assert installed(host, "nvidia-driver-570") == "570.172.08-0ubuntu1"
    assert installed(host, "nvidia-driver-580") is None
    assert installed(host, "cuda-toolkit") == "12.8.1-1"
    assert installed(host, "cuda-toolkit-12-9") is None
    assert installed(host, "linux-gcp") == "5.15.0.9080.1"
    assert installed(host, "linux-image-5.15.0-9090-gcp") is None
