"""SIGTERM to checkpoint saved, with and without a running evaluation, for a 50M-parameter model.

Run on demand (not a test): ``python bench/preempt_bench.py [--repeats 3] [--threads 2]
[--device cpu|cuda] [--eval-samples 20000]``.
Each run starts ``python -m trainer train`` on ``bench/preempt_models.py``'s MLP (50.4M parameters;
a checkpoint with AdamW state is about 605 MB), waits until it trains (or until an evaluation of
20,000 samples is under way), sends SIGTERM and reports:

- ``saved``: the trainer's own time from the signal to the checkpoint renamed into place and its folder
  fsynced (``seconds_to_save`` of the ``preempt`` event);
- ``on disk``: the same seen from outside (the new ``ckpt-*.pt`` appears), polled every 5 ms;
- ``exit``: the signal to the process's exit (summary written, interpreter torn down);
- ``step`` and ``write``: what ``saved`` is made of: the median training step (a signal waits for the
  step under way to end) and the checkpoint write alone (``write_s`` of the ``checkpoint`` event).

Goal (issue 12): saved <= 1 s in both cases. Before, a SIGTERM during evaluation waited for the
evaluation to end (4.25 s with 100k samples in the drill).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

from trainer import run_folder  # noqa: E402


def run_once(folder: Path, during_eval: bool, threads: int, device: str, evals: int) -> dict[str, float]:
    """One trainer process, one SIGTERM; the timings of the save it triggers."""
    marker = folder / "eval-started"
    out = folder / "run"
    config = {
        "model": "preempt_models:mlp50m",
        "data": "preempt_models:synthetic",
        "data_args": {"marker": str(marker), "evaluate": evals},
        "loss": "torch.nn.functional:cross_entropy",
        "steps": 100_000,
        "batch_size": 16,
        "precision": "fp32",
        "device": device,
        "eval_every_steps": 3 if during_eval else 0,
        "eval_batch_size": 64,
        "log_every_steps": 1,
        "checkpoint_every_s": 0,
        "keep_checkpoints": 1,
        "render_plots": False,
        "out_dir": str(out),
        "cache_dir": str(folder / "cache"),
    }
    (folder / "run.yaml").write_text(json.dumps(config))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(BENCH), env.get("PYTHONPATH", "")])
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "train", "--config", str(folder / "run.yaml")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = out / run_folder.METRICS
    deadline = time.monotonic() + 600
    while True:  # wait until it trains (or evaluates)
        if proc.poll() is not None:
            raise RuntimeError(f"the trainer exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        if during_eval and marker.exists():
            time.sleep(0.5)  # well inside the evaluation
            break
        if not during_eval and metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the trainer did not reach the point to interrupt")
        time.sleep(0.01)
    ckpts = out / run_folder.CHECKPOINTS_DIR
    before = {p.name for p in ckpts.glob("ckpt-*.pt")} if ckpts.exists() else set()
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    on_disk = None
    while proc.poll() is None:
        if on_disk is None and ckpts.exists() and {p.name for p in ckpts.glob("ckpt-*.pt")} - before:
            on_disk = time.monotonic() - sent
        time.sleep(0.005)
    exited = time.monotonic() - sent
    proc.stderr.read()
    if proc.returncode != 3:
        raise RuntimeError(f"expected exit 3 (preempted), got {proc.returncode}")
    events = [json.loads(line) for line in (out / run_folder.EVENTS).read_text().splitlines()]
    preempt = next(e for e in events if e["event"] == "preempt")
    abandoned = any(e["event"] == "eval_abandoned" for e in events)
    if during_eval and not abandoned:
        raise RuntimeError("the evaluation was not under way when the signal came")
    size = max(p.stat().st_size for p in ckpts.glob("ckpt-*.pt"))
    write = next(e["write_s"] for e in events if e["event"] == "checkpoint" and e["reason"] == "stop")
    steps = sorted(float(r["step_time_s"]) for r in map(json.loads, metrics.read_text().splitlines()))
    return {
        "step": steps[len(steps) // 2],
        "write": float(write),
        "saved": float(preempt["seconds_to_save"]),
        "on_disk": on_disk if on_disk is not None else float("nan"),
        "exit": exited,
        "mb": size / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads of the trainer")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--eval-samples", type=int, default=20_000, help="size of the eval set")
    args = parser.parse_args()
    rows = []
    for during_eval in (False, True):
        for rep in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="preempt-bench-") as tmp:
                result = run_once(Path(tmp), during_eval, args.threads, args.device, args.eval_samples)
            rows.append((during_eval, rep + 1, result))
            print(f"  {'eval' if during_eval else 'train'} #{rep + 1}: {result}", file=sys.stderr, flush=True)
    print(
        f"\nSIGTERM -> checkpoint saved, 50.4M-parameter MLP on {args.device}, fp32 + AdamW state, "
        f"{args.threads} threads (goal: saved <= 1 s)\n"
    )
    head = ("signal arrives during", "run", "saved s", "on disk s", "exit s", "step s", "write s", "ckpt MB")
    print(f"{head[0]:<24}{head[1]:>4}" + "".join(f"{h:>10}" for h in head[2:]))
    for during_eval, rep, r in rows:
        where = f"evaluation ({args.eval_samples // 1000}k)" if during_eval else "training step"
        cells = (r["saved"], r["on_disk"], r["exit"], r["step"], r["write"])
        print(f"{where:<24}{rep:>4}" + "".join(f"{c:>10.3f}" for c in cells) + f"{r['mb']:>10.0f}")
    for during_eval in (False, True):
        saved = [r["saved"] for e, _, r in rows if e == during_eval]
        where = "evaluation" if during_eval else "training step"
        print(f"median, {where}: saved {statistics.median(saved):.3f} s (max {max(saved):.3f} s)")


if __name__ == "__main__":
    main()
