"""A researcher's own model and data with the built-in trainer: dict samples and outputs, ``.loss``
objects, custom collate, streams, optimizers and schedules by name or path, files as well as modules.
Each run is a real one on digits (CPU, a second or two); resumed runs are compared bit for bit with
runs that never stopped.
"""

from __future__ import annotations

import json
import math
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import tiny_digits

from trainer import exit_codes, run_folder
from trainer.batch_finder import find_batch
from trainer.checkpoint import CheckpointManager
from trainer.cli import main
from trainer.config import ConfigError, validate
from trainer.errors import UserCodeError
from trainer.estimate import estimate
from trainer.runtime import prepare
from trainer.train import train


def metric_rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / run_folder.METRICS).read_text().splitlines()]


def newest_state(run: Path) -> dict[str, Any]:
    found = CheckpointManager(run / run_folder.CHECKPOINTS_DIR).load_latest()
    assert found is not None
    return found.state


def sigterm_at(step: int) -> Any:
    def hook(done: int) -> None:
        if done == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


def assert_resume_is_exact(tmp_path: Path, raw: dict[str, Any], stop_at: int) -> dict[str, Any]:
    """Run straight, and stopped by SIGTERM then resumed: same losses, LRs and weights. The summary."""
    straight = train(validate({**raw, "out_dir": str(tmp_path / "straight")}))
    assert straight.status == "completed", straight.summary
    config = validate({**raw, "out_dir": str(tmp_path / "resumed")})
    first = train(config, on_step=sigterm_at(stop_at))
    assert (first.status, first.exit_code) == ("preempted", exit_codes.PREEMPTED)
    second = train(config)
    assert second.status == "completed" and second.summary["resumed_from_step"] == first.summary["steps"]

    def curve(run: Path) -> list[tuple[int, float, float]]:
        return [(r["step"], r["loss"], r["lr"]) for r in metric_rows(run)]

    assert curve(tmp_path / "resumed") == curve(tmp_path / "straight")
    a, b = newest_state(tmp_path / "straight")["model"], newest_state(tmp_path / "resumed")["model"]
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"
    assert second.summary["accuracy"] == straight.summary["accuracy"]
    return second.summary


