"""A project that moved (another folder, another host) between sessions is the same run.

``project_dir`` is where relative file paths are looked up, not what is trained: changing it is a
safe change, said on resume. The model's code is compared by content, so a move alone does not
report "the model's code changed", and find-batch's cached answer still applies.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from trainer_helpers import tiny_digits

from trainer import run_folder
from trainer.batch_finder import find_batch
from trainer.config import validate
from trainer.metrics import read_jsonl
from trainer.runtime import prepare
from trainer.train import train

MODEL_SOURCE = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 24), nn.ReLU(), nn.Linear(24, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def net() -> nn.Module:
    \"\"\"The same shapes from torch's own layers: no class of the user's to fingerprint.\"\"\"
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 24), nn.{act}(), nn.Linear(24, 10))
"""
MODULE = "moved_net"


@pytest.fixture
def host_a(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The project on the first host: a model in a file, found through project_dir."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    project = tmp_path / "host-a" / "project"
    project.mkdir(parents=True)
    (project / f"{MODULE}.py").write_text(MODEL_SOURCE.format(act="ReLU"))
    yield project
    sys.modules.pop(MODULE, None)


def move(project: Path, to: Path) -> Path:
    """Copy the project to its new place and remove the old one; a new process imports it afresh."""
    shutil.copytree(project, to)
    shutil.rmtree(project)
    sys.modules.pop(MODULE, None)
    return to


def run_config(tmp_path: Path, project: Path, model: str = "Net", **overrides: Any) -> dict[str, Any]:
    return tiny_digits(
        tmp_path, model=f"./{MODULE}.py:{model}", model_args={}, project_dir=str(project), **overrides
    )


def resume_event(raw: dict[str, Any]) -> dict[str, Any]:
    return [e for e in read_jsonl(Path(raw["out_dir"]) / run_folder.EVENTS) if e["event"] == "resume"][-1]


def test_a_moved_project_resumes_and_the_move_is_said(tmp_path: Path, host_a: Path) -> None:
    assert train(validate(run_config(tmp_path, host_a, steps=10))).status == "completed"
    host_b = move(host_a, tmp_path / "host-b" / "project")

    raw = run_config(tmp_path, host_b, steps=40)
    result = train(validate(raw))
    assert result.status == "completed" and result.summary["resumed_from_step"] == 10
    changes = resume_event(raw)["config_changes"]
    assert f"project_dir: '{host_a}' -> '{host_b}' (where relative file paths are looked up)" in changes
    assert not any("code changed" in c for c in changes), changes


def test_a_moved_and_edited_model_is_still_reported(tmp_path: Path, host_a: Path) -> None:
    """Content, not place: an edit that keeps the parameters is said even when the project moved too."""
    assert train(validate(run_config(tmp_path, host_a, "net", steps=10))).status == "completed"
    host_b = move(host_a, tmp_path / "host-b" / "project")
    (host_b / f"{MODULE}.py").write_text(MODEL_SOURCE.format(act="GELU"))  # same parameters

    raw = run_config(tmp_path, host_b, "net", steps=40)
    assert train(validate(raw)).status == "completed"
    assert any("the model's code changed" in c for c in resume_event(raw)["config_changes"])


def test_find_batch_recalls_its_answer_after_a_move(tmp_path: Path, host_a: Path) -> None:
    def search(project: Path) -> Any:
        config = validate(run_config(tmp_path, project, batch_size="auto"))
        rt = prepare(config)
        return find_batch(
            config, rt.world, rt.model_fn, rt.loss_fn, rt.train_data, rt.precision, rt.channels_last
        )

    first = search(host_a)
    assert not first.from_cache
    moved = search(move(host_a, tmp_path / "host-b" / "project"))
    assert moved.from_cache and moved.max_micro_batch == first.max_micro_batch
