"""A SIGTERM during a long evaluation abandons it and saves at once (it used to wait: 4.25 s at 100k)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainer_helpers import subprocess_env, tiny_digits

from trainer import exit_codes, run_folder
from trainer.checkpoint import CheckpointManager
from trainer.metrics import read_jsonl


def test_sigterm_during_evaluation_abandons_it_and_saves(tmp_path: Path) -> None:
    marker = tmp_path / "eval-started"
    raw = tiny_digits(
        tmp_path,
        steps=1000,
        eval_every_steps=5,
        eval_batch_size=512,
        data="robustness_fakes:digits_big_eval",
        data_args={"times": 300, "marker": str(marker)},  # 107,700 eval samples, built one by one
    )
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(raw))
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "train", "--config", str(config)],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the evaluation never started"
        time.sleep(0.01)
    time.sleep(0.2)  # well inside the evaluation
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    assert proc.returncode == exit_codes.PREEMPTED, out

    run = Path(raw["out_dir"])
    assert [p.name for p in CheckpointManager(run / run_folder.CHECKPOINTS_DIR).list()] == ["ckpt-5.pt"]
    events = list(read_jsonl(run / run_folder.EVENTS))
    kinds = [e["event"] for e in events]
    assert "eval_abandoned" in kinds and "eval" not in kinds, kinds
    preempt = next(e for e in events if e["event"] == "preempt")
    assert preempt["signal"] == "SIGTERM" and preempt["saved_step"] == 5
    print(
        f"\nSIGTERM during evaluation: saved {preempt['seconds_to_save']:.3f} s after the signal, "
        f"exit after {took:.2f} s"
    )
