"""A diverged run stops as "diverged" (exit 7) at its first bad step, exports nothing, and every file it
writes stays valid JSON; weights with NaN or Inf are never exported, pushed or loaded."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from trainer_helpers import tiny_digits

from trainer import exit_codes, finite, run_folder
from trainer.checkpoint import CheckpointManager
from trainer.cli import main
from trainer.demo import digits_cnn
from trainer.export import CONFIG, WEIGHTS, NonFiniteWeights, export_state, load_model, sha256_file, verify
from trainer.metrics import read_jsonl

BAD_LOSS = "robustness_fakes:BadLossAt"


def strict(text: str) -> Any:
    """JSON as the standard says it: a bare NaN or Infinity fails here (Python's json accepts them)."""

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def train(tmp_path: Path, name: str, **overrides: Any) -> tuple[int, Path]:
    raw = tiny_digits(tmp_path, out_dir=str(tmp_path / name), **overrides)
    config = tmp_path / f"{name}.yaml"
    config.write_text(json.dumps(raw))
    return main(["train", "--config", str(config)]), tmp_path / name


def run_files_are_strict_json(run: Path) -> None:
    strict((run / run_folder.SUMMARY).read_text())
    for name in run_folder.LOGS:
        for line in (run / name).read_text().splitlines():
            strict(line)


def test_lr_1e6_on_the_digits_demo_stops_at_the_first_nan_with_exit_7_and_exports_nothing(
    tmp_path: Path,
) -> None:
    code, run = train(tmp_path, "diverging", lr=1e6, steps=40)
    assert code == exit_codes.DIVERGED and exit_codes.DIVERGED in exit_codes.NO_RESTART
    summary = strict((run / run_folder.SUMMARY).read_text())
    assert summary["status"] == "diverged" and summary["exit_code"] == exit_codes.DIVERGED
    divergence = summary["divergence"]
    first_bad = divergence["step"]
    assert 1 < first_bad <= 10 and summary["steps"] == first_bad - 1  # stopped at the bad step, not after
    assert divergence["reason"] == f"loss is {divergence['loss']}" and divergence["loss"] in ("nan", "inf")
    assert divergence["last_finite_step"] == first_bad - 1 and math.isfinite(divergence["last_finite_loss"])
    assert summary["error"].startswith(f"diverged at step {first_bad}: loss is ")
    assert not (run / run_folder.MODEL_DIR).exists(), "a diverged run exports nothing"
    run_files_are_strict_json(run)
    # one line per step (log_every_steps 1): every step before it had a finite loss
    lines = list(read_jsonl(run / run_folder.METRICS))
    assert [line["step"] for line in lines] == list(range(1, first_bad))
    assert all(math.isfinite(line["loss"]) for line in lines)


def test_a_bad_batch_within_skip_nonfinite_is_skipped_and_the_run_completes_finite(tmp_path: Path) -> None:
    code, run = train(tmp_path, "skip", steps=12, loss=BAD_LOSS, loss_args={"calls": [5]}, skip_nonfinite=1)
    assert code == exit_codes.COMPLETED
    skips = [e for e in read_jsonl(run / run_folder.EVENTS) if e["event"] == "skip_nonfinite"]
    assert [(e["loss"], e["skipped"]) for e in skips] == [("nan", 1)]
    lines = {line["step"]: line for line in read_jsonl(run / run_folder.METRICS)}
    bad = skips[0]["step"]
    assert lines[bad]["loss"] is None and lines[bad][finite.FLAG] == {"loss": "nan"}  # null plus a flag
    assert all(math.isfinite(lines[s]["loss"]) for s in lines if s != bad) and len(lines) == 12
    run_files_are_strict_json(run)
    assert verify(run / run_folder.MODEL_DIR)["step"] == 12  # exported: the weights never saw the bad batch


def test_a_diverged_run_names_the_newest_checkpoint_before_it_and_that_step_exports(tmp_path: Path) -> None:
    code, run = train(tmp_path, "ckpt", steps=12, loss=BAD_LOSS, loss_args={"calls": [6], "value": "inf"},
                      checkpoint_every_steps=1, keep_checkpoints=10)  # fmt: skip
    assert code == exit_codes.DIVERGED
    divergence = strict((run / run_folder.SUMMARY).read_text())["divergence"]
    step = divergence["step"]
    assert (divergence["loss"], divergence["last_finite_step"]) == ("inf", step - 1)
    # step N's loss used the weights saved as ckpt-(N-1).pt: the newest checkpoint known good is N-2's
    assert divergence["last_good_checkpoint"] == f"ckpt-{step - 2}.pt"
    # the newer one is set aside, so a restart (a lower lr, allow_config_change) resumes from the good one
    assert divergence["set_aside"] == [f"ckpt-{step - 1}.pt.diverged"]
    kept = CheckpointManager(run / run_folder.CHECKPOINTS_DIR).list()
    assert [p.name for p in kept][-1] == f"ckpt-{step - 2}.pt"
    assert main(["export", str(run), "--step", str(step - 2)]) == exit_codes.COMPLETED
    assert verify(run / run_folder.MODEL_DIR)["checkpoint"] == f"ckpt-{step - 2}.pt"
    assert main(["export", str(run), "--step", "99"]) == exit_codes.BAD_CONFIG


def test_judged_every_4_steps_a_bad_step_between_stops_the_run_at_the_next_judged_one(tmp_path: Path) -> None:
    """check_finite_every_steps 4 spares three host syncs of four: a bad batch on a step not judged
    poisons the weights, and the run stops at the next judged step, still exporting nothing."""
    code, run = train(tmp_path, "every4", steps=20, loss=BAD_LOSS, loss_args={"calls": [6]},
                      check_finite_every_steps=4)  # fmt: skip
    assert code == exit_codes.DIVERGED
    summary = strict((run / run_folder.SUMMARY).read_text())
    # the sixth call is step 6's: not judged; step 8 is the next judged, and the last finite loss the
    # judge saw is step 4's (step 5's was finite too, but not judged)
    divergence = summary["divergence"]
    assert (divergence["step"], divergence["last_finite_step"], summary["steps"]) == (8, 4, 7)
    lines = {line["step"]: line for line in read_jsonl(run / run_folder.METRICS)}
    assert all(math.isfinite(lines[s]["loss"]) for s in range(1, 6))
    assert all(lines[s][finite.FLAG] == {"loss": "nan"} for s in (6, 7))  # null plus a flag
    assert not (run / run_folder.MODEL_DIR).exists()
    run_files_are_strict_json(run)


def test_a_finite_loss_above_the_bound_is_a_divergence_too(tmp_path: Path) -> None:
    code, run = train(tmp_path, "bound", steps=10, divergence_loss_bound=1e-6)
    assert code == exit_codes.DIVERGED
    divergence = strict((run / run_folder.SUMMARY).read_text())["divergence"]
    assert divergence["step"] == 1 and divergence["reason"].endswith("above divergence_loss_bound 1e-06")
    assert divergence["last_finite_loss"] is None and divergence["last_good_checkpoint"] is None


# -- weights ---------------------------------------------------------------------------------------

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.float8_e5m2, torch.float8_e4m3fn]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_the_torch_free_scan_finds_each_non_finite_element_and_nothing_else(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    info = torch.finfo(dtype)
    # every finite extreme: the largest, the smallest normal and subnormal, both signs, zero
    edges = [info.max, -info.max, info.smallest_normal, -info.smallest_normal, info.smallest_normal / 2, 1.0]
    ints = torch.tensor([-1, 0x7F7F], dtype=torch.int16)
    specials = [math.nan] + ([] if dtype == torch.float8_e4m3fn else [math.inf, -math.inf])  # e4m3fn: no inf
    tensors = {"finite": torch.tensor(edges, dtype=torch.float64).to(dtype), "ints": ints}
    for value in specials:
        bad = torch.zeros(1001, dtype=torch.float32)
        bad[777] = value  # an odd position: the scan must not depend on alignment beyond the element
        tensors[f"has_{finite.word(value)}"] = bad.to(dtype)
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    assert sorted(finite.nonfinite_tensors(path)) == sorted(f"has_{finite.word(v)}" for v in specials)


def test_a_header_that_is_not_safetensors_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"nope!")
    with pytest.raises(ValueError, match=r"w\.safetensors is not a safetensors file"):
        finite.nonfinite_tensors(path)


