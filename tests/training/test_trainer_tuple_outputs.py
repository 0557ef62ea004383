"""Tuple outputs: ``(loss, logits, ...)`` when the first element is a 0-dim tensor, else ``(logits, ...)``.

Hugging Face models with ``return_dict=False`` return the loss first when given labels; it used to
be read as the logits (cross-entropy on a 0-dim tensor, or a named loss fed the loss).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from trainer_helpers import tiny_digits
from trainer_own_code import dict_digits
from trainer_tuple_models import SMOOTHING, LossOnlyNet, TupleNet

from trainer.batches import Objective, correct_count
from trainer.config import validate
from trainer.train import train


@pytest.fixture
def batch() -> dict[str, torch.Tensor]:
    train_set, _ = dict_digits()
    samples = [train_set[i] for i in range(16)]
    return {key: torch.stack([s[key] for s in samples]) for key in ("pixel_values", "labels")}


def test_a_tuple_that_starts_with_a_0_dim_loss_gives_the_models_loss_and_its_logits(
    batch: dict[str, torch.Tensor],
) -> None:
    model = TupleNet()
    scored = Objective(None)(model, batch)
    logits = model.head(model.body(batch["pixel_values"]))
    assert scored.logits is not None and scored.logits.shape == (16, 10)
    assert torch.allclose(scored.logits, logits)
    smoothed = F.cross_entropy(logits, batch["labels"], label_smoothing=SMOOTHING)
    assert torch.allclose(scored.loss, smoothed), "the model's own loss, not the trainer's cross-entropy"
    assert not torch.allclose(scored.loss, F.cross_entropy(logits, batch["labels"]))
    assert correct_count(scored.logits, scored.targets) is not None


def test_a_named_loss_gets_the_logits_behind_the_loss(batch: dict[str, torch.Tensor]) -> None:
    scored = Objective(F.cross_entropy, "torch.nn.functional:cross_entropy")(TupleNet(), batch)
    assert scored.logits is not None
    assert torch.allclose(scored.loss, F.cross_entropy(scored.logits, batch["labels"]))


def test_a_tuple_without_a_leading_loss_is_logits_first(batch: dict[str, torch.Tensor]) -> None:
    """No labels reach the model (it is called on the input alone): ``(logits, hidden)``."""
    model = TupleNet()
    scored = Objective(None)(model, (batch["pixel_values"], batch["labels"]))
    assert scored.logits is not None and scored.logits.shape == (16, 10)
    assert torch.allclose(scored.loss, F.cross_entropy(scored.logits, batch["labels"]))


def test_a_lone_loss_in_a_tuple_is_the_loss_with_no_logits(batch: dict[str, torch.Tensor]) -> None:
    scored = Objective(None)(LossOnlyNet(), batch)
    assert scored.logits is None and scored.loss.dim() == 0


@pytest.mark.parametrize("model", ["trainer_tuple_models:TupleNet", "trainer_tuple_models:LossOnlyNet"])
def test_a_return_dict_false_model_trains_and_evaluates(tmp_path: Path, model: str) -> None:
    raw = tiny_digits(tmp_path, model=model, model_args={}, data="trainer_own_code:dict_digits")
    raw.update(steps=100, lr=0.01)
    result = train(validate(raw))
    s = result.summary
    assert result.status == "completed" and s["steps"] == 100
    assert s["eval_loss"] is not None and s["eval_loss"] < 1.6  # log(10) = 2.3 untrained
    if model.endswith("TupleNet"):  # logits behind the loss: accuracy can be counted
        assert s["accuracy"] is not None and s["accuracy"] > 0.8
    else:
        assert s["accuracy"] is None
