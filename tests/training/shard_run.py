"""``python shard_run.py CONFIG.json [STOP_AT]``: train, SIGTERM itself after step STOP_AT, report memory.

The last line printed is JSON: the run's status and the peak resident memory (the kernel's own
high-water marks) of this process and of its DataLoader workers, in MiB, plus this process's
resident memory just before training (what torch and the trainer cost by themselves). This
process's peak is ``VmHWM`` of its own address space: ``ru_maxrss`` would also carry the peak of
the process it was forked from before ``exec`` (here pytest, with its own tensors). A worker's
``ru_maxrss`` starts at what it shares with this process when forked: counted in full, as the kernel
counts it.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys

import psutil

from trainer.config import validate
from trainer.train import train


def own_peak_mib() -> float:
    """VmHWM: the peak resident set of this address space (since exec), from /proc."""
    with open("/proc/self/status") as status:
        line = next(row for row in status if row.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def main() -> int:
    with open(sys.argv[1]) as handle:
        config = validate(json.load(handle))
    stop_at = int(sys.argv[2]) if len(sys.argv) > 2 else None

    def hook(step: int) -> None:
        if step == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)

    before = psutil.Process().memory_info().rss / 2**20
    result = train(config, on_step=hook)
    print(
        json.dumps(
            {
                "status": result.status,
                "steps": result.summary.get("steps"),
                "rss_before_mib": before,
                "peak_mib": own_peak_mib(),
                "peak_workers_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
