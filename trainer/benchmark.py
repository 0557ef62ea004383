"""``benchmark``: matrix-multiply throughput on the CPU and the GPU, and the fraction of peak reached.

Why: the user's first lesson on a GPU VM was that a wrong setup (a CPU-only wheel, fp32 where bf16
was possible, a missing driver) silently trains on the CPU or at a fraction of the card's speed.
One square matmul per size and dtype, timed after a warm-up with the GPU synchronised, shows the
achieved TFLOP/s next to the datasheet peak (L4: 121 TFLOPS dense bf16).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from trainer.hardware import peak_flops

DTYPE_NAMES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def time_matmul(n: int, dtype: torch.dtype, device: str, repeats: int, fastest: bool = False) -> float:
    """Median (``fastest``: least) seconds for one n x n @ n x n product."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    gpu = device.startswith("cuda")
    for _ in range(2):  # warm-up: kernels chosen, memory allocated, CPU threads woken
        a @ b
    times = []
    for _ in range(repeats):
        if gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times) if fastest else sorted(times)[len(times) // 2]


#: Square size of the ceiling probe: large enough to reach a GPU's sustained matmul rate (8192: about
#: 1.1 TFLOP a product, 20 ms on an L4), small enough to cost a CPU run about 0.1 s (1024).
CEILING_N = {"cuda": 8192, "cpu": 1024}


def matmul_ceiling(device: torch.device, precision: str, repeats: int = 5) -> float:
    """Measured FLOP/s of one large square matmul in the run's dtype: the ceiling MFU is also read against.

    Why beside the datasheet: an L4 is power-capped at 72 W and reaches about 55-71 of its 121 TFLOPS
    bf16 in torch's own matmul, so "30 % of peak" and "60 % of what this card really does" are both
    true and both needed. A short probe at a run's start sees a cool card at boost clock, so it is
    an upper bound of the sustained rate. fp32 keeps the run's TF32 setting (the trainer's choice).
    """
    kind = device.type
    n = CEILING_N.get(kind, 1024)
    dtype = DTYPE_NAMES.get(precision, torch.float32)
    seconds = time_matmul(n, dtype, str(device), repeats, fastest=True)  # a ceiling: the best it did
    if kind == "cuda":
        torch.cuda.empty_cache()  # the probe's 400 MB go back before the model's first step
    return 2.0 * n**3 / seconds


def run_benchmark(sizes: list[int], repeats: int = 5) -> list[dict[str, Any]]:
    targets: list[tuple[str, str]] = [("cpu", "fp32"), ("cpu", "bf16")]
    if torch.cuda.is_available():
        targets += [("cuda", "fp32"), ("cuda", "tf32"), ("cuda", "bf16"), ("cuda", "fp16")]
    rows = []
    for device, name in targets:
        label = torch.cuda.get_device_name() if device == "cuda" else "cpu"
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        for n in sizes:
            seconds = time_matmul(n, DTYPE_NAMES[name], device, repeats)
            flops = 2.0 * n**3 / seconds
            peak = peak_flops(label, name) if device == "cuda" else None
            rows.append(
                {
                    "device": label,
                    "dtype": name,
                    "n": n,
                    "ms": seconds * 1e3,
                    "tflops": flops / 1e12,
                    "peak_tflops": peak / 1e12 if peak else None,
                    "fraction_of_peak": flops / peak if peak else None,
                }
            )
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'device':<24} {'dtype':<5} {'n':>6} {'ms':>9} {'TFLOP/s':>9} {'peak':>7} {'of peak':>8}"]
    for r in rows:
        peak = f"{r['peak_tflops']:.0f}" if r["peak_tflops"] else "-"
        frac = f"{100 * r['fraction_of_peak']:.0f}%" if r["fraction_of_peak"] else "-"
        lines.append(
            f"{r['device'][:24]:<24} {r['dtype']:<5} {r['n']:>6} {r['ms']:>9.2f} {r['tflops']:>9.3f} "
            f"{peak:>7} {frac:>8}"
        )
    cpu = [r for r in rows if r["device"] == "cpu"]
    gpu = [r for r in rows if r["device"] != "cpu"]
    if cpu and gpu:
        best_cpu, best_gpu = max(r["tflops"] for r in cpu), max(r["tflops"] for r in gpu)
        lines.append(f"GPU / CPU best throughput: {best_gpu / best_cpu:.0f}x")
    elif not gpu:
        lines.append("no GPU visible: is the driver loaded and is this a CUDA build of PyTorch?")
    return "\n".join(lines)
