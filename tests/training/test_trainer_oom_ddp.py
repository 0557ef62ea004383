"""An OOM under DDP: the failing rank records the lowered micro-batch and fails; the restart uses it.

One rank cannot retry alone (its peer waits in the gradient all-reduce), so the run goes through a
restart, as systemd would do it: two torchrun launches of two gloo processes on the same folder.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from robustness_fakes import oom_above
from test_trainer_ddp import torchrun, write_config
from torch import nn
from trainer_helpers import subprocess_env, tiny_digits

from trainer import exit_codes, run_folder
from trainer.metrics import read_jsonl

pytestmark = pytest.mark.slow  # two or three torchrun launches: about 30 s on an idle 2-core machine


def oom_on_rank(rank: int, limit: int, after: int) -> nn.Module:
    """The user's model: on rank ``rank`` only, after ``after`` passes, room for ``limit`` samples."""
    mine = os.environ.get("RANK", "0") == str(rank)
    return oom_above(limit if mine else 1_000_000, after)


def launch(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(torchrun("train", "--config", str(config)), env=subprocess_env(),
                          capture_output=True, text=True, timeout=240)  # fmt: skip


def test_an_oom_on_one_rank_is_recorded_and_the_restart_halves_the_micro_batch(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # rank 1 fits 8 samples after 12 passes: step 12 (0-based) OOMs at 16 per rank; saved at 5 and 10
    raw = tiny_digits(tmp_path, model="test_trainer_oom_ddp:oom_on_rank",
                      model_args={"rank": 1, "limit": 8, "after": 12}, steps=20, batch_size=16,
                      effective_batch_size=32, checkpoint_every_steps=5, out_dir=str(run))  # fmt: skip
    config = write_config(tmp_path / "run.yaml", raw)

    first = launch(config)
    log = first.stdout + first.stderr
    assert first.returncode != 0, log
    assert "out of memory on rank 1 at step 12 with micro-batch 16" in log
    record = json.loads((run / run_folder.OOM_RECORD).read_text())
    assert (record["rank"], record["oom_micro_batch"], record["global_batch"]) == (1, 8, 32), record
    assert record["oom_fallbacks"] == [{"step": 12, "from": 16, "to": 8}]
    assert not list(run.glob(f"{run_folder.OOM_RECORD}{run_folder.TMP_MARK}*")), "written whole, then renamed"
    assert json.loads((run / run_folder.SUMMARY).read_text())["status"] == "failed"  # rank 0 saw its peer go

    second = launch(config)  # the restart: same config, same folder
    assert second.returncode == 0, second.stdout + second.stderr
    summary = json.loads((run / run_folder.SUMMARY).read_text())
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert (summary["world_size"], summary["micro_batch"], summary["accum_steps"]) == (2, 8, 2)
    assert summary["global_batch"] == 32, "the global batch is kept through accumulation"
    assert summary["resumed_from_step"] == 10 and summary["lost_steps"] == 2
    assert summary["oom_fallbacks"] == [{"step": 12, "from": 16, "to": 8}]
    ooms = [e for e in read_jsonl(run / run_folder.EVENTS) if e["event"] == "oom"]
    assert [(e["from_micro_batch"], e["micro_batch"], e["accum"], e["rank"], e["failed_at_step"])
            for e in ooms] == [(16, 8, 2, 1, 12)]  # fmt: skip
    steps = [r["step"] for r in read_jsonl(run / run_folder.METRICS)]
    assert steps == list(range(1, 21)), "the steps after the checkpoint are redone once"


def test_an_oom_at_micro_batch_1_under_ddp_stops_without_a_restart(tmp_path: Path) -> None:
    run = tmp_path / "run"
    raw = tiny_digits(tmp_path, model="test_trainer_oom_ddp:oom_on_rank",
                      model_args={"rank": 1, "limit": 0, "after": 3}, steps=10, batch_size=1,
                      effective_batch_size=2, out_dir=str(run))  # fmt: skip
    done = launch(write_config(tmp_path / "run.yaml", raw))
    log = done.stdout + done.stderr
    assert done.returncode != 0, log
    assert "out of memory at step 3 with micro-batch 1" in log
    # the failing rank's own code (the launcher passes the first failing worker's code to systemd)
    assert f"[exit {exit_codes.USER_ERROR}:" in log and exit_codes.USER_ERROR in exit_codes.NO_RESTART
    assert not (run / run_folder.OOM_RECORD).exists(), "nothing for a restart to lower"
