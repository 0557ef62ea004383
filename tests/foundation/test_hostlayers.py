"""The trainer-env layer's key (forja_sandbox/hostlayers.py): what decides whether a cached layer is
booted or built again. Building and booting layers is tests/foundation/test_testhosts.py's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from forja_sandbox import hostlayers

ROOT = Path(__file__).resolve().parents[2]


def _checkout(folder: Path) -> Path:
    """The layer's inputs copied as they lie in the repository."""
    for item in hostlayers.TRAINER_ENV_INPUTS:
        source, target = ROOT / item, folder / item
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return folder


def test_two_checkouts_share_a_layer_and_a_changed_input_or_image_names_a_new_one(tmp_path: Path) -> None:
    dlvm = tmp_path / "dlvm"
    dlvm.mkdir()
    here, there = _checkout(tmp_path / "a"), _checkout(tmp_path / "b")
    key = hostlayers.trainer_env_key(here, dlvm)
    assert hostlayers.trainer_env_key(there, dlvm) == key  # CI's clean clone finds the dev's layer

    tasks = there / "roles" / "trainer_run" / "tasks" / "python.yml"
    tasks.write_text(tasks.read_text() + "\n# a changed task\n")
    assert hostlayers.trainer_env_key(there, dlvm) != key
    pins = here / "trainer" / "requirements.txt"
    pins.write_text(pins.read_text() + "tqdm>=4\n")
    assert hostlayers.trainer_env_key(here, dlvm) != key

    fresh = _checkout(tmp_path / "c")
    stat = dlvm.stat()
    os.utime(dlvm, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # the image layer rebuilt
    assert hostlayers.trainer_env_key(fresh, dlvm) != key


def test_the_wheelhouse_holds_what_the_role_installs() -> None:
    """The list is read from the role's defaults and the trainer's pins, not copied."""
    wanted = hostlayers.trainer_requirements()
    assert wanted[0].startswith("torch==") and wanted[1].startswith("pip==")
    pins = [line.strip() for line in (ROOT / "trainer/requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert wanted[2:] == pins
