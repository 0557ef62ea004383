"""find-batch's cache follows the optimizer and the collate: a changed one is searched again.

The "device" here is simulated (CPU has no allocator limit): a budget shared by the activations
of the batch the model last saw and the optimizer's state, or by the samples a collate puts into a
batch, raising ``torch.OutOfMemoryError`` as CUDA's allocator does. The answers differ on purpose,
so a stale cached answer fails the assertions, not only a cache flag.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from trainer_helpers import tiny_digits

from trainer.batch_finder import BatchResult, find_batch
from trainer.config import validate
from trainer.runtime import prepare

NET_SOURCE = """
import torch
from torch import nn

SEEN = [0]  # the batch the model saw last: its activations are still held at the optimizer step


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        SEEN[0] = x.shape[0]
        return self.body(x)
"""

OPTIMIZER_SOURCE = '''
import torch

from hungry_net import SEEN


class Hungry(torch.optim.SGD):
    """SGD holding ``state`` units of memory on a device with room for {budget} (one unit a sample)."""

    def __init__(self, params, lr: float, state: int = 0) -> None:
        super().__init__(params, lr=lr)
        self.state_units = state

    def step(self, closure=None):
        if SEEN[0] + self.state_units > {budget}:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return super().step(closure)
'''

COLLATE_SOURCE = '''
from torch.utils.data import default_collate


def repeat(samples, factor: int = 1):
    """Every sample ``factor`` times (as padding or augmentation copies would grow a batch){note}."""
    return default_collate(list(samples) * factor)
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's project folder; the modules imported from it are forgotten afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "hungry_net.py").write_text(NET_SOURCE)  # the model, in a file of its own
    yield tmp_path
    for name in ("hungry_net", "hungry_opt", "repeat_collate"):
        sys.modules.pop(name, None)


def search(project: Path, **overrides: Any) -> BatchResult:
    config = validate(tiny_digits(project, batch_size="auto", project_dir=str(project), **overrides))
    rt = prepare(config)
    return find_batch(
        config, rt.world, rt.model_fn, rt.loss_fn, rt.train_data, rt.precision, rt.channels_last
    )


def test_more_optimizer_state_is_searched_again_not_recalled(project: Path) -> None:
    (project / "hungry_opt.py").write_text(OPTIMIZER_SOURCE.replace("{budget}", "40"))
    lean = {"model": "./hungry_net.py:Net", "model_args": {}, "optimizer": "./hungry_opt.py:Hungry"}
    first = search(project, **lean, optimizer_args={"state": 0})
    assert (first.max_micro_batch, first.from_cache) == (40, False)
    assert search(project, **lean, optimizer_args={"state": 0}).from_cache  # same optimizer: recalled

    hungry = search(project, **lean, optimizer_args={"state": 24})
    assert not hungry.from_cache, "the old answer (40) would run out of memory at the first step"
    assert hungry.max_micro_batch == 16


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_another_optimizer_by_name_gets_its_own_search(project: Path) -> None:
    model = {"model": "trainer_fakes:limited_digits", "model_args": {"limit": 37}}
    adamw = search(project, **model, optimizer="AdamW")
    assert search(project, **model, optimizer="AdamW").cache_key == adamw.cache_key
    sgd = search(project, **model, optimizer="SGD", optimizer_args={"momentum": 0.9})
    assert not sgd.from_cache and sgd.trials and sgd.cache_key != adamw.cache_key
    plain = search(project, **model, optimizer="SGD")
    assert not plain.from_cache and plain.cache_key != sgd.cache_key  # its arguments count too
    decayed = search(project, **model, optimizer="AdamW", weight_decay=0.1)
    assert not decayed.from_cache and decayed.cache_key != adamw.cache_key


def test_an_edited_optimizer_file_is_searched_again(project: Path) -> None:
    module = project / "hungry_opt.py"
    module.write_text(OPTIMIZER_SOURCE.replace("{budget}", "40"))
    paths = {"model": "./hungry_net.py:Net", "model_args": {}, "optimizer": "./hungry_opt.py:Hungry"}
    assert search(project, **paths).max_micro_batch == 40
    module.write_text(OPTIMIZER_SOURCE.replace("{budget}", "12"))  # same path, same config
    sys.modules.pop("hungry_opt", None)
    edited = search(project, **paths)
    assert (edited.from_cache, edited.max_micro_batch) == (False, 12)


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_a_collate_that_grows_the_batch_gets_its_own_answer(project: Path) -> None:
    (project / "repeat_collate.py").write_text(COLLATE_SOURCE.replace("{note}", ""))
    model = {"model": "trainer_fakes:limited_digits", "model_args": {"limit": 40}}
    assert search(project, **model).max_micro_batch == 40  # torch's default_collate
    doubled = search(project, **model, collate="./repeat_collate.py:repeat", collate_args={"factor": 2})
    assert (doubled.from_cache, doubled.max_micro_batch) == (False, 20)
    quadrupled = search(project, **model, collate="./repeat_collate.py:repeat", collate_args={"factor": 4})
    assert (quadrupled.from_cache, quadrupled.max_micro_batch) == (False, 10)
    again = search(project, **model, collate="./repeat_collate.py:repeat", collate_args={"factor": 2})
    assert (again.from_cache, again.max_micro_batch) == (True, 20)


def test_an_edited_collate_file_is_searched_again(project: Path) -> None:
    module = project / "repeat_collate.py"
    module.write_text(COLLATE_SOURCE.replace("{note}", ""))
    config = {
        "model": "trainer_fakes:limited_digits",
        "model_args": {"limit": 40},
        "collate": "./repeat_collate.py:repeat",
    }
    assert not search(project, **config).from_cache
    assert search(project, **config).from_cache
    module.write_text(COLLATE_SOURCE.replace("{note}", ", edited"))
    sys.modules.pop("repeat_collate", None)
    assert not search(project, **config).from_cache
