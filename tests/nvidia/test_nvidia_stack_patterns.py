"""The package patterns the nvidia_stack role derives from its branch and CUDA version.

They decide what apt may install, so they are checked against real package names from
NVIDIA's repository and Ubuntu's archive (jammy).
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import jinja2
import pytest
import yaml

ROLE = Path(__file__).resolve().parents[2] / "roles" / "nvidia_stack"
VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())


def render(name: str, **context: str) -> str:
    return jinja2.Environment().from_string(VARS[name]).render(**context).strip()


def other_branch(branch: str) -> re.Pattern[str]:
    return re.compile(render("nvidia_stack_other_branch_regex", nvidia_stack_driver_branch=branch))


@pytest.mark.parametrize(("name", "other"), [
    ("nvidia-driver-580", True),
    ("libnvidia-cfg1-580", True),
    ("nvidia-firmware-580-580.178.04", True),
    ("nvidia-driver-580-open", True),
    ("cuda-drivers-575", True),
    ("nvidia-driver-pinning-580", True),
    ("nvidia-driver-570", False),
    ("libnvidia-compute-570", False),
    ("nvidia-firmware-570-570.172.08", False),
    ("nvidia-headless-570-server", False),
    ("cuda-drivers-570", False),
    ("cuda-drivers", False),
    ("nvidia-driver-pinning-570", False),
    ("libnvidia-egl-wayland1", False),
    ("nvidia-container-toolkit", False),
])
def test_packages_of_another_branch_are_recognised_by_name(name, other):
    assert bool(other_branch("570").match(name)) is other


def test_the_other_branch_pattern_follows_the_branch_variable():
    assert other_branch("580").match("nvidia-driver-570")
    assert not other_branch("580").match("nvidia-driver-580")


@pytest.mark.parametrize(("name", "numbered"), [
    ("nvidia-driver-570", True),
    ("libnvidia-compute-580", True),
    ("nvidia-firmware-580-580.178.04", True),
    ("nvidia-headless-570-server", True),
    ("libnvidia-egl-wayland1", False),
    ("nvidia-settings", False),
    ("nvidia-prime", False),
])
def test_foreign_origins_lose_only_branch_numbered_driver_packages(name, numbered):
    globs = VARS["nvidia_stack_numbered_driver_globs"].split()
    assert any(fnmatch.fnmatchcase(name, g) for g in globs) is numbered


def test_the_cuda_metas_are_exact_names_for_the_major_release():
    metas = render("nvidia_stack_cuda_metas", nvidia_stack_cuda_version="12.8").split()
    assert {"cuda", "cuda-12", "cuda-toolkit", "cuda-toolkit-12", "cuda-runtime-12"} <= set(metas)
    assert not any(ch in meta for meta in metas for ch in "*?[/")
    assert "cuda-toolkit-12-8" not in metas  # versioned by name already
