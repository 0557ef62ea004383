"""A resumed run with a changed config: unsafe changes refused with exit 2 naming them, safe ones said."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from trainer_helpers import tiny_digits

from trainer import exit_codes, run_folder
from trainer.cli import main
from trainer.config import ConfigError, validate
from trainer.metrics import read_jsonl
from trainer.train import train

MODEL_SOURCE = """
from torch import nn


def net(hidden: int = 16) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, {width}), nn.ReLU(), nn.Linear({width}, 10))
"""


def stopped_run(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """A run folder holding a checkpoint at step 10 of 40 (stopped as by a preemption)."""
    raw = tiny_digits(tmp_path, steps=10, **overrides)
    assert train(validate(raw)).status == "completed"
    return {**raw, "steps": 40}


def config_file(tmp_path: Path, raw: dict[str, Any]) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("lr", 0.01, "lr: 0.003 -> 0.01"),
        ("seed", 7, "seed: 1337 -> 7"),
        ("precision", "bf16", "precision: 'fp32' -> 'bf16'"),
        ("model_args", {"width": 16, "hidden": 32}, "model_args: {'width': 8, 'hidden': 32} -> {'width': 16"),
    ],
)
def test_an_unsafe_change_is_refused_with_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: Any, shown: str
) -> None:
    raw = stopped_run(tmp_path)
    code = main(["train", "--config", config_file(tmp_path, {**raw, key: value})])
    err = capsys.readouterr().err
    assert code == exit_codes.BAD_CONFIG and code in exit_codes.NO_RESTART
    assert shown in err and "ckpt-10.pt" in err and "allow_config_change" in err
    assert "Traceback" not in err


def test_a_changed_model_class_is_refused_naming_the_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same config, the model's code edited between sessions (the drill's raw traceback, exit 1)."""
    module = tmp_path / "mynet_resume.py"
    module.write_text(MODEL_SOURCE.format(width=32))
    monkeypatch.syspath_prepend(str(tmp_path))
    raw = stopped_run(tmp_path, model="mynet_resume:net", model_args={})
    module.write_text(MODEL_SOURCE.format(width=48))
    sys.modules.pop("mynet_resume", None)  # a new process would import the edited file
    with pytest.raises(ConfigError, match=r"differ from ckpt-10.pt's.*size mismatch for 1.weight"):
        train(validate(raw))
    sys.modules.pop("mynet_resume", None)


def test_safe_changes_are_allowed_and_said(tmp_path: Path) -> None:
    raw = stopped_run(tmp_path)
    changed = {**raw, "log_every_steps": 5, "price_per_hour": 1.5, "eval_every_steps": 20}
    result = train(validate(changed))
    assert result.status == "completed" and result.summary["resumed_from_step"] == 10
    resume = [e for e in read_jsonl(Path(raw["out_dir"]) / run_folder.EVENTS) if e["event"] == "resume"][-1]
    said = " | ".join(resume["config_changes"])
    assert "steps: 10 -> 40" in said and "log_every_steps: 1 -> 5" in said and "price_per_hour" in said


def test_allow_config_change_resumes_with_a_new_lr_on_purpose(tmp_path: Path) -> None:
    raw = stopped_run(tmp_path)
    result = train(validate({**raw, "lr": 0.001, "allow_config_change": True}))
    assert result.status == "completed" and result.summary["resumed_from_step"] == 10
    resume = [e for e in read_jsonl(Path(raw["out_dir"]) / run_folder.EVENTS) if e["event"] == "resume"][-1]
    assert any(c.startswith("lr: 0.003 -> 0.001") and "allowed by" in c for c in resume["config_changes"])
