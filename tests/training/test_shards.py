"""Sharded datasets (trainer.shards): the order of an epoch, exact resume, and bad input.

Real Parquet shards written by trainer.shard_writer, real training runs on CPU; the order is read
from the sample ids a recording model saw (tests/training/shard_models.py).
"""

from __future__ import annotations

import itertools
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from shard_models import seen, write_digits_shards
from trainer_helpers import tiny_digits

from trainer.config import ConfigError, validate
from trainer.data import BatchPlan, StreamPosition
from trainer.errors import UserCodeError
from trainer.shard_writer import write_shards
from trainer.shards import dataset
from trainer.train import train


@pytest.fixture(scope="module")
def digits_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_digits_shards(tmp_path_factory.mktemp("digits-shards"))


def windows_order(
    train_set: Any, plan: BatchPlan, rank: int, epoch: int, start: int, workers: int
) -> list[int]:
    """The ids of rank ``rank``'s steps as a DataLoader with ``workers`` workers hands them back."""
    pos = StreamPosition(plan, rank, seed=7)
    pos.set_position(epoch, start)
    per_worker = [train_set.windows(pos, w, workers, None) for w in range(workers)]
    ids: list[int] = []
    for window in itertools.chain.from_iterable(itertools.zip_longest(*per_worker)):
        if window is not None:
            ids += [int(i) for step in window for micro in step for i in micro[2]]
    return ids


