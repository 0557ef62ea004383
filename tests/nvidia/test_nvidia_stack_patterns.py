"""The package patterns the nvidia_stack role derives from its branch and CUDA version.

They decide what apt may install, so they are checked against real package names from
NVIDIA's repository and Ubuntu's archive (jammy).
"""

from __future__ import annotations

import ast
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


def readme_pin_examples() -> list[str]:
    """The example names of the role README's "names the pin covers" table."""
    readme = (ROLE / "README.md").read_text()
    table = readme[readme.index("| names | examples |"):].split("\n\n", 1)[0]
    rows = [line.split("|")[2] for line in table.splitlines()[2:]]
    return [name for row in rows for name in re.findall(r"`([a-z0-9.+-]+)`", row)]


def numbered_globs() -> list[str]:
    return VARS["nvidia_stack_numbered_driver_globs"].split()


def test_the_readme_lists_the_names_the_brief_asked_for():
    names = readme_pin_examples()
    for prefix in ("nvidia-driver-", "libnvidia-", "nvidia-dkms-", "nvidia-utils-", "nvidia-compute-utils-",
                   "xserver-xorg-video-nvidia-", "cuda-drivers-", "nvidia-fabricmanager-"):
        assert any(name.startswith(prefix) for name in names), prefix


def test_every_name_the_readme_lists_is_held_on_the_branch_by_the_version_pin():
    globs = VARS["nvidia_stack_driver_globs"].split()
    for name in readme_pin_examples():
        assert any(fnmatch.fnmatchcase(name, g) for g in globs), name


def test_every_numbered_name_the_readme_lists_has_its_other_branches_refused():
    """Record 4 of the pin file (-1 for any version left) must catch the 580 twin of each name."""
    for name in readme_pin_examples():
        if re.search(r"-570(-|$)", name):
            twin = name.replace("-570", "-580")
            assert any(fnmatch.fnmatchcase(twin, g) for g in numbered_globs()), twin


@pytest.mark.parametrize("name", [
    "nvidia-container-toolkit", "libnvidia-container1", "libnvidia-container-tools",
    "nvidia-settings", "nvidia-modprobe", "nvidia-persistenced", "cuda-drivers"])
def test_unnumbered_packages_are_never_refused_outright(name):
    assert not any(fnmatch.fnmatchcase(name, g) for g in numbered_globs())


def off_branch(packages: dict[str, str], branch: str = "570") -> dict[str, str]:
    """vars/main.yml's nvidia_stack_off_branch, rendered with Ansible's own filters."""
    from ansible.plugins.filter.core import FilterModule
    from ansible.plugins.test.core import TestModule

    env = jinja2.Environment()
    env.filters.update(FilterModule().filters())
    env.tests.update(TestModule().tests())
    context = {"nvidia_stack_driver_branch": branch, "nvidia_stack_off_branch_input": packages}
    for name in ("nvidia_stack_other_branch_regex", "nvidia_stack_other_version_regex"):
        context[name] = env.from_string(VARS[name]).render(**context)
    return ast.literal_eval(env.from_string(VARS["nvidia_stack_off_branch"]).render(**context).strip())


def test_packages_off_the_branch_are_found_by_name_and_by_version():
    found = off_branch({
        "nvidia-driver-570": "580.95.05-0ubuntu1",       # a 570 name at a 580 version
        "nvidia-driver-580": "580.95.05-0ubuntu1",       # a 580 name
        "xserver-xorg-video-nvidia-580": "580.95.05-0ubuntu1",
        "libnvidia-compute-570": "570.172.08-0ubuntu1",
        "nvidia-driver-570-server-open": "570.211.01-0ubuntu1.22.04.1",  # Canonical's stub: 570 itself
        "cuda-drivers": "1:580.95.05-1",                 # an epoch does not hide the branch
        "nvidia-driver-pinning-570": "570.172.08-1",
        "nvidia-container-toolkit": "1.17.8-1",
        "cuda-toolkit-12-8": "12.8.1-1",
        "linux-image-5.15.0-9080-gcp": "5.15.0-9080.1",
    })
    assert found == {
        "nvidia-driver-570": "580.95.05-0ubuntu1",
        "nvidia-driver-580": "580.95.05-0ubuntu1",
        "xserver-xorg-video-nvidia-580": "580.95.05-0ubuntu1",
        "cuda-drivers": "1:580.95.05-1",
    }
