"""Checkpoint integrity: flipped bits are caught, corrupt files set aside, and no silent restart from 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_helpers import tiny_digits

from trainer import exit_codes, run_folder
from trainer.checkpoint import (
    CheckpointManager,
    CorruptCheckpoint,
    NoValidCheckpoint,
    atomic_save,
    load_checkpoint,
    verify_checkpoint,
)
from trainer.cli import main
from trainer.config import validate
from trainer.metrics import read_jsonl
from trainer.train import train

MARKERS = (1.25, 2.5, -3.75)  # three tensors of distinct, recognisable float32 values


def state_with_markers(step: int) -> dict:
    return {"step": step, "model": {f"w{i}": torch.full((4096,), v) for i, v in enumerate(MARKERS)}}


def flip_bit_inside(path: Path, value: float) -> None:
    """Flip one bit in the middle of the stored tensor filled with ``value`` (its raw float32 bytes)."""
    data = bytearray(path.read_bytes())
    pattern = torch.full((64,), value).numpy().tobytes()
    where = data.find(pattern)
    assert where > 0, "the tensor's bytes were not found in the file"
    data[where + 130] ^= 0x04
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("value", MARKERS)
def test_a_bit_flipped_inside_a_tensor_is_caught_not_loaded(tmp_path: Path, value: float) -> None:
    path = tmp_path / "ckpt-1.pt"
    atomic_save(state_with_markers(1), path)
    assert verify_checkpoint(path) is True
    flip_bit_inside(path, value)
    # the drill's finding, still true of the bytes: torch.load alone reads the damaged tensor silently
    silent = torch.load(path, weights_only=True)
    assert not all(
        torch.equal(silent["model"][k], state_with_markers(1)["model"][k]) for k in silent["model"]
    )
    with pytest.raises(CorruptCheckpoint, match="does not match its SHA-256"):
        load_checkpoint(path)


def test_a_flipped_newest_checkpoint_is_set_aside_and_the_previous_one_used(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=3)
    for step in (10, 20):
        manager.save(state_with_markers(step), step)
    flip_bit_inside(manager.path_for(20), MARKERS[1])
    found = manager.load_latest()
    assert found is not None and found.state["step"] == 10
    assert [p.name for p in found.skipped] == ["ckpt-20.pt.corrupt"]
    assert (tmp_path / "ckpt-20.pt.corrupt").exists(), "a corrupt file is kept for inspection"


def test_a_file_without_a_footer_is_trusted_only_with_allow_legacy_checkpoints(tmp_path: Path) -> None:
    path = tmp_path / "ckpt-5.pt"
    torch.save(state_with_markers(5), path)  # no footer: an older trainer wrote it, or another program
    with pytest.raises(CorruptCheckpoint, match=r"has no checksum footer .* allow_legacy_checkpoints: true"):
        verify_checkpoint(path)
    assert verify_checkpoint(path, allow_legacy=True) is False
    assert load_checkpoint(path, allow_legacy=True)["step"] == 5


def test_a_truncated_file_is_called_truncated_with_or_without_its_footer(tmp_path: Path) -> None:
    path = tmp_path / "ckpt-5.pt"
    atomic_save(state_with_markers(5), path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a copy cut short
    for allow_legacy in (False, True):
        with pytest.raises(CorruptCheckpoint, match=r"ckpt-5\.pt: truncated"):
            verify_checkpoint(path, allow_legacy=allow_legacy)


def test_a_stray_foreign_checkpoint_is_set_aside_and_the_run_resumes_from_its_own(tmp_path: Path) -> None:
    """Before: a foreign ckpt-N.pt was taken for a pre-checksum one, and the resume stopped with exit 2
    and a list of config 'changes' that never happened, while the run's own checkpoint sat beside it."""
    raw = tiny_digits(tmp_path, steps=20, checkpoint_every_steps=10)
    run = Path(raw["out_dir"])
    assert train(validate(raw)).status == "completed"
    ckpt = run / run_folder.CHECKPOINTS_DIR / "ckpt-25.pt"
    torch.save({"step": 25, "model": {}, "config": {"lr": 1.0}}, ckpt)
    again = train(validate({**raw, "steps": 30}))
    assert again.status == "completed" and again.summary["resumed_from_step"] == 20
    assert (run / run_folder.CHECKPOINTS_DIR / "ckpt-25.pt.corrupt").exists(), "kept for a person to look at"


def test_a_run_resumes_from_the_checkpoint_before_a_flipped_one(tmp_path: Path) -> None:
    raw = tiny_digits(tmp_path, steps=30, checkpoint_every_steps=10)
    run = Path(raw["out_dir"])
    assert train(validate(raw)).status == "completed"
    newest = run / run_folder.CHECKPOINTS_DIR / "ckpt-30.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x10  # a flip somewhere in the weights or the optimizer state
    newest.write_bytes(bytes(data))
    again = train(validate({**raw, "steps": 35}))
    assert again.status == "completed" and again.summary["resumed_from_step"] == 20
    resume = [e for e in read_jsonl(run / run_folder.EVENTS) if e["event"] == "resume"][-1]
    assert resume["skipped_checkpoints"] == ["ckpt-30.pt.corrupt"]


def test_when_every_checkpoint_is_corrupt_the_run_stops_with_its_own_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tiny_digits(tmp_path, steps=20, checkpoint_every_steps=10)
    run = Path(raw["out_dir"])
    train(validate(raw))
    for ckpt in (run / run_folder.CHECKPOINTS_DIR).glob("ckpt-*.pt"):
        ckpt.write_bytes(ckpt.read_bytes()[:1000])  # truncated, as by a disk that filled up
    config_file = tmp_path / "run.yaml"
    config_file.write_text(json.dumps({**raw, "steps": 25}))
    with pytest.raises(NoValidCheckpoint, match="allow_fresh_start"):
        train(validate({**raw, "steps": 25}))
    # the command line: exit 5, which the unit does not restart, and the files are kept
    assert main(["train", "--config", str(config_file)]) == exit_codes.NO_VALID_CHECKPOINT
    assert "no valid checkpoint" in capsys.readouterr().err
    assert sorted(p.name for p in (run / run_folder.CHECKPOINTS_DIR).iterdir()) == [
        "ckpt-10.pt.corrupt",
        "ckpt-20.pt.corrupt",
    ]
    # a later start still refuses (the corrupt files say the run had progress) ...
    assert main(["train", "--config", str(config_file)]) == exit_codes.NO_VALID_CHECKPOINT
    # ... until the user allows a fresh start
    fresh = main(["train", "--config", str(config_file), "--set", "allow_fresh_start=true"])
    assert fresh == exit_codes.COMPLETED
    summary = json.loads((run / run_folder.SUMMARY).read_text())
    assert summary["status"] == "completed" and summary["resumed_from_step"] == 0 and summary["steps"] == 25


def test_a_checkpoint_of_many_blocks_verifies_and_a_flip_in_any_block_is_caught(tmp_path: Path) -> None:
    from trainer.checkpoint import BLOCK

    path = tmp_path / "big.pt"
    big = {"step": 1, "model": {"w": torch.arange(3 * BLOCK // 4 + 12345, dtype=torch.float32)}}  # ~3 blocks
    atomic_save(big, path)
    assert verify_checkpoint(path) is True and path.stat().st_size > 2 * BLOCK
    assert torch.equal(load_checkpoint(path)["model"]["w"], big["model"]["w"])
    data = bytearray(path.read_bytes())
    data[BLOCK + 4096] ^= 0x01  # inside the second block
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint):
        load_checkpoint(path)
