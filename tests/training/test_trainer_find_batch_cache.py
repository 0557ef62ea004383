"""find-batch: the cache follows the model's code, the plan keeps a margin, auto never goes full-batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from trainer_helpers import tiny_digits

from trainer.batch_finder import find_batch
from trainer.config import validate
from trainer.runtime import prepare
from trainer.train import train

MODEL_SOURCE = '''
import torch
from torch import nn


class Net(nn.Module):
    """A real MLP on a device with room for {budget} activations per sample-batch (a simulated limit)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, {width}), nn.ReLU(), nn.Linear({width}, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] * {width} > {budget}:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return self.body(x)


def net() -> nn.Module:
    return Net()
'''


def search(tmp_path: Path, **overrides):
    config = validate(tiny_digits(tmp_path, batch_size="auto", **overrides))
    rt = prepare(config)
    return find_batch(
        config, rt.world, rt.model_fn, rt.loss_fn, rt.train_data, rt.precision, rt.channels_last
    )


def test_a_grown_model_at_the_same_path_is_searched_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "grown_net.py"
    monkeypatch.syspath_prepend(str(tmp_path))
    module.write_text(MODEL_SOURCE.format(width=8, budget=8 * 40))
    small = search(tmp_path, model="grown_net:net", model_args={})
    assert (small.max_micro_batch, small.from_cache) == (40, False)
    assert search(tmp_path, model="grown_net:net", model_args={}).from_cache  # same code: recalled

    # the user edits the file: 600x wider, same import path, same config
    module.write_text(MODEL_SOURCE.format(width=4800, budget=4800 * 6))
    sys.modules.pop("grown_net", None)
    grown = search(tmp_path, model="grown_net:net", model_args={})
    assert not grown.from_cache, "the old answer (40) would OOM at the first step"
    assert grown.max_micro_batch == 6
    sys.modules.pop("grown_net", None)


def test_the_plan_keeps_a_margin_below_the_largest_batch_that_fit(tmp_path: Path) -> None:
    found = search(tmp_path, model="trainer_fakes:limited_digits", model_args={"limit": 37})
    assert (found.max_micro_batch, found.limited_by) == (37, "memory")
    assert found.usable_micro_batch == 33 and found.plan["micro_batch"] == 33  # int(37 x 0.9)
    exact = search(
        tmp_path, model="trainer_fakes:limited_digits", model_args={"limit": 37}, find_batch_margin=0
    )
    assert exact.plan["micro_batch"] == 37


def test_auto_batch_on_a_small_dataset_keeps_enough_steps_per_epoch(tmp_path: Path) -> None:
    """On a CPU nothing runs out of memory: the drill's digits demo became 1 step per epoch."""
    raw = tiny_digits(tmp_path, batch_size="auto", epochs=1)
    del raw["steps"]
    result = train(validate(raw))
    s = result.summary
    assert s["global_batch"] == 1438 // 20 and s["total_steps"] >= 20  # 1438 samples, min_steps_per_epoch 20
    fewer = train(validate({**raw, "min_steps_per_epoch": 5, "out_dir": str(tmp_path / "r5")}))
    assert fewer.summary["global_batch"] == 1438 // 5