def test_an_epoch_reads_every_sample_once_in_an_order_of_its_own(digits_shards: Path) -> None:
    train_set, _ = dataset(str(digits_shards), columns=["image", "label", "id"], window_mb=0.1)
    plan = BatchPlan(micro_batch=16, accum_steps=2, world_size=1)
    steps = train_set.steps_per_epoch(plan)
    assert steps == 1438 // 32
    first, second = (windows_order(train_set, plan, 0, e, 0, 1) for e in (0, 1))
    assert len(first) == len(set(first)) == steps * 32  # every sample at most once; 30 left out
    assert set(first) <= set(range(1438)) and first != second
    # shuffled across shards: the first step already mixes samples of several shards (360 each)
    assert len({i // 360 for i in first[:32]}) > 1


def test_the_order_is_the_same_with_any_number_of_workers_and_any_micro_batch(digits_shards: Path) -> None:
    train_set, _ = dataset(str(digits_shards), columns=["image", "label", "id"], window_mb=0.1)
    alone = windows_order(train_set, BatchPlan(32, 1, 1), 0, 0, 0, 1)
    assert windows_order(train_set, BatchPlan(32, 1, 1), 0, 0, 0, 3) == alone
    assert windows_order(train_set, BatchPlan(8, 4, 1), 0, 0, 0, 2) == alone  # an OOM fallback's plan


def test_a_start_step_skips_exactly_the_samples_before_it(digits_shards: Path) -> None:
    train_set, _ = dataset(str(digits_shards), columns=["image", "label", "id"], window_mb=0.1)
    plan = BatchPlan(16, 1, 1)
    whole = windows_order(train_set, plan, 0, 2, 0, 1)
    for start in (1, 13, 50, 88):
        assert windows_order(train_set, plan, 0, 2, start, 2) == whole[start * 16 :]


def test_ranks_read_disjoint_lanes_with_the_same_number_of_steps(digits_shards: Path) -> None:
    train_set, _ = dataset(str(digits_shards), columns=["image", "label", "id"], window_mb=0.1)
    plan = BatchPlan(16, 1, 2)  # global batch 32 over 2 ranks
    lanes = [windows_order(train_set, plan, rank, 0, 0, 2) for rank in (0, 1)]
    assert len(lanes[0]) == len(lanes[1]) == train_set.steps_per_epoch(plan) * 16
    assert not set(lanes[0]) & set(lanes[1])


def sigterm_at(step: int) -> Any:
    def hook(done: int) -> None:
        if done == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


def shard_run(tmp_path: Path, shards: Path, name: str, **overrides: Any) -> dict[str, Any]:
    ids = tmp_path / f"{name}.ids"
    return tiny_digits(
        tmp_path,
        model="shard_models:IdRecorder",
        model_args={"path": str(ids)},
        data="trainer.shards:dataset",
        data_args={"source": str(shards), "eval": "eval", "shapes": {"image": [1, 8, 8]}, "window_mb": 0.02},
        out_dir=str(tmp_path / name),
        **overrides,
    )


def test_a_run_preempted_mid_epoch_resumes_at_the_exact_sample(tmp_path: Path, digits_shards: Path) -> None:
    # 1438 samples / 16 per step = 89 steps per epoch: stop at 40 (mid-epoch), end in epoch 2 at 100
    straight = train(validate(shard_run(tmp_path, digits_shards, "straight", steps=100)))
    assert straight.status == "completed" and straight.summary["accuracy"] is not None

    config = validate(shard_run(tmp_path, digits_shards, "stopped", steps=100))
    first = train(config, on_step=sigterm_at(40))
    assert (first.status, first.summary["steps"]) == ("preempted", 41)
    assert len(seen(str(tmp_path / "stopped.ids"))) == 41
    second = train(config)
    assert second.status == "completed" and second.summary["resumed_from_step"] == 41

    order = seen(str(tmp_path / "straight.ids"))
    assert len(order) == 100 and seen(str(tmp_path / "stopped.ids")) == order
    saw = [i for batch in order[:89] for i in batch]
    assert len(set(saw)) == len(saw)  # the first epoch saw no sample twice


def test_epochs_work_because_shards_know_their_length(tmp_path: Path, digits_shards: Path) -> None:
    raw = shard_run(tmp_path, digits_shards, "epochs", batch_size=64, num_workers=2)
    del raw["steps"]
    result = train(validate({**raw, "epochs": 2}))
    assert result.summary["steps"] == 2 * (1438 // 64) == len(seen(str(tmp_path / "epochs.ids")))


def test_the_shard_config_example_trains_the_digits(tmp_path: Path, digits_shards: Path) -> None:
    from trainer.config import load

    config = load(
        "digits_shards",
        [
            f"data_args.source={digits_shards}",
            f"out_dir={tmp_path / 'run'}",
            "steps=150",
            "device=cpu",
            "precision=fp32",
            "render_plots=false",
        ],
    )
    result = train(config)
    assert result.status == "completed" and result.summary["accuracy"] > 0.9


# -- bad input ----------------------------------------------------------------------------------------


def problems(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    return "\n".join(exc.value.problems)


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        dataset(str(tmp_path / "nope"))
    assert "data_args.source" in problems(exc) and "nope" in problems(exc)


def test_a_folder_without_shards_is_named(tmp_path: Path, digits_shards: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        dataset(str(tmp_path))
    assert problems(exc).startswith("data_args.train: no .parquet shards under")
    with pytest.raises(ConfigError) as exc:
        dataset(str(digits_shards), eval="validation")
    assert problems(exc).startswith("data_args.eval: no .parquet shards under")


def test_a_column_that_is_not_there_is_named_with_the_columns_that_are(digits_shards: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        dataset(str(digits_shards), columns=["pixels", "label"])
    assert "data_args.columns: 'pixels' is not a column of train/shard-000000.parquet" in problems(exc)
    assert "id, image, label" in problems(exc)


def test_a_bad_column_through_the_trainer_exits_with_the_config_error(
    tmp_path: Path, digits_shards: Path
) -> None:
    raw = shard_run(tmp_path, digits_shards, "bad")
    raw["data_args"]["columns"] = ["image", "labels"]
    with pytest.raises(ConfigError, match=r"data_args\.columns: 'labels'"):
        train(validate(raw))


def test_a_text_column_needs_a_transform(tmp_path: Path) -> None:
    write_shards([{"text": np.array(["a", "b", "c", "d"]), "label": np.arange(4)}], tmp_path)
    train_set, _ = dataset(str(tmp_path), columns=["text", "label"])
    with pytest.raises(
        UserCodeError, match=r"column 'text' is string, not numbers; give data_args\.transform"
    ):
        next(iter(train_set))


def test_the_writer_keeps_a_tensors_dtype_and_shape(tmp_path: Path) -> None:
    images = np.arange(5 * 2 * 3 * 4, dtype=np.uint8).reshape(5, 2, 3, 4)
    files = write_shards([{"image": images, "label": np.arange(5)}], tmp_path)
    assert [f.name for f in files] == ["shard-000000.parquet"]
    assert pq.read_metadata(files[0]).row_group(0).column(0).compression == "ZSTD"
    train_set, _ = dataset(str(tmp_path), columns=["image", "label"])
    image, label = next(iter(train_set))
    assert image.dtype == torch.uint8 and torch.equal(image, torch.from_numpy(images[0]))
    assert int(label) == 0


def test_the_command_line_writes_an_npz_file_as_shards(tmp_path: Path) -> None:
    from trainer.shard_writer import main

    tokens = np.arange(6 * 5, dtype=np.int32).reshape(6, 5)
    np.savez(tmp_path / "data.npz", tokens=tokens, label=np.arange(6))
    assert (
        main(
            [
                "write",
                str(tmp_path / "out"),
                "--npz",
                str(tmp_path / "data.npz"),
                "--shard-mb",
                "0.0001",
                "--row-group-mb",
                "0.00005",
            ]
        )
        == 0
    )
    shards = sorted((tmp_path / "out" / "train").glob("*.parquet"))
    assert len(shards) > 1 and not list((tmp_path / "out" / "train").glob(".*"))  # no temporary left
    train_set, _ = dataset(str(tmp_path / "out"), columns=["tokens", "label"])
    assert [(t.tolist(), int(y)) for t, y in train_set] == [
        (list(r), i) for i, r in enumerate(tokens.tolist())
    ]