def nan_model_folder(tmp_path: Path) -> Path:
    """A model folder made by hand, as a user could: an export, then NaN weights and their sha256."""
    config = {"model": "trainer.demo:digits_cnn", "model_args": {"width": 4, "hidden": 8}}
    state = digits_cnn(width=4, hidden=8).state_dict()
    folder = export_state(state, config, tmp_path / "model", step=3).folder
    state = {k: v.clone() for k, v in state.items()}
    next(iter(state.values()))[0] = math.nan
    save_file(state, str(folder / WEIGHTS))
    info = json.loads((folder / CONFIG).read_text())
    info["sha256"] = sha256_file(folder / WEIGHTS)
    (folder / CONFIG).write_text(json.dumps(info))
    return folder


def test_non_finite_weights_are_never_exported_verified_or_loaded(tmp_path: Path) -> None:
    state = digits_cnn(width=4, hidden=8).state_dict()
    name = next(iter(state))
    state[name] = state[name].clone().fill_(math.inf)
    with pytest.raises(NonFiniteWeights, match=f"1 tensor\\(s\\) hold NaN or infinite values \\({name}\\)"):
        export_state(state, {"model": "trainer.demo:digits_cnn"}, tmp_path / "refused", step=1)
    assert not (tmp_path / "refused").exists(), "nothing written"
    folder = nan_model_folder(tmp_path)
    with pytest.raises(NonFiniteWeights, match="--step N"):
        verify(folder)
    with pytest.raises(NonFiniteWeights):
        load_model(folder)


