"""A sharded dataset larger than the memory a run may use trains, is preempted mid-epoch, and resumes
at the exact sample.

The bound is the kernel's own peak resident set (``ru_maxrss``) of the training process and of
each of its DataLoader workers, read by the child itself (tests/training/shard_run.py). Why not an
rlimit: RLIMIT_AS counts torch's virtual reservations (gigabytes, never touched), and Linux does not
enforce RLIMIT_RSS; a cgroup limit needs privileges a test run may not have. The peak RSS is what
such a limit would act on, and the dataset's decoded size is checked to exceed the bound.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from shard_models import seen
from trainer_helpers import HERE, subprocess_env

from trainer.shard_writer import write_shards

SAMPLE_BYTES = 64 * 1024
SAMPLES = 16 * 1024  # 1 GiB of pixels
LIMIT_MIB = 512  # for the trainer process and for each worker, torch's own ~250 MiB included
BATCH = 32  # 512 steps per epoch


@pytest.fixture(scope="module")
def big_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 shards of 128 MiB in row groups of 8 MiB, incompressible (stored without zstd: it cannot pay)."""
    out = tmp_path_factory.mktemp("big-shards")
    rng = np.random.default_rng(0)

    def chunks() -> Any:
        for first in range(0, SAMPLES, 512):
            pixels = np.frombuffer(rng.bytes(512 * SAMPLE_BYTES), np.uint8).reshape(512, SAMPLE_BYTES)
            yield {"image": pixels, "label": rng.integers(0, 10, 512), "id": np.arange(first, first + 512)}

    write_shards(chunks(), out, "train", shard_mb=128, row_group_mb=8, compression="none")
    return out


def decoded_mib(folder: Path) -> float:
    total = 0
    for shard in folder.rglob("*.parquet"):
        meta = pq.read_metadata(shard)
        total += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    return total / 2**20


def run(tmp_path: Path, shards: Path, name: str, stop_at: int | None = None) -> dict[str, Any]:
    config = {
        "model": "shard_models:IdRecorder",
        "model_args": {"path": str(tmp_path / f"{name}.ids")},
        "data": "trainer.shards:dataset",
        "data_args": {"source": str(shards), "window_mb": 4},
        "steps": 600,  # past the end of the first epoch (512 steps)
        "batch_size": BATCH,
        "lr": 0.003,
        "precision": "fp32",
        "log_every_steps": 100,
        "checkpoint_every_s": 0,
        "device": "cpu",
        "num_workers": 2,
        "out_dir": str(tmp_path / name),
        "render_plots": False,
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    args = [sys.executable, str(HERE / "shard_run.py"), str(path), *([str(stop_at)] if stop_at else [])]
    done = subprocess.run(args, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(name, report)  # the numbers, for the record (pytest -s)
    return report


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_a_dataset_larger_than_memory_trains_and_resumes_at_the_exact_sample(
    tmp_path: Path, big_shards: Path
) -> None:
    assert decoded_mib(big_shards) > 2 * LIMIT_MIB

    straight = run(tmp_path, big_shards, "straight")
    stopped = run(tmp_path, big_shards, "stopped", stop_at=200)
    resumed = run(tmp_path, big_shards, "stopped")
    assert (straight["status"], stopped["status"], resumed["status"]) == (
        "completed",
        "preempted",
        "completed",
    )
    assert stopped["steps"] == 201 and resumed["steps"] == 600

    for report in (straight, stopped, resumed):
        assert report["peak_mib"] < LIMIT_MIB and report["peak_workers_mib"] < LIMIT_MIB

    order = seen(str(tmp_path / "straight.ids"))
    assert len(order) == 600 and seen(str(tmp_path / "stopped.ids")) == order
    first_epoch = [i for batch in order[:512] for i in batch]
    assert len(set(first_epoch)) == len(first_epoch) == 512 * BATCH  # all 16384 samples, once each
