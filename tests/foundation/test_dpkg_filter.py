"""forja_dpkg_query and forja_dpkg_installed, as a play loads them, against this machine's dpkg."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from ansible.plugins.loader import filter_loader

pytestmark = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs a Debian system's dpkg")


def _filter(name: str):  # type: ignore[no-untyped-def]
    """The filter as a play finds it: by its FQCN in the forja.gpu collection."""
    plugin = filter_loader.get(f"forja.gpu.{name}")
    assert plugin is not None, f"ansible does not find forja.gpu.{name}"
    return plugin.j2_function


def test_the_query_names_the_installed_packages_and_not_the_unknown_one() -> None:
    argv = _filter("forja_dpkg_query")(["dpkg", "forja-no-such-package", "bash"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1 and "forja-no-such-package" in proc.stderr
    # dpkg-query lists by package name, not in the order asked
    assert _filter("forja_dpkg_installed")(proc.stdout.splitlines()) == ["bash", "dpkg"]


def test_a_held_package_counts_as_installed_and_a_removed_one_does_not() -> None:
    lines = ["hi  linux-image-6.8.0-1015-gcp", "rc  python3-venv", "un  util-linux", "iiR nvidia-driver-570",
             "ii  python3-packaging"]
    assert _filter("forja_dpkg_installed")(lines) == [
        "linux-image-6.8.0-1015-gcp", "nvidia-driver-570", "python3-packaging"]
