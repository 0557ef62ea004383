"""The environment layers' keys (forja_sandbox/hostlayers.py): what decides whether a cached layer is
booted or built again. Building and booting layers is tests/foundation/test_testhosts.py's."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from forja_sandbox import hostlayers

ROOT = Path(__file__).resolve().parents[2]


def _checkout(folder: Path, layer: hostlayers.EnvLayer) -> Path:
    """The layer's inputs copied as they lie in the repository."""
    for item in (f"forja_sandbox/layers/{layer.playbook}", *layer.inputs):
        source, target = ROOT / item, folder / item
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
    return folder


@pytest.mark.parametrize("layer", [hostlayers.TRAINER_ENV, hostlayers.SITE_ENV], ids=lambda layer: layer.name)
def test_two_checkouts_share_a_layer_and_a_changed_input_or_image_names_a_new_one(
    tmp_path: Path, layer: hostlayers.EnvLayer
) -> None:
    dlvm = tmp_path / "dlvm"
    dlvm.mkdir()
    here, there = _checkout(tmp_path / "a", layer), _checkout(tmp_path / "b", layer)
    key = layer.key(here, dlvm)
    assert layer.key(there, dlvm) == key  # CI's clean clone finds the dev's layer

    tasks = there / "roles" / "trainer_run" / "tasks" / "python.yml"
    tasks.write_text(tasks.read_text() + "\n# a changed task\n")
    assert layer.key(there, dlvm) != key
    pins = here / "trainer" / "requirements.txt"
    pins.write_text(pins.read_text() + "tqdm>=4\n")
    assert layer.key(here, dlvm) != key

    fresh = _checkout(tmp_path / "c", layer)
    stat = dlvm.stat()
    os.utime(dlvm, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # the image layer rebuilt
    assert layer.key(fresh, dlvm) != key


def test_the_site_layer_follows_the_notebook_servers_role_and_the_pip_arguments(tmp_path: Path) -> None:
    dlvm = tmp_path / "dlvm"
    dlvm.mkdir()
    checkout = _checkout(_checkout(tmp_path / "a", hostlayers.TRAINER_ENV), hostlayers.SITE_ENV)
    key = hostlayers.SITE_ENV.key(checkout, dlvm)
    assert hostlayers.TRAINER_ENV.key(checkout, dlvm) != key
    assert dataclasses.replace(hostlayers.SITE_ENV, pip_args=hostlayers.PIP_ARGS).key(checkout, dlvm) != key
    venv = checkout / "roles" / "jupyter_colab" / "tasks" / "venv.yml"
    venv.write_text(venv.read_text() + "\n# a changed task\n")
    assert hostlayers.SITE_ENV.key(checkout, dlvm) != key


def test_each_layer_has_a_builder_of_its_own_that_no_test_boots() -> None:
    builders = [layer.builder for layer in (hostlayers.TRAINER_ENV, hostlayers.SITE_ENV)]
    assert len(set(builders)) == len(builders)
    booted = " ".join(path.read_text() for path in (ROOT / "tests").rglob("*.py"))
    booted += " ".join(path.read_text() for path in (ROOT / "molecule").rglob("molecule.yml"))
    for builder in builders:
        ways = (f"up({builder}", f"index: {builder}\n", f"INDEX = {builder}")
        found = [way for way in ways if way in booted]
        assert not found, f"a test boots th{builder}, the builder of a layer"


def test_the_wheelhouse_holds_what_the_role_installs() -> None:
    """The list is read from the role's defaults and the trainer's pins, not copied."""
    wanted = hostlayers.trainer_requirements()
    assert wanted[0].startswith("torch==") and wanted[1].startswith("pip==")
    pins = [line.strip() for line in (ROOT / "trainer/requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert wanted[2:] == pins
