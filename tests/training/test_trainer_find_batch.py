"""find-batch: the true limit in few trials of real training steps, a cache, and an exact batch plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import tiny_digits

from trainer.batch_finder import find_batch, grow_then_bisect, is_oom
from trainer.config import ConfigError, validate
from trainer.data import largest_divisor_plan, plan_batches
from trainer.runtime import prepare


@pytest.mark.parametrize(
    ("limit", "cap"), [(6, 4096), (37, 4096), (1, 4096), (64, 4096), (1000, 300), (300, 300)]
)
def test_search_finds_the_exact_limit(limit: int, cap: int) -> None:
    result = grow_then_bisect(lambda b: b <= limit, cap)
    assert result.best == min(limit, cap)
    assert len(result.trials) <= 2 * cap.bit_length() + 1


def test_the_users_limit_of_6_takes_6_trials_and_3_ooms() -> None:
    result = grow_then_bisect(lambda b: b <= 6, 4096)
    assert result.trials == [(1, True), (2, True), (4, True), (8, False), (6, True), (7, False)]


def test_nothing_fits_gives_zero() -> None:
    assert grow_then_bisect(lambda b: False, 64).best == 0


def test_oom_is_recognised_by_type_and_by_allocator_message() -> None:
    assert is_oom(__import__("torch").OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert is_oom(
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
    )
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_finds_the_limit_of_a_real_model_with_full_steps_then_uses_the_cache(tmp_path: Path) -> None:
    raw = tiny_digits(
        tmp_path,
        model="trainer_fakes:limited_digits",
        model_args={"limit": 37},
        batch_size="auto",
        effective_batch_size=96,
    )
    config = validate(raw)
    rt = prepare(config)
    first = find_batch(
        config, rt.world, rt.model_fn, rt.loss_fn, rt.train_data, rt.precision, rt.channels_last
    )
    assert first.max_micro_batch == 37 and not first.from_cache
    assert [b for b, ok in first.trials if not ok] == [64, 48, 40, 38]
    # the largest micro-batch <= 37 that divides 96 exactly: 32 x 3 accumulation steps
    assert first.plan == {"micro_batch": 32, "accum_steps": 3, "world_size": 1, "global_batch": 96}
    again = find_batch(
        config, rt.world, rt.model_fn, rt.loss_fn, rt.train_data, rt.precision, rt.channels_last
    )
    assert again.from_cache and again.trials == [] and again.max_micro_batch == 37


def test_a_non_memory_error_is_not_mistaken_for_a_limit(tmp_path: Path) -> None:
    raw = tiny_digits(
        tmp_path,
        model="trainer_fakes:limited_digits",
        model_args={"limit": 37},
        batch_size="auto",
        loss="trainer_fakes:broken_loss",
    )
    config = validate(raw)
    rt = prepare(config)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        find_batch(config, rt.world, rt.model_fn, rt.loss_fn, rt.train_data, rt.precision, rt.channels_last)


def test_train_with_auto_batch_uses_the_found_plan(tmp_path: Path) -> None:
    from trainer.train import train

    raw = tiny_digits(
        tmp_path,
        model="trainer_fakes:limited_digits",
        model_args={"limit": 20},
        batch_size="auto",
        effective_batch_size=40,
        steps=5,
    )
    result = train(validate(raw))
    # 20 fit; 10% margin below it leaves 18, and the largest divisor of 40 up to 18 is 10
    assert (result.summary["micro_batch"], result.summary["accum_steps"]) == (10, 4)


def test_plans_are_exact_or_refused() -> None:
    assert plan_batches(16, 64, 2).accum_steps == 2
    assert largest_divisor_plan(6, 64, 1).micro_batch == 4
    assert largest_divisor_plan(100, None, 4).global_batch == 400
    with pytest.raises(ValueError, match="effective_batch_size: 100 is not a multiple of batch_size 16 x 2"):
        plan_batches(16, 100, 2)
    with pytest.raises(ConfigError, match="effective_batch_size"):
        validate({"batch_size": 7, "effective_batch_size": 20})
