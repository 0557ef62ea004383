"""`python -m trainer plan`: a traced step's peak against the allocator's, the batch plan in a budget,
and each bad input's error (a GPU nobody knows, a model fake tensors cannot follow, a micro-batch of 1
that does not fit)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainer.cli import main
from trainer.config import load
from trainer.exit_codes import BAD_CONFIG
from trainer.plan import (
    MIB,
    OpTimes,
    PlanError,
    find_gpu,
    load_parts,
    materialize,
    measure_step,
    op_signature,
    plan,
    step_values,
    trace_step,
)

TINY_GPT = ["model_args={layers: 1, width: 32, heads: 2, context: 32, vocab_size: 256}",
            "data_args={context: 32, max_bytes: 20000}"]  # fmt: skip


def tiny_gpt(*more: str):
    return load("trainer/configs/gpt_tiny.yaml", [*TINY_GPT, *more])


def test_the_traced_peak_of_a_step_is_the_cpu_allocators_within_ten_percent() -> None:
    """Fake tensors (no memory) against the same step on real ones: the CPU allocator's own events."""
    l4 = find_gpu("L4")
    parts = load_parts(tiny_gpt(), l4)
    traced = trace_step(parts, l4, 16).peak_bytes / MIB
    measured = measure_step(parts, 16, torch.device("cpu"), repeats=1)["peak_mib"]
    assert traced == pytest.approx(measured, rel=0.10)


def test_the_plan_fits_the_largest_micro_batch_in_the_gpu_and_keeps_the_global_batch() -> None:
    small = dataclasses.replace(find_gpu("L4"), name="small", usable_mib=500 + 12.0)
    found = plan(tiny_gpt("batch_size=auto", "effective_batch_size=96", "max_batch_size=512"), small)
    largest = found["largest_micro_batch"]["value"]
    rows = {row["micro_batch"]: row["peak_mib"] for row in found["peak_per_micro_batch"]}
    assert found["limited_by"] == "memory" and 4 < largest < 512 and rows[largest] <= small.usable_mib
    p = found["plan"]
    assert p["micro_batch"] <= largest * 0.9
    assert p["micro_batch"] * p["accum_steps"] == p["global_batch"] == 96
    assert found["peak_mib"]["value"] <= small.usable_mib
    assert found["step_s"]["how"] == "modelled" and found["tokens_per_s"]["value"] > 0


def test_each_heavy_op_is_timed_at_its_own_shapes_once_and_cached_per_device(tmp_path) -> None:
    """The CPU's matmul rate is no constant: a 256-wide product is timed as one, not scaled from a
    64-wide one; a second plan (another process) reads the time back instead of timing again."""
    mm = torch.ops.aten.mm.default
    small, large = ((torch.ones(n, n), torch.ones(n, n)) for n in (64, 256))
    timer = OpTimes("cpu", tmp_path)
    took_small = timer.seconds(mm, (op_signature(small), op_signature({})))
    took_large = timer.seconds(mm, (op_signature(large), op_signature({})))
    assert took_small is not None and took_large is not None and took_large > 4 * took_small
    timer.save()
    again = OpTimes("cpu", tmp_path)
    assert again.times == timer.times and len(again.times) == 2
    assert "|threads=" in again.scope and again.scope in (tmp_path / "plan_ops.json").read_text()


def test_a_cpus_op_is_timed_on_the_values_a_real_step_gave_it_repeated_and_rotated() -> None:
    """A CPU's max-pool runs three times faster over MNIST's blank borders than over noise: it is
    timed on what it met in a real step of two samples, repeated to the traced micro-batch, each copy
    rotated (a branch predictor learns an exact repeat, and runs it faster than real data)."""
    parts = load_parts(load("digits"), find_gpu("L4"))
    values = step_values(parts)
    assert values is not None
    (real,) = values.args[("forward", "aten.max_pool2d_with_indices.default", 0)]
    assert real.shape[0] == 2 and (real == 0).any()  # a ReLU's zeros, not noise
    traced = torch.empty(8, *real.shape[1:], dtype=real.dtype)
    (stand_in,) = materialize(op_signature([traced]), torch.device("cpu"), iter([real]))
    assert stand_in.shape == traced.shape and torch.equal(stand_in[:2], real)
    copy = stand_in[2:4]
    assert not torch.equal(copy, real)
    assert torch.equal(copy.flatten().sort().values, real.flatten().sort().values)


def test_a_gpu_the_plan_does_not_know_is_a_config_error_listing_the_known(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "digits", "--gpu", "K80"]) == BAD_CONFIG
    said = capsys.readouterr().err
    assert "--gpu: 'K80' is not a GPU the plan knows" in said and "L4" in said and "H100" in said


def test_a_model_fake_tensors_cannot_follow_is_named_by_layer_and_measured_on_real_tensors() -> None:
    found = plan(load("digits", ["model=plan_models:gated"]), "L4")
    assert found["fallback"].startswith("gate (ReadsAValue)")
    assert "falls back to the hook measurement" in found["notes"][0]
    assert found["peak_mib"]["how"] == "fallback" and found["peak_mib"]["value"] > 500


def test_a_micro_batch_of_1_that_does_not_fit_says_by_how_much_and_what_would() -> None:
    small = dataclasses.replace(find_gpu("L4"), name="small", usable_mib=0.05, context_mib=0.0)
    with pytest.raises(PlanError) as caught:
        plan(tiny_gpt("precision=fp32"), small)
    said = str(caught.value)
    for words in ("even a micro-batch of 1 needs", "GiB over its", "precision: bf16", "a shorter sequence",
                  "activation checkpointing", "a bigger GPU: T4"):
        assert words in said, words