def mlp_run(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """tiny_digits with a small MLP that trains in well under a second."""
    raw = tiny_digits(tmp_path, model="trainer_own_code:DictNet", data="trainer_own_code:dict_digits")
    raw.pop("model_args")
    raw.update({"lr": 0.01, "log_every_steps": 1, **overrides})
    return raw


# -- Hugging Face-style data and outputs ------------------------------------------------------------


@pytest.mark.parametrize("model", ["trainer_own_code:DictNet", "trainer_own_code:LossObjectNet"])
def test_dict_samples_and_a_model_that_returns_its_loss_train_evaluate_and_resume(
    tmp_path: Path, model: str
) -> None:
    summary = assert_resume_is_exact(tmp_path, mlp_run(tmp_path, model=model, steps=100), stop_at=37)
    assert summary["accuracy"] > 0.8 and summary["eval_loss"] < 1.0


def test_custom_collate_with_arguments_feeds_a_model_that_returns_only_logits(tmp_path: Path) -> None:
    raw = mlp_run(
        tmp_path,
        model="trainer_own_code:MaskedNet",
        data="trainer.demo:digits",  # (image, label) tuples: the collate makes the dict and the mask
        collate="trainer_own_code:to_dict_batch",
        collate_args={"keep": 1.0},
        steps=100,
    )
    result = train(validate(raw))
    assert result.summary["accuracy"] > 0.8  # labels were held back from forward and scored with CE

    blind = train(validate({**raw, "collate_args": {"keep": 0.0}, "out_dir": str(tmp_path / "blind")}))
    assert blind.summary["accuracy"] < 0.3  # the collate's argument reached it: a zero mask hides the digits


def test_find_batch_and_estimate_run_a_dict_model(tmp_path: Path) -> None:
    config = validate(mlp_run(tmp_path, model="trainer_own_code:LossObjectNet", batch_size="auto"))
    rt = prepare(config)
    found = find_batch(
        config, rt.world, rt.model_fn, rt.loss_fn, rt.train_data, rt.precision, rt.channels_last
    )
    assert found.max_micro_batch >= 1 and all(ok for _, ok in found.trials)
    report = estimate(rt, memory_gb=24.0)
    assert report["memory_gb"]["activations_per_sample"] > 0
    assert report["memory_gb"]["optimizer_state"] * 1e9 == 8 * report["params"]  # AdamW, measured


# -- streams -------------------------------------------------------------------------------------


def test_an_iterable_dataset_trains_across_passes_and_resumes_exactly(tmp_path: Path) -> None:
    # 1438 samples / 32 per step = 44 full steps per pass: 100 steps cross two passes; noise is drawn
    # while reading, and accumulation splits each step in two micro-batches
    raw = mlp_run(
        tmp_path,
        model="trainer_own_code:DictNet",
        data="trainer_own_code:stream_digits",
        data_args={"noise": 0.05},
        effective_batch_size=32,
        steps=100,
    )
    summary = assert_resume_is_exact(tmp_path, raw, stop_at=60)
    assert summary["accuracy"] > 0.8
    epochs = [r["epoch"] for r in metric_rows(tmp_path / "straight")]
    assert epochs[43] == 0 and epochs[-1] == 2  # step 45 began the second pass, step 89 the third


def test_stream_batches_are_the_same_with_dataloader_workers(tmp_path: Path) -> None:
    raw = mlp_run(
        tmp_path,
        model="trainer_own_code:DictNet",
        data="trainer_own_code:stream_digits",
        data_args={"noise": 0.05},
        effective_batch_size=32,
        steps=12,
    )
    alone = train(validate({**raw, "out_dir": str(tmp_path / "alone"), "num_workers": 0}))
    workers = train(validate({**raw, "out_dir": str(tmp_path / "workers"), "num_workers": 2}))
    assert alone.status == workers.status == "completed"
    losses = [[r["loss"] for r in metric_rows(tmp_path / name)] for name in ("alone", "workers")]
    assert losses[0] == losses[1]


def test_epochs_with_a_stream_is_refused(tmp_path: Path) -> None:
    raw = mlp_run(tmp_path, data="trainer_own_code:stream_digits", epochs=2)
    raw.pop("steps")
    with pytest.raises(ConfigError, match=r"epochs: .*iterable dataset.*set steps"):
        train(validate(raw))


# -- optimizers and schedules --------------------------------------------------------------------


def test_optimizer_by_name_with_arguments(tmp_path: Path) -> None:
    raw = mlp_run(
        tmp_path, optimizer="sgd", optimizer_args={"momentum": 0.9, "nesterov": True}, lr=0.1, steps=100
    )
    result = train(validate(raw))
    assert result.summary["accuracy"] > 0.8
    opt = newest_state(Path(raw["out_dir"]))["optimizer"]
    assert opt["param_groups"][0]["momentum"] == 0.9 and opt["param_groups"][0]["nesterov"] is True
    assert all("momentum_buffer" in s for s in opt["state"].values())


def test_optimizer_by_import_path_and_by_file_factory_that_builds_parameter_groups(tmp_path: Path) -> None:
    by_path = mlp_run(tmp_path, optimizer="torch.optim:RMSprop", optimizer_args={"alpha": 0.9}, steps=20)
    train(validate(by_path))
    assert newest_state(Path(by_path["out_dir"]))["optimizer"]["param_groups"][0]["alpha"] == 0.9

    (tmp_path / "grouped_adamw.py").write_text(
        textwrap.dedent(
            """
            import torch

            def make(model, lr, decay=0.1):
                params = list(model.named_parameters())
                return torch.optim.AdamW(
                    [
                        {"params": [p for n, p in params if n.endswith("bias")], "weight_decay": 0.0},
                        {"params": [p for n, p in params if not n.endswith("bias")], "weight_decay": decay},
                    ],
                    lr=lr,
                )
            """
        )
    )
    by_file = mlp_run(
        tmp_path,
        optimizer="./grouped_adamw.py:make",
        optimizer_args={"decay": 0.2},
        project_dir=str(tmp_path),
        out_dir=str(tmp_path / "grouped"),
        steps=20,
    )
    train(validate(by_file))
    groups = newest_state(tmp_path / "grouped")["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.0, 0.2]


def test_a_torch_scheduler_by_name_sets_every_lr_and_resumes_exactly(tmp_path: Path) -> None:
    raw = mlp_run(
        tmp_path,
        lr=0.004,
        steps=40,
        lr_schedule={"scheduler": "StepLR", "scheduler_args": {"step_size": 10, "gamma": 0.5}},
    )
    assert_resume_is_exact(tmp_path, raw, stop_at=15)
    lrs = [(r["step"], r["lr"]) for r in metric_rows(tmp_path / "straight")]
    # the LR logged at step s is the one optimizer step s-1 (0-based) used
    assert lrs == [(s, 0.004 * 0.5 ** ((s - 1) // 10)) for s in range(1, 41)]


def test_schedulers_get_the_run_length_and_peak_lr_when_not_given(tmp_path: Path) -> None:
    raw = mlp_run(
        tmp_path, lr=0.01, steps=30, lr_schedule={"scheduler": "torch.optim.lr_scheduler:OneCycleLR"}
    )
    result = train(validate(raw))
    assert result.status == "completed"  # OneCycleLR raises when stepped past its total_steps
    lrs = [r["lr"] for r in metric_rows(Path(raw["out_dir"]))]
    assert max(lrs) == pytest.approx(0.01, rel=0.05) and lrs[-1] < 0.01 / 1000
    assert math.isclose(lrs[0], 0.01 / 25)  # OneCycleLR's div_factor: it started from max_lr = lr


def test_a_scheduler_from_a_file_gets_its_arguments_and_the_run_length(tmp_path: Path) -> None:
    (tmp_path / "warm_linear.py").write_text(
        textwrap.dedent(
            """
            from torch.optim.lr_scheduler import LambdaLR

            class WarmLinear(LambdaLR):
                def __init__(self, optimizer, warmup, total_steps):
                    def factor(step):
                        if step < warmup:
                            return (step + 1) / warmup
                        return max(0.0, (total_steps - step) / (total_steps - warmup))
                    super().__init__(optimizer, factor)
            """
        )
    )
    raw = mlp_run(
        tmp_path,
        lr=0.01,
        steps=20,
        project_dir=str(tmp_path),
        lr_schedule={"scheduler": "./warm_linear.py:WarmLinear", "scheduler_args": {"warmup": 4}},
    )
    train(validate(raw))
    lrs = [r["lr"] for r in metric_rows(Path(raw["out_dir"]))]
    expected = [0.01 * (s + 1) / 4 if s < 4 else 0.01 * (20 - s) / 16 for s in range(20)]
    assert lrs == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"optimizer": "AdamX"}, r"^optimizer: 'AdamX' is not in torch.optim \(did you mean 'Adam'\?"),
        ({"optimizer": "SGD", "betas": [0.9, 0.99]}, r"^betas: SGD takes no betas"),
        ({"optimizer_args": {"momentum": 0.9}}, r"^optimizer_args: .*momentum"),
        ({"optimizer": "SGD", "optimizer_args": {"momentum": -1}}, r"^optimizer_args: SGD refused"),
        ({"lr_schedule": {"scheduler": "ReduceLROnPlateau"}}, r"^lr_schedule.scheduler: ReduceLROnPlateau"),
        ({"lr_schedule": {"scheduler": "StepLR"}}, r"^lr_schedule.scheduler_args: .*step_size"),
    ],
)
def test_bad_optimizer_or_scheduler_is_named_before_training(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        train(validate(mlp_run(tmp_path, **overrides)))
    assert any(__import__("re").search(message, p) for p in info.value.problems), info.value.problems
    assert not (tmp_path / "run" / run_folder.CHECKPOINTS_DIR).exists()


def test_a_scheduler_replaces_the_built_in_warmup() -> None:
    with pytest.raises(ConfigError, match=r"lr_schedule.scheduler: StepLR replaces the built-in"):
        validate({"lr_schedule": {"scheduler": "StepLR", "warmup_steps": 5}})


# -- files as well as modules; errors name the field and end with the right exit code ----------------


NET_FILE = """
from tiny_blocks import head

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU())
        self.head = head(hidden)

    def forward(self, x):
        return self.head(self.body(x))
"""


@pytest.mark.parametrize("how", ["project_dir", "forja_project_dir", "current_dir"])
def test_a_model_given_as_a_file_path_imports_its_siblings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    stem = f"file_net_{how}"
    (project / "models" / f"{stem}.py").write_text(NET_FILE)
    (project / "models" / "tiny_blocks.py").write_text(
        "from torch import nn\n\ndef head(hidden):\n    return nn.Linear(hidden, 10)\n"
    )
    extra: dict[str, Any] = {"model": f"./models/{stem}.py:Net", "model_args": {"hidden": 24}}
    if how == "project_dir":
        extra["project_dir"] = str(project)
    elif how == "forja_project_dir":  # the project forja sent, from the run contract
        monkeypatch.setenv("FORJA_PROJECT_DIR", str(project))
    else:
        monkeypatch.chdir(project)
    result = train(validate(tiny_digits(tmp_path, steps=20, **extra)))
    assert result.status == "completed" and result.summary["params"] == 64 * 24 + 24 + 24 * 10 + 10


def run_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], **overrides: Any) -> tuple[int, str]:
    raw = mlp_run(tmp_path, steps=5, **overrides)
    path = tmp_path / "config.json"  # JSON is YAML
    path.write_text(json.dumps(raw))
    code = main(["train", "--config", str(path)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "code", "message"),
    [
        ({"model": "no_such_package.nets:Net"}, exit_codes.BAD_CONFIG, r"model: cannot import module"),
        ({"model": "./missing_net.py:Net"}, exit_codes.BAD_CONFIG, r"model: no file './missing_net.py'"),
        ({"model": "trainer_own_code:NoSuchNet"}, exit_codes.BAD_CONFIG, r"model: .* has no attribute"),
        (
            {"model_args": {"hiddn": 8}},
            exit_codes.BAD_CONFIG,
            r"model_args: DictNet\(\) .*hiddn.*takes: hidden",
        ),
        ({"data_args": {"size": 8}}, exit_codes.BAD_CONFIG, r"data_args: dict_digits\(\) .*size"),
        (
            {"loss": "torch.nn:CrossEntropyLoss", "loss_args": {"smoothing": 0.1}},
            exit_codes.BAD_CONFIG,
            r"loss_args: CrossEntropyLoss\(\) .*smoothing.*label_smoothing",
        ),
        (
            {"loss": "torch.nn.functional:cross_entropy", "loss_args": {"reduction": "none"}},
            exit_codes.USER_ERROR,
            r"loss: torch.nn.functional:cross_entropy gave \[16\], not a single number",
        ),
        ({"model": "./boom_net.py:Net"}, exit_codes.USER_ERROR, r"model: importing .*boom_net.py raised"),
        (
            {"model": "./json.py:Net"},
            exit_codes.BAD_CONFIG,
            r"model: .*json.py .*module 'json'.*rename the file",
        ),
        (
            {
                "model": "trainer_own_code:MaskedNet",
                "data": "trainer.demo:digits",
                "collate": "trainer_own_code:to_dict_batch",
                "label_key": "target",  # the collate calls it labels
            },
            exit_codes.USER_ERROR,
            r"loss: auto needs the model's own loss .* and the batch has no target",
        ),
    ],
)
def test_errors_in_the_users_code_name_the_field_and_are_not_restarted(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    overrides: dict[str, Any],
    code: int,
    message: str,
) -> None:
    (tmp_path / "boom_net.py").write_text("raise RuntimeError('the data path is wrong')\n")
    (tmp_path / "json.py").write_text("Net = None\n")  # would hide the standard library's json
    monkeypatch.chdir(tmp_path)
    got, err = run_cli(tmp_path, capsys, **overrides)
    assert got == code, err
    assert __import__("re").search(message, err), err


def test_a_loss_class_is_built_with_its_arguments(tmp_path: Path) -> None:
    raw = mlp_run(
        tmp_path,
        model="trainer_own_code:MaskedNet",
        data="trainer.demo:digits",
        collate="trainer_own_code:to_dict_batch",
        loss="torch.nn:CrossEntropyLoss",
        loss_args={"label_smoothing": 0.2},
        steps=30,
    )
    result = train(validate(raw))
    assert result.status == "completed"
    # with label smoothing 0.2 over 10 classes the loss cannot go below the smoothed target's entropy
    assert result.summary["final_loss"] > 0.5


def test_a_model_that_names_none_of_the_batch_keys_gets_a_clear_error(tmp_path: Path) -> None:
    raw = mlp_run(tmp_path, model="trainer.demo:digits_cnn")  # forward(x) on {"pixel_values", "labels"}
    with pytest.raises(UserCodeError, match=r"model: forward\(\) takes \(x\) but the batch has keys"):
        train(validate(raw))
