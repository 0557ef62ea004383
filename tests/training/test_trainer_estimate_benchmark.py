"""estimate measures activations to predict memory; benchmark times matmuls; the mnist demo is offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_helpers import tiny_digits

from trainer.benchmark import format_table, run_benchmark
from trainer.cli import main
from trainer.config import validate
from trainer.estimate import activation_bytes, estimate
from trainer.hardware import L4_BF16_PEAK, peak_flops
from trainer.runtime import prepare


def test_activations_are_measured_and_grow_linearly_with_the_batch(tmp_path: Path) -> None:
    rt = prepare(validate(tiny_digits(tmp_path)))
    model = rt.model_fn()
    a4, a8, a16 = (activation_bytes(rt, model, b) for b in (4, 8, 16))
    assert 0 < a4 < a8 < a16
    assert a16 - a8 == pytest.approx(2 * (a8 - a4), rel=0.05)
    # width 8 digits CNN at batch 4, fp32: the input (4x1x8x8) and two 8/16-channel 8x8 maps at least
    assert a4 >= 4 * (64 + 8 * 64 + 16 * 64) * 4


def test_estimate_counts_16_bytes_per_parameter_plus_the_autocast_copy(tmp_path: Path) -> None:
    rt = prepare(validate(tiny_digits(tmp_path, precision="bf16")))
    report = estimate(rt, memory_gb=24.0)
    n = sum(p.numel() for p in rt.model_fn().parameters())
    assert report["params"] == n and report["bytes_per_param_training"] == 18
    mem = report["memory_gb"]
    assert mem["weights"] + mem["gradients"] + mem["optimizer_state"] == pytest.approx(16 * n / 1e9)
    assert report["largest_model_params"]["inference_bf16_2_bytes_per_param"] == int(24e9 * 0.9 // 2)
    assert report["largest_micro_batch_predicted"] > 10_000  # a 4 k-parameter CNN on 8x8 images in 24 GB


def test_estimate_cli_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--config", "digits", "--set", "device=cpu", "--memory-gb", "24", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["params"] == 151_306 and report["device_memory_gb"] == 24


def test_benchmark_measures_cpu_matmul() -> None:
    rows = run_benchmark([128, 256], repeats=3)
    cpu = [r for r in rows if r["device"] == "cpu"]
    assert {(r["dtype"], r["n"]) for r in cpu} == {("fp32", 128), ("fp32", 256), ("bf16", 128), ("bf16", 256)}
    assert all(r["tflops"] > 0 and r["ms"] > 0 for r in cpu)
    table = format_table(rows)
    assert "TFLOP/s" in table
    if not torch.cuda.is_available():
        assert "no GPU visible" in table


def test_peak_table_knows_the_l4() -> None:
    assert peak_flops("NVIDIA L4", "bf16") == L4_BF16_PEAK == 121e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert peak_flops("Some Future GPU", "bf16") is None


def test_mnist_demo_data_comes_from_the_installed_wheel() -> None:
    from trainer.demo import mnist, mnist_cnn

    train, held = mnist()
    assert (len(train), len(held)) == (4000, 1000)
    x, y = train.tensors
    assert x.shape[1:] == (1, 28, 28) and float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    assert torch.bincount(torch.cat([y, held.tensors[1]])).tolist() == [500] * 10
    assert mnist_cnn()(x[:2]).shape == (2, 10)
