"""`forja sweep` on the command line: a sweep's first word is its config, and what cannot run is refused
before any study exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from forja.cli import app
from forja.sweep import SweepSpec

ROOT = Path(__file__).resolve().parents[2]


def test_more_trials_at_once_than_gpus_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[forja_gpu]\nforja-l4 ansible_connection=local machine_type=g2-standard-8\n")
    result = CliRunner().invoke(app, [
        "-i", str(inventory), "sweep", str(ROOT / "trainer/configs/digits.yaml"),
        "--space", str(ROOT / "examples/sweep/space.yaml"), "--trials", "4", "--parallel", "2",
        "--name", "too-wide"])
    assert result.exit_code == 2, result.output
    assert "--parallel: 2 trials at once" in result.output and "1 GPU" in result.output
    assert "--parallel 1" in result.output
    assert not SweepSpec.folder_of("too-wide").exists()


@pytest.mark.parametrize(("more", "words"), [
    (["--local", "--fallback-zone", "us-east1-b"], "--fallback-zone: --local trials run on this machine"),
    (["--local", "--max-recoveries", "0"], "--max-recoveries: 0 allows no recovery; use 1 or more"),
])
def test_spot_options_that_cannot_hold_are_refused_before_anything_is_made(
    tmp_path: Path, more: list[str], words: str
) -> None:
    result = CliRunner().invoke(app, [
        "sweep", str(ROOT / "trainer/configs/digits.yaml"),
        "--space", str(ROOT / "examples/sweep/space.yaml"), "--trials", "2", "--name", "spot-refused", *more],
        env={"COLUMNS": "240"})
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())
    assert not SweepSpec.folder_of("spot-refused").exists()
