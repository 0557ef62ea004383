"""The product's wheel, built once per test session, and that wheel installed as a user installs it.

Shared by the files that test the product beside the sandbox (test_beside_the_product.py), the
installed copy from any folder (test_installed_copy.py) and the installed copy driving the test
sandbox (test_installed_walk.py): one wheel build for all of them. Their helpers are in
installed_wheel.py.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest
from installed_wheel import BIN, BUILD_FILES, PYTHON_SOURCES, REPO, Installed, run, shipped_content


@pytest.fixture(scope="session")
def product_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built from a copy of its sources (the checkout stays clean)."""
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in dict.fromkeys((*PYTHON_SOURCES, *shipped_content(), *BUILD_FILES)):  # trainer is both
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=ignore)  # links followed, as the build does
        else:
            shutil.copy2(REPO / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORJA_", "ANSIBLE_"))}
    proc = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                 "-w", str(dist), str(src)], REPO, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = dist.glob("forja-*.whl")
    return wheel


@pytest.fixture(scope="session")
def installed_forja(product_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """`pip install` of the wheel into a fresh venv in a temporary folder outside the clone, offline:
    the venv's dependencies are the test venv's (a .pth file names its site-packages, after the new
    venv's own, so the wheel's forja is the one imported), and the wheel goes in with --no-deps.
    Ansible's commands are given the venv's own Python, as pip's console scripts would be."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    assert not venv.is_relative_to(REPO)
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], venv.parent)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     venv.parent).stdout.strip())
    (site / "zz_forja_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                "--no-index", str(product_wheel)], venv.parent)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    for script in BIN.glob("ansible*"):  # ansible-playbook, ansible-inventory, ...: their entry points
        text = script.read_text().split("\n", 1)[1]
        (venv / "bin" / script.name).write_text(f"#!{python}\n{text}")
        (venv / "bin" / script.name).chmod(0o755)
    return Installed(venv, site)
