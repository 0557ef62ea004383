"""What nvidia_stack leaves on a GPU-less test host, checked against real apt and dpkg.

The stand-in repository (standin_repo.py) offers driver 570.133.20 and 570.172.08, a "570"
package at a 580 version, drivers 575 and 580, CUDA 12.8.1 and 12.9.1, and Ubuntu's archive
offers a "570" that pulls 580 plus newer GCP kernel metas. Each test names the drift it rules out.
The tests at the end run real upgrades, so they come last in this file.
"""

from __future__ import annotations

import re

import pytest

NO_PREFS = "-o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/nonexistent"
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


@pytest.mark.parametrize(("name", "version"), [
    ("nvidia-driver-570", "570.172.08-0ubuntu1"),
    ("libnvidia-compute-570", "570.172.08-0ubuntu1"),
    ("cuda-drivers-570", "570.172.08-1"),
    ("nvidia-driver-pinning-570", "570.172.08-1"),
    ("cuda-toolkit-12-8", "12.8.1-1"),
    ("cuda-toolkit", "12.8.1-1"),
])
def test_the_pinned_stack_is_installed_from_nvidias_repository(host, name, version):
    assert installed(host, name) == version


@pytest.mark.parametrize("name", ["nvidia-driver-580", "libnvidia-compute-580", "nvidia-driver-575",
                                  "cuda-drivers-580", "cuda-toolkit-12-9"])
def test_no_newer_branch_or_cuda_release_came_in(host, name):
    assert installed(host, name) is None


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
