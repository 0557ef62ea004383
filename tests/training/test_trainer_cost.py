"""Cost counts the whole run: start-up, data loading, evaluation, not only the training loop."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_helpers import subprocess_env, tiny_digits

from trainer import run_folder
from trainer.config import validate
from trainer.metrics import read_jsonl
from trainer.train import train


def test_the_summary_pays_for_setup_and_the_final_evaluation(tmp_path: Path) -> None:
    raw = tiny_digits(
        tmp_path,
        steps=10,
        price_per_hour=3.6,
        data="robustness_fakes:digits_big_eval",
        data_args={"times": 60},
    )
    started = time.monotonic()
    result = train(validate(raw))
    elapsed = time.monotonic() - started
    s = result.summary
    loop_s = s["steps"] * s["global_batch"] / s["samples_per_s"]
    last_logged = list(read_jsonl(Path(raw["out_dir"]) / run_folder.METRICS))[-1]["wall_s"]
    print(f"\ntrain() took {elapsed:.2f} s; summary wall {s['wall_s']:.2f} s; loop {loop_s:.2f} s")
    assert s["wall_s"] <= elapsed
    assert s["wall_s"] > last_logged, "the final evaluation (21,540 samples) is paid for"
    assert s["wall_s"] >= 0.5 * elapsed  # the rest: writing summary.json (before: the loop alone, 2%)
    assert s["cost_usd"] == pytest.approx(s["wall_s"] / 1000)


def test_the_command_line_counts_from_the_process_start(tmp_path: Path) -> None:
    raw = tiny_digits(tmp_path, steps=5)
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(raw))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "train", "--config", str(config)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    wall = json.loads((Path(raw["out_dir"]) / run_folder.SUMMARY).read_text())["wall_s"]
    first = next(iter(read_jsonl(Path(raw["out_dir"]) / run_folder.METRICS)))
    print(f"\nprocess {elapsed:.2f} s; summary wall {wall:.2f} s; wall at step 1 {first['wall_s']:.2f} s")
    assert first["wall_s"] > 0.3 * elapsed, "start-up (importing torch, loading data) is paid for"
    assert wall >= 0.6 * elapsed  # the rest: interpreter exit, which the trainer cannot time
