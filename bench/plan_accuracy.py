"""How right ``python -m trainer plan`` is: predicted against measured peak memory, largest micro-batch
and step time, for several models and micro-batches, and whether each of issue 30's goals is met.

Run on demand (not a test)::

    python bench/plan_accuracy.py                  # on this CPU
    python bench/plan_accuracy.py --device cuda    # on a lent GPU (also the 124M GPT's plan time)
    python bench/plan_accuracy.py --json out.json  # every figure, for the README and the closing note

Predicted: one step traced under fake tensors (trainer.plan.trace_step), with the target's constants.
Measured: the same step on real tensors (trainer.plan.measure_step). On a CPU the measured peak is
the tensors alive before the step (counted exactly) plus the most the CPU allocator held above that
during the step, from its own allocation and free events in torch's profiler: an allocator measure,
independent of the dispatch-level tracking the prediction uses. On a GPU it is the caching
allocator's ``max_memory_allocated`` (compared with the traced peak) and ``max_memory_reserved``
(compared with traced x (1 + allocator overhead)). The target's speed constants are measured here,
now (matmul rate, bandwidth, per-op host time): the time model is what is checked, not the table.
On a CPU the plan times each op alone at its traced shapes, on the values of one real step of two
samples, and the host's cost per op call on that same step: what is checked is how the step's time
grows with the micro-batch from there. ``--cache-dir`` to an empty folder times every op now, under
the same load as the real steps (the op times otherwise come from the configs' cache). Timings on a
machine others share move by 10-20 % between runs: run it more than once and read the spread.

Largest micro-batch: for a memory budget set between two measured peaks, the largest micro-batch the
measured peaks fit against the largest the traced ones do (both found by bisection). Goals: peak
within 10 %, largest micro-batch within one, step time within 25 %.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.config import load
from trainer.plan import MIB, GpuSpec, clock, cpu_spec, find_gpu, load_parts, measure_step, trace_step

#: (config, overrides, micro-batches) per model; the vision config when the tree has it.
MODELS: list[tuple[str, list[str], tuple[int, ...]]] = [
    ("digits", [], (8, 32, 64)),
    ("mnist", [], (8, 32, 128)),
    ("trainer/configs/gpt_tiny.yaml", [], (4, 16, 64)),
    ("trainer/configs/vit.yaml", [], (4, 16, 64)),
]
#: On a GPU also the 124M GPT (too slow for a CPU's real steps).
GPU_MODELS = [("trainer/configs/gpt.yaml", [], (1, 4, 8))]
GOALS = {"peak": 0.10, "largest": 1, "step": 0.25}


def _timed(fn: Any, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def cuda_spec(device: torch.device) -> GpuSpec:
    """The lent GPU as a target, its speed measured now; memory constants from trainer/gpus.yaml
    when the GPU is there (its allocator overhead), else modelled."""
    name = torch.cuda.get_device_name(device)
    try:
        known: GpuSpec | None = find_gpu(name.split()[-1])
    except Exception:
        known = None
    size = 8192
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)

    def sync_mm(x: torch.Tensor) -> None:
        x @ x
        torch.cuda.synchronize(device)

    bf16 = 2 * size**3 / _timed(lambda: sync_mm(a)) / 1e12
    f = a.float()
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32 = 2 * size**3 / _timed(lambda: sync_mm(f)) / 1e12
    big = torch.empty(256 * MIB // 4, device=device)

    def copy() -> None:
        big.mul_(1.0)
        torch.cuda.synchronize(device)

    bandwidth = 2 * big.nbytes / _timed(copy) / 1e9
    tiny = torch.zeros(4, device=device)

    def launches() -> None:
        for _ in range(200):
            tiny.add_(1.0)
        torch.cuda.synchronize(device)

    host = _timed(launches) / 200 * 1e6
    total = torch.cuda.get_device_properties(device).total_memory / MIB
    return GpuSpec(
        name=name, usable_mib=total, context_mib=known.context_mib if known else 500.0,
        allocator_overhead=known.allocator_overhead if known else 0.05,
        tflops={"bf16": bf16, "fp16": bf16, "tf32": tf32, "fp32": tf32}, bandwidth_gbs=bandwidth,
        launch_us=host / 2, host_op_us=host, auto_precision="bf16", aliases=known.aliases if known else (),
        sources={"tflops": "measured: now", "bandwidth_gbs": "measured: now", "host_op_us": "measured: now"},
    )


def largest(fits: Any, cap: int) -> int:
    """The largest size in 1..cap for which ``fits`` holds (monotone), by doubling then bisection."""
    good, bad, size = 0, None, 1
    while bad is None:
        if fits(size):
            good = size
            if size >= cap:
                return good
            size = min(cap, size * 2)
        else:
            bad = size
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    return good


def bench_model(config_name: str, overrides: list[str], sizes: tuple[int, ...], device: torch.device,
                spec: GpuSpec, cache_dir: Path | None = None) -> dict[str, Any]:
    more = [f"cache_dir={cache_dir}"] if cache_dir else []
    config = load(config_name, [*overrides, f"device={device.type}", *more])
    parts = load_parts(config, spec)
    on_gpu = device.type == "cuda"
    rows = []
    measured_cache: dict[int, dict[str, float]] = {}

    def measured(size: int) -> dict[str, float]:
        if size not in measured_cache:
            measured_cache[size] = measure_step(parts, size, device, seconds=0.3)
        return measured_cache[size]

    for size in sizes:
        trace = trace_step(parts, spec, size)
        real = measured(size)
        predicted_peak = trace.peak_bytes / MIB
        if spec.name == "cpu":
            predicted_s = trace.seconds + trace.host_seconds + trace.optimizer_seconds
        else:
            predicted_s = max(trace.seconds, trace.host_seconds) + trace.optimizer_seconds
        row = {
            "micro_batch": size,
            "predicted_peak_mib": predicted_peak,
            "measured_peak_mib": real["peak_mib"],
            "peak_error": predicted_peak / real["peak_mib"] - 1,
            "predicted_step_s": predicted_s,
            "measured_step_s": real["step_s"],
            "step_error": predicted_s / real["step_s"] - 1,
        }
        if on_gpu:
            predicted_reserved = predicted_peak * (1 + spec.allocator_overhead)
            row |= {"predicted_reserved_mib": predicted_reserved,
                    "measured_reserved_mib": real["reserved_mib"],
                    "reserved_error": predicted_reserved / real["reserved_mib"] - 1,
                    "context_mib": real["context_mib"]}
        rows.append(row)
    # Calibrated as `forja plan --calibrate` does: measured over predicted at the smallest size scales
    # the others (what the time model must get right then is how time grows with the batch).
    ratio = rows[0]["measured_step_s"] / rows[0]["predicted_step_s"]
    for row in rows:
        row["calibrated_step_error"] = row["predicted_step_s"] * ratio / row["measured_step_s"] - 1
    # A budget between the two largest sizes' measured peaks: which micro-batch fits it, really and
    # by the trace (the real side uses the same measure as the rows).
    key = "reserved_mib" if on_gpu else "peak_mib"
    budget = (measured(sizes[-2])[key] + measured(sizes[-1])[key]) / 2
    scale = (1 + spec.allocator_overhead) if on_gpu else 1.0
    cap = sizes[-1] * 2
    fits_real = largest(lambda n: measured(n)[key] <= budget, cap)
    fits_traced = largest(lambda n: trace_step(parts, spec, n).peak_bytes * scale / MIB <= budget, cap)
    return {"model": config_name, "rows": rows, "budget_mib": budget, "largest_measured": fits_real,
            "largest_predicted": fits_traced}


def plan_time(device: torch.device) -> float | None:
    """Seconds the 124M GPT's whole plan takes on this machine (the goal: 60 s on the 2-core one)."""
    if not Path("trainer/configs/gpt.yaml").is_file():
        return None
    from trainer.plan import plan

    start = time.perf_counter()
    plan(load("trainer/configs/gpt.yaml", []), "L4")
    return time.perf_counter() - start


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1: steadier timing)")
    parser.add_argument("--no-plan-time", action="store_true", help="skip the 124M GPT's plan timing")
    parser.add_argument("--cache-dir", type=Path,
                        help="where op times are cached (default: each config's cache_dir); an empty "
                             "folder times every op now, under the same load as the real steps")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    spec = cuda_spec(device) if device.type == "cuda" else cpu_spec()
    load_before = os.getloadavg()[0]
    print(f"target {spec.name}: {', '.join(f'{k} {v:.3g}' for k, v in spec.tflops.items())} TFLOPS, "
          f"{spec.bandwidth_gbs:.3g} GB/s, {spec.host_op_us:.2f} us/op host (measured now); "
          f"{args.threads} thread(s), timed in {clock(device.type).__name__}; load {load_before:.1f}")
    results = []
    for name, overrides, sizes in MODELS + (GPU_MODELS if device.type == "cuda" else []):
        if name.endswith(".yaml") and not Path(name).is_file():
            print(f"{name}: not in this tree, skipped")
            continue
        results.append(bench_model(name, overrides, sizes, device, spec, args.cache_dir))
    header = f"{'model':34} {'batch':>5} {'peak pred':>10} {'measured':>10} {'err':>7} " \
             f"{'step pred':>10} {'measured':>10} {'err':>7} {'calib.':>7}"
    print(header)
    peak_errors, step_errors, largest_off, calibrated_errors = [], [], [], []
    for result in results:
        for row in result["rows"]:
            err_key = "reserved_error" if "reserved_error" in row else "peak_error"
            peak_errors.append(abs(row[err_key]))
            step_errors.append(abs(row["step_error"]))
            calibrated_errors.append(abs(row["calibrated_step_error"]))
            print(f"{result['model'][-34:]:34} {row['micro_batch']:>5} {row['predicted_peak_mib']:>8.2f}Mi "
                  f"{row['measured_peak_mib']:>8.2f}Mi {row['peak_error']:>+7.1%} "
                  f"{row['predicted_step_s'] * 1e3:>8.2f}ms {row['measured_step_s'] * 1e3:>8.2f}ms "
                  f"{row['step_error']:>+7.1%} {row['calibrated_step_error']:>+7.1%}"
                  + (f"  reserved {row['predicted_reserved_mib']:.1f}/{row['measured_reserved_mib']:.1f} MiB "
                     f"({row['reserved_error']:+.1%}), context {row['context_mib']:.0f} MiB"
                     if "reserved_error" in row else ""))
        off = abs(result["largest_predicted"] - result["largest_measured"])
        largest_off.append(off)
        print(f"{result['model'][-34:]:34} largest micro-batch in {result['budget_mib']:.1f} MiB: predicted "
              f"{result['largest_predicted']}, measured {result['largest_measured']} (off by {off})")
    seconds = None if args.no_plan_time else plan_time(device)
    summary = {
        "peak_worst_error": max(peak_errors, default=0.0),
        "largest_worst_off": max(largest_off, default=0),
        "step_worst_error": max(step_errors, default=0.0),
        "step_median_error": statistics.median(step_errors) if step_errors else 0.0,
        "calibrated_step_worst_error": max(calibrated_errors, default=0.0),
        "plan_124m_s": seconds,
        "load": [load_before, os.getloadavg()[0]],
    }
    print(f"memory: worst peak error {summary['peak_worst_error']:.1%} (goal 10 %): "
          f"{verdict(summary['peak_worst_error'] <= GOALS['peak'])}")
    print(f"largest micro-batch: worst off by {summary['largest_worst_off']} (goal 1): "
          f"{verdict(summary['largest_worst_off'] <= GOALS['largest'])}")
    print(f"step time: worst error {summary['step_worst_error']:.1%}, "
          f"median {summary['step_median_error']:.1%} "
          f"(goal 25 %): {verdict(summary['step_worst_error'] <= GOALS['step'])}")
    print("step time calibrated at the smallest batch: worst error "
          f"{summary['calibrated_step_worst_error']:.1%} "
          f"(goal 25 %): {verdict(summary['calibrated_step_worst_error'] <= GOALS['step'])}")
    print(f"machine load (1-minute average) {summary['load'][0]:.1f} at the start, "
          f"{summary['load'][1]:.1f} at the end, on {os.cpu_count()} CPUs")
    if seconds is not None:
        print(f"plan of the 124M GPT: {seconds:.1f} s (goal 60 s on the 2-core machine): "
              f"{verdict(seconds <= 60)}")
    if args.json:
        every = {"spec": spec.to_dict(), "models": results, "summary": summary}
        args.json.write_text(json.dumps(every, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
