"""A sweep's search space is checked against the config before any study or run exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from forja import errors, sweep_space

DIGITS = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "digits.yaml"


def space_file(tmp_path: Path, params: object, **more: object) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"params": params, **more}))
    return path


@pytest.mark.parametrize(("params", "field", "words"), [
    ({"lerning_rate": {"type": "float", "low": 0.001, "high": 0.1}}, "params.lerning_rate",
     "did you mean 'lr'"),
    ({"lr": {"type": "float", "low": 0.1, "high": 0.1}}, "params.lr", "must be below high"),
    ({"lr": {"type": "float", "low": 0.0, "high": 0.1, "log": True}}, "params.lr",
     "log range must be above 0"),
    ({"steps": {"type": "int", "low": 10, "high": 20.5}}, "params.steps", "whole number"),
    ({"optimizer": {"type": "categorical", "choices": []}}, "params.optimizer", "choices"),
    ({"lr": {"type": "uniform", "low": 0.1, "high": 1}}, "params.lr", "not one of float, int, categorical"),
    ({"lr_schedule.warmup_step": {"type": "int", "low": 0, "high": 5}}, "params.lr_schedule.warmup_step",
     "did you mean 'warmup_steps'"),
])
def test_a_bad_space_is_refused_naming_the_key_and_the_fix(
    tmp_path: Path, params: dict, field: str, words: str
) -> None:
    with pytest.raises(errors.ConfigError) as caught:
        sweep_space.load(space_file(tmp_path, params), DIGITS)
    assert field in caught.value.field and words in caught.value.message


def test_objectives_pair_metrics_with_directions_and_refuse_what_a_summary_lacks(tmp_path: Path) -> None:
    path = space_file(tmp_path, {"lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
                      objectives=[{"metric": "accuracy", "direction": "maximize"}])
    assert sweep_space.load(path, DIGITS).objectives == (sweep_space.Objective("accuracy", "maximize"),)
    two = sweep_space.load(path, DIGITS, metrics=["eval_loss", "cost_usd"], directions=["minimize"])
    assert [o.direction for o in two.objectives] == ["minimize", "minimize"]
    with pytest.raises(errors.ConfigError, match="not a number of the run's summary"):
        sweep_space.load(path, DIGITS, metrics=["val_acc"])


def test_a_trial_config_is_the_users_yaml_with_the_trials_values_set(tmp_path: Path) -> None:
    from trainer.config import load

    written = sweep_space.trial_config(DIGITS, {"lr": 0.01, "lr_schedule.warmup_steps": 5},
                                       tmp_path / "t000.yaml")
    config = load(written)
    assert (config.lr, config.lr_schedule.warmup_steps, config.steps) == (0.01, 5, 300)
    with pytest.raises(errors.ConfigError, match="warmup_steps"):
        sweep_space.trial_config(DIGITS, {"lr_schedule.warmup_steps": 400}, tmp_path / "t001.yaml")
