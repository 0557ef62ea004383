"""The config: every key documented with a default, every bad config refused with a message naming its key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainer.cli import main
from trainer.config import ConfigError, TrainConfig, field_docs, load, validate

README = Path(__file__).resolve().parents[2] / "trainer" / "README.md"


def messages(raw: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate(raw)
    return info.value.problems


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"lerning_rate": 0.1}, r"^lerning_rate: unknown key \(did you mean 'lr'\?\)$"),
        ({"zzz": 1}, r"^zzz: unknown key \(remove it"),
        (
            {"lr_schedule": {"warmup": 5}},
            r"^lr_schedule\.warmup: unknown key \(did you mean 'warmup_steps'\?\)",
        ),
        ({"steps": "ten"}, r"^steps: must be an integer \(got 'ten'\)$"),
        ({"steps": 0}, r"^steps: .*greater than 0"),
        ({"lr": "fast"}, r"^lr: must be a number \(got 'fast'\)$"),
        ({"compile": "maybe"}, r"^compile: must be true or false"),
        (
            {"precision": "fp8"},
            r"^precision: input should be 'auto', 'fp32', 'bf16' or 'fp16' \(got 'fp8'\)$",
        ),
        ({"device": "tpu"}, r"^device: input should be 'auto', 'cpu' or 'cuda'"),
        ({"batch_size": "big"}, r"^batch_size: .*'auto'.*\(got 'big'\)"),
        ({"batch_size": 0}, r"^batch_size: must be >= 1 or 'auto'"),
        ({"num_workers": -1}, r"^num_workers: must be >= 0 or 'auto'"),
        ({"model": "trainer.demo.digits_cnn"}, r"^model: .*must be 'package.module:callable'"),
        ({"data": "nocolon"}, r"^data: .*must be 'package.module:callable'"),
        ({"keep_checkpoints": 0}, r"^keep_checkpoints: .*greater than or equal to 1"),
        ({"model_args": [1, 2]}, r"^model_args: must be a mapping"),
        ({"steps": 100, "epochs": 3}, r"^steps/epochs: set one of them, not both"),
        (
            {"batch_size": 24, "effective_batch_size": 100},
            r"^effective_batch_size: 100 is not a multiple of batch_size 24",
        ),
        (
            {"steps": 50, "lr_schedule": {"warmup_steps": 50}},
            r"^lr_schedule\.warmup_steps: 50 must be < steps 50",
        ),
        ({"lr": 0.001, "lr_schedule": {"min_lr": 0.01}}, r"^lr_schedule\.min_lr: 0\.01 is above lr 0\.001"),
        ({"device": "cpu", "precision": "fp16"}, r"^precision: fp16 needs device cuda"),
        ({"device": "cpu", "memory_fraction": 0.5}, r"^memory_fraction: only applies to device cuda"),
        ({"memory_fraction": 1.5}, r"^memory_fraction: .*less than or equal to 1"),
        (["a", "list"], r"^\(config\): the file must hold a mapping"),
    ],
)
def test_bad_config_gets_a_message_naming_the_key(raw: Any, expected: str) -> None:
    problems = messages(raw)
    assert any(re.search(expected, p) for p in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    problems = messages({"lerning_rate": 1, "steps": "x", "precision": "fp8"})
    assert [p.split(":")[0] for p in problems] == ["steps", "precision", "lerning_rate"]


def test_defaults_alone_make_a_valid_config() -> None:
    config = validate({})
    assert config.model == "trainer.demo:digits_cnn" and config.steps == 1000 and config.batch_size == 32


def test_every_key_has_a_description_and_appears_in_the_readme() -> None:
    readme = README.read_text()
    for key, (_default, description) in field_docs().items():
        assert description, f"{key} has no description"
        assert f"`{key}`" in readme, f"trainer/README.md does not document {key}"


def test_builtin_configs_are_valid_and_overrides_apply() -> None:
    for name in ("digits", "mnist"):
        assert isinstance(load(name), TrainConfig)
    config = load("digits", ["steps=7", "lr_schedule.warmup_steps=2", "model_args={width: 4}"])
    assert (config.steps, config.lr_schedule.warmup_steps, config.model_args) == (7, 2, {"width": 4})


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    config = load("mnist")
    path = tmp_path / "config.yaml"
    from trainer.config import dump

    path.write_text(dump(config))
    assert load(path) == config


def test_missing_file_and_bad_set_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--config: no such file"):
        load(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="--set 'steps': expected key=value"):
        load("digits", ["steps"])
    (tmp_path / "bad.yaml").write_text("steps: [1\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load(tmp_path / "bad.yaml")


@pytest.mark.parametrize(("content", "expected"), [
    (b"steps: 10\nlr: [0.1\n", r"bad\.yaml is not valid YAML at line 3, column 1: expected ',' or ']'"),
    (b"steps: 10\nmodel: caf\xe9\n",
     r"bad\.yaml is not UTF-8 text: byte 0xe9 at line 2, column 11; save it as UTF-8"),
    (b"", r"bad\.yaml is empty; give the keys to change"),
    (b"# only a comment\n", r"bad\.yaml is empty"),
    (b"- steps: 10\n", r"bad\.yaml must hold a mapping of keys, got list"),
])
def test_a_config_file_that_cannot_be_read_names_the_file_and_where(
    tmp_path: Path, content: bytes, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=expected) as caught:
        load(path)
    assert "<unicode string>" not in str(caught.value)
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "run")]) == 2  # not 1: no restart
    assert "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_cli_exits_2_and_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"stpes": 10}))
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "stpes: unknown key (did you mean 'steps'?)" in err
    assert not (tmp_path / "run").exists(), "a refused config must change nothing"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model=trainer.nowhere:net"], "model: cannot import module 'trainer.nowhere'"),
        (["model=trainer.demo:nothing_here"], "model: module 'trainer.demo' has no attribute 'nothing_here'"),
        (["data=trainer.demo:__doc__"], "data: 'trainer.demo:__doc__' is not callable"),
        (["effective_batch_size=100000", "batch_size=auto", "device=cpu"], "batch: the global batch"),
    ],
)
def test_runtime_config_problems_exit_2(
    overrides: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["train", "--config", "digits", "--out", str(tmp_path / "run"), "--set", f"cache_dir={tmp_path}"]
    for item in overrides:
        args += ["--set", item]
    assert main(args) == 2
    assert expected in capsys.readouterr().err
