"""What the trainer's features cost: a bare hand-written PyTorch loop vs ``trainer.train``, interleaved.

Run on demand (not a test): ``python bench/trainer_bench.py [--data digits|mnist] [--rounds 7]``.
Both variants train the same model on the same data with the same batch, precision and steps, in
one process, alternating A/B then B/A so drift on a shared machine hits both alike; throughput is
timed between a warm-up step and the last step of each block (setup, final checkpoint and
evaluation are outside the window). The trainer runs with everything on: resumable sampler and
DataLoader, AMP, LR schedule, gradient clipping, per-interval metrics and progress line, the
checkpoint timer and the SIGTERM agreement. Goal: under 3% slower on CPU. With a GPU it also
prints MFU (FlopCounterMode FLOPs x samples/s over the peak; the L4's 121 TFLOPS bf16 is the
reference).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.config import validate
from trainer.hardware import L4_BF16_PEAK, peak_flops
from trainer.precision import make_amp, resolve
from trainer.train import train

DATA = {
    "digits": ("trainer.demo:digits_cnn", "trainer.demo:digits"),
    "mnist": ("trainer.demo:mnist_cnn", "trainer.demo:mnist"),
}


def bare_loop(
    model_fn, train_data, batch: int, steps: int, warm: int, precision: str, device: str, seed: int
) -> list[float]:
    """The loop a person writes by hand: shuffled index batches, autocast, AdamW. Returns step times."""
    torch.manual_seed(seed)
    model = model_fn().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    amp = make_amp(precision, device)
    x, y = train_data.tensors
    order = torch.randperm(len(x))
    per_epoch = len(x) // batch
    marks: list[float] = []
    for step in range(steps):
        if step >= warm:
            if device == "cuda":
                torch.cuda.synchronize()
            marks.append(time.perf_counter())
        index = order[(step % per_epoch) * batch : (step % per_epoch + 1) * batch]
        inputs, targets = x[index].to(device, non_blocking=True), y[index].to(device, non_blocking=True)
        with amp.autocast():
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        amp.scaler.scale(loss).backward()
        amp.scaler.step(optimizer)
        amp.scaler.update()
        optimizer.zero_grad(set_to_none=True)
    loss.item()  # the loop's only sync, as a real loop would report its loss
    marks.append(time.perf_counter())
    return [b - a for a, b in itertools.pairwise(marks)]


def trainer_block(raw: dict, out: Path, steps: int, warm: int, device: str) -> list[float]:
    """``trainer.train`` with every feature on; the times of its steps after ``warm``.

    The last step is left out: on_step(steps) comes after the final checkpoint and evaluation.
    """
    marks: list[float] = []

    def on_step(step: int) -> None:
        if warm <= step < steps:
            if device == "cuda":
                torch.cuda.synchronize()
            marks.append(time.perf_counter())

    with contextlib.redirect_stdout(io.StringIO()):  # the progress line is still formatted, just not shown
        train(validate({**raw, "steps": steps, "out_dir": str(out)}), on_step=on_step)
    return [b - a for a, b in itertools.pairwise(marks)]


def throughput(step_times: list[float], batch: int, filtered: bool) -> float:
    """samples/s over a block; ``filtered`` drops steps over 3x the block's median (another tenant took
    the core). The trainer's own periodic work (log lines, a new epoch's iterator) stays far below that."""
    if filtered:
        limit = 3 * statistics.median(step_times)
        step_times = [t for t in step_times if t <= limit]
    return len(step_times) * batch / sum(step_times)


def flops_per_sample(model_fn, train_data, batch: int, precision: str, device: str) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    model = model_fn().to(device)
    x, y = train_data.tensors
    counter = FlopCounterMode(display=False)
    with counter, make_amp(precision, device).autocast():
        torch.nn.functional.cross_entropy(model(x[:batch].to(device)), y[:batch].to(device)).backward()
    return counter.get_total_flops() / batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=sorted(DATA), default="digits")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import importlib

    model_path, data_path = DATA[args.data]
    module, _, name = model_path.partition(":")
    model_fn = getattr(importlib.import_module(module), name)
    module, _, name = data_path.partition(":")
    train_data, _ = getattr(importlib.import_module(module), name)()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = resolve("auto", device)
    raw = {
        "model": model_path,
        "data": data_path,
        "batch_size": args.batch,
        "precision": precision,
        "device": device,
        "log_every_steps": 10,
        "checkpoint_every_s": 300,
        "grad_clip": 1.0,
        "lr_schedule": {"warmup_steps": 5},
        "keep_checkpoints": 1,
        "cache_dir": tempfile.gettempdir(),
    }

    raw_ratios, filtered_ratios, bare, full = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        trainer_block(
            raw, Path(tmp) / "warmup", args.warm + 5, args.warm, device
        )  # imports, first-call costs
        bare_loop(model_fn, train_data, args.batch, args.warm + 5, args.warm, precision, device, 0)
        for r in range(args.rounds):
            # A-B-B-A within a round cancels a linear drift of the machine's speed (other tenants)
            got: dict[str, list[list[float]]] = {"bare": [], "trainer": []}
            for i, variant in enumerate(("bare", "trainer", "trainer", "bare")):
                if variant == "bare":
                    times = bare_loop(
                        model_fn, train_data, args.batch, args.steps, args.warm, precision, device, r
                    )
                else:
                    times = trainer_block(raw, Path(tmp) / f"r{r}-{i}", args.steps, args.warm, device)
                got[variant].append(times)
            for ratios, filtered in ((raw_ratios, False), (filtered_ratios, True)):
                speed = {v: statistics.mean(throughput(t, args.batch, filtered) for t in got[v]) for v in got}
                ratios.append(speed["trainer"] / speed["bare"])
            bare += [throughput(t, args.batch, True) for t in got["bare"]]
            full += [throughput(t, args.batch, True) for t in got["trainer"]]

    med_bare, med_full = statistics.median(bare), statistics.median(full)
    print(
        f"\ntrainer overhead benchmark: {args.data}, batch {args.batch}, {precision} on {device}, "
        f"{args.steps} steps per block ({args.warm} warm-up), {args.rounds} A-B-B-A rounds, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"{'variant (stall-filtered)':<28} {'median samples/s':>17} {'min':>9} {'max':>9}")
    print(f"{'bare PyTorch loop':<28} {med_bare:>17,.0f} {min(bare):>9,.0f} {max(bare):>9,.0f}")
    print(f"{'trainer, all features on':<28} {med_full:>17,.0f} {min(full):>9,.0f} {max(full):>9,.0f}")
    for label, ratios in (("ratio, all steps", raw_ratios), ("ratio, stall-filtered", filtered_ratios)):
        print(
            f"{label:<28} {statistics.median(ratios):>17.3f} {min(ratios):>9.3f} {max(ratios):>9.3f}"
            "   (median, min, max of per-round ratios)"
        )
    cost = 1.0 - statistics.median(filtered_ratios)
    print(f"trainer cost: {100 * cost:.1f}% (goal < 3% on CPU): {'met' if cost < 0.03 else 'NOT met'}")
    fps = flops_per_sample(model_fn, train_data, args.batch, precision, device)
    achieved = fps * med_full
    print(
        f"model FLOPs per training sample (FlopCounterMode): {fps / 1e6:.1f} MFLOP; "
        f"achieved {achieved / 1e9:.1f} GFLOP/s"
    )
    if device == "cuda":
        name = torch.cuda.get_device_name()
        own = peak_flops(name, precision)
        print(
            f"MFU vs L4 bf16 peak (121 TFLOPS): {100 * achieved / L4_BF16_PEAK:.2f}%"
            + (f"; vs this {name}'s {precision} peak: {100 * achieved / own:.2f}%" if own else "")
        )
    else:
        print("MFU: n/a (no GPU); the L4 reference peak is 121 TFLOPS bf16")


if __name__ == "__main__":
    main()
