"""Errors a restart cannot fix end with their own exit code, which the unit does not restart."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest
import yaml
from state_reader import state_reader
from trainer_helpers import REPO, tiny_digits

from trainer import exit_codes, run_folder, runlib
from trainer.checkpoint import CheckpointManager
from trainer.cli import main
from trainer.folder_lock import folder_lock
from trainer.metrics import read_jsonl

ROLE = REPO / "roles" / "trainer_run"


def run_cli(tmp_path: Path, raw: dict, *extra: str) -> int:
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(raw))
    return main(["train", "--config", str(path), *extra])


def test_the_unit_never_restarts_the_codes_that_cannot_be_fixed_by_a_restart() -> None:
    template = jinja2.Template((ROLE / "templates" / "forja-train@.service.j2").read_text())
    unit = template.render(ansible_managed="managed", trainer_run_user="forja-train")
    line = re.search(r"^RestartPreventExitStatus=(.*)$", unit, re.MULTILINE)
    assert line is not None
    assert sorted(int(code) for code in line.group(1).split()) == sorted(exit_codes.NO_RESTART)
    assert (
        exit_codes.FAILED not in exit_codes.NO_RESTART and exit_codes.PREEMPTED not in exit_codes.NO_RESTART
    )


def test_the_roles_exit_hints_cover_every_code_but_success_and_crash() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "wait.yml").read_text())
    hints = next(
        t["vars"]["trainer_run_exit_hints"] for t in tasks if "trainer_run_exit_hints" in t.get("vars", {})
    )
    assert set(hints) == set(exit_codes.MEANING) - {exit_codes.COMPLETED, exit_codes.FAILED}


def test_a_missing_data_file_is_the_users_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    raw = tiny_digits(
        tmp_path, data="robustness_fakes:digits_from_file", data_args={"path": str(tmp_path / "nope.csv")}
    )
    assert run_cli(tmp_path, raw) == exit_codes.USER_ERROR
    err = capsys.readouterr().err
    assert "data: robustness_fakes:digits_from_file" in err and "FileNotFoundError" in err
    assert "a restart cannot fix" in err
    assert 'robustness_fakes.py", line' in caplog.text, "the traceback into the user's code is logged"


def test_model_args_the_model_does_not_take_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tiny_digits(tmp_path, model_args={"width": 8, "hiddn": 32})
    assert run_cli(tmp_path, raw) == exit_codes.BAD_CONFIG
    assert "model_args" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_model_args_the_models_code_rejects_are_the_users_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tiny_digits(tmp_path, model_args={"width": -8, "hidden": 32})  # a layer cannot have -8 channels
    assert run_cli(tmp_path, raw) == exit_codes.USER_ERROR
    assert "model: trainer.demo:digits_cnn with model_args {'width': -8" in capsys.readouterr().err


def test_a_bad_key_is_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(tmp_path, tiny_digits(tmp_path), "--set", "stpes=3") == exit_codes.BAD_CONFIG
    assert "did you mean 'steps'" in capsys.readouterr().err


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 512 KiB filesystem (tmpfs): writes past it fail with ENOSPC, as on a full VM disk."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_says_so_and_exits_with_its_own_code(
    tmp_path: Path, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the default digits CNN (151 k parameters): a checkpoint with AdamW state is about 1.8 MB
    raw = tiny_digits(
        tmp_path, model_args={}, steps=20, checkpoint_every_steps=5, out_dir=str(small_disk / "run")
    )
    assert run_cli(tmp_path, raw) == exit_codes.DISK_FULL
    err = capsys.readouterr().err
    assert "the disk is full" in err and "No space left on device" in err
    ckpt_dir = small_disk / "run" / run_folder.CHECKPOINTS_DIR
    assert not [p for p in ckpt_dir.iterdir() if ".tmp." in p.name], "a failed write leaves no temporary"
    assert next(e["event"] for e in read_jsonl(small_disk / "run" / run_folder.EVENTS)) == "start"


def test_the_hosts_state_reader_calls_the_diverged_exit_diverged() -> None:
    reader = state_reader()
    assert reader.DIVERGED == exit_codes.DIVERGED  # forja-train-state: a failed unit with it is "diverged"


def test_a_second_trainer_on_a_folder_in_use_exits_75_and_touches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tiny_digits(tmp_path, steps=5)
    out = Path(raw["out_dir"])
    with folder_lock(out):  # the first trainer (started by hand, without forja's launcher)
        assert run_cli(tmp_path, raw) == exit_codes.LOCKED
        assert list(out.iterdir()) == [out / run_folder.TRAINER_LOCK], "nothing written into the other run"

        def own_loop(argv: list[str]) -> int:
            with runlib.Run(total_steps=5, run_dir=out) as run:
                run.log(1, loss=1.0)
            return run.exit_code

        assert runlib.main(own_loop, []) == exit_codes.LOCKED  # a runlib loop takes the same lock
    err = capsys.readouterr().err
    assert f"is being written by another trainer (pid {os.getpid()})" in err and "[exit 75: " in err
    assert run_cli(tmp_path, raw) == exit_codes.COMPLETED  # released: the run goes ahead


def test_a_half_written_checkpoint_is_removed_only_when_its_writer_is_gone(tmp_path: Path) -> None:
    folder = tmp_path / run_folder.CHECKPOINTS_DIR
    folder.mkdir()
    writing = subprocess.Popen(["sleep", "30"])  # a live writer
    dead_pid = subprocess.Popen(["true"])  # a writer that has ended: its PID is free
    dead_pid.wait()
    try:
        alive = folder / f"ckpt-5.pt.tmp.{writing.pid}"
        gone = folder / f"ckpt-4.pt.tmp.{dead_pid.pid}"
        alive.write_bytes(b"being written")
        gone.write_bytes(b"left by a killed writer")
        assert CheckpointManager(folder).remove_stale_temporaries() == [gone]
        assert alive.exists() and not gone.exists()
    finally:
        writing.kill()
        writing.wait()