def test_finite_json_writes_null_with_a_flag_at_every_depth() -> None:
    record = {"loss": math.nan, "lr": 0.1, "points": [1.0, -math.inf], "inner": {"x": math.inf}, "n": None}
    text = finite.dumps(record)
    assert strict(text) == {
        "loss": None, "lr": 0.1, "points": [1.0, None], "n": None,
        "inner": {"x": None, finite.FLAG: {"x": "inf"}},
        finite.FLAG: {"loss": "nan", "points.1": "-inf"},
    }  # fmt: skip
    assert finite.dumps({"a": 1}) == '{"a": 1}'  # nothing flagged when all is finite


def test_a_users_own_loop_stops_as_diverged_when_it_logs_a_non_finite_loss(tmp_path: Path) -> None:
    """trainer.runlib judges each logged loss with the same judge: Diverged leaves the loop, exit 7."""
    from test_runlib import short_run

    from trainer import runlib

    def script(argv: list[str]) -> int:  # lr 5: far too high, the loss explodes
        return short_run(tmp_path / "own", steps=500, lr=5.0, save_every=2, render_plots=False).exit_code

    assert runlib.main(script, []) == exit_codes.DIVERGED
    run = tmp_path / "own"
    summary = strict((run / run_folder.SUMMARY).read_text())
    divergence = summary["divergence"]
    step = divergence["step"]
    assert summary["status"] == "diverged" and summary["exit_code"] == exit_codes.DIVERGED and step < 500
    assert summary["error"].startswith(f"diverged at step {step}: loss is ")
    assert divergence["last_finite_step"] == step - 1
    # saved every 2 steps; the weights of step-1 gave the bad loss: the newest good one is at or before step-2
    newest_good = max(s for s in range(2, step - 1, 2))
    assert divergence["last_good_checkpoint"] == f"ckpt-{newest_good}.pt"
    last = list(read_jsonl(run / run_folder.METRICS))[-1]
    assert last["step"] == step and last["loss"] is None and last[finite.FLAG] == {"loss": divergence["loss"]}
    run_files_are_strict_json(run)
