"""What a run did, in numbers: metrics.jsonl, events.jsonl and a console progress line.

Why JSON lines: one self-contained object per line survives a SIGKILL (at worst the last line is
cut, and readers skip it), can be tailed over SSH, and plotted later by ``report``. GPU numbers
come from nvidia-ml-py when it and a driver are present; CPU utilisation from psutil (read at most
once a second: CPU_WINDOW_S). Both are sampled only at log steps, so the hot loop pays nothing for them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import torch

from trainer import figures, finite
from trainer.gpus import MIB
from trainer.run_folder import write_atomic

log = logging.getLogger(__name__)

METRIC_FIELDS = (
    "step",
    "loss",
    "lr",
    "samples_per_s",
    "step_time_s",
    "data_wait_s",
    "gpu_mem_gb",
    "gpu_util",
    "cpu_util",
    "cost_usd",
    "wall_s",
    "time",
)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Objects from a JSON-lines file; a line cut by a crash is skipped, not fatal."""
    return (obj for _, obj in numbered_jsonl(path))


def numbered_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of a JSON-lines file, for a reader that names the line it refuses."""
    if not path.is_file():
        return
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield number, obj


def logged_any(path: Path) -> bool:
    """Whether a JSON-lines file holds at least one object (a run with metrics to draw)."""
    return any(True for _ in read_jsonl(path))


class JsonLines:
    """Append-only JSON-lines file, flushed per line (a killed run keeps what it logged)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(path, "a", buffering=1)  # noqa: SIM115 - kept open for the whole run

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(finite.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._handle.close()


def truncate_after(path: Path, step: int) -> dict[str, Any] | None:
    """Drop metric lines past ``step`` (work a resumed run redoes); return the last dropped-or-kept line.

    The last line is returned so the caller can carry its wall time and cost forward: lost work was
    still paid for.
    """
    records = list(read_jsonl(path))
    if not records:
        return None
    kept = [r for r in records if int(r.get("step", 0)) <= step]
    write_atomic(path, "".join(finite.dumps(r, separators=(",", ":")) + "\n" for r in kept))
    return records[-1]


class GpuProbe:
    """Utilisation and memory of this process's GPU through NVML, or nothing when unavailable."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._handle: Any = None
        if device.type != "cuda":
            return
        try:
            import pynvml  # nvidia-ml-py: optional

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception as exc:  # no library, no driver, no permission: report nulls, train anyway
            log.info("GPU utilisation unavailable (%s)", exc)

    def utilisation(self) -> float | None:
        if self._handle is None:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        except Exception:
            return None

    def peak_memory_gb(self) -> float | None:
        """Peak memory the caching allocator reserved since the last call (what the GPU really holds)."""
        if self.device.type != "cuda":
            return None
        peak = torch.cuda.max_memory_reserved(self.device) / 1e9
        torch.cuda.reset_peak_memory_stats(self.device)
        return round(peak, 3)


def measured_memory(device: torch.device) -> dict[str, Any]:
    """The allocator's peaks on a GPU (MiB) and its name, for summary.json: `forja plan --calibrate`
    and the estimate before `forja train` read them. Beside GpuProbe because both read the same
    allocator counters (its per-window reset leaves these the peaks since the last logged window,
    which every training step reaches again). Nothing on a CPU: its allocator keeps no peak."""
    if device.type != "cuda":
        return {}
    return {
        "peak_allocated_mib": torch.cuda.max_memory_allocated(device) / MIB,
        "peak_reserved_mib": torch.cuda.max_memory_reserved(device) / MIB,
        "gpu_name": torch.cuda.get_device_name(device),
    }


#: The shortest window the system-wide CPU % is read over. Why: /proc/stat counts 100 ticks a second
#: per core, so a log step every 50 ms (the digits demo on a CPU) saw 10 ticks on 2 cores, a figure
#: in steps of 10 %; and the read took 130 us in the loop, half of a log step's own work.
CPU_WINDOW_S = 1.0
_cpu_read_at: float | None = None  # when psutil was last read (its baseline for the next figure)
_cpu_figure: float | None = None  # the figure that read gave (None after the first read: no window yet)


def cpu_utilisation() -> float:
    """System-wide CPU % over the latest window of at least CPU_WINDOW_S (DataLoader workers are other
    processes). A call inside a window gives that window's figure again. The first call only starts
    the first window (its figure means nothing, as psutil's own first call): the loop makes it at its
    start."""
    global _cpu_read_at, _cpu_figure
    now = time.monotonic()
    if _cpu_figure is not None and _cpu_read_at is not None and now - _cpu_read_at < CPU_WINDOW_S:
        return _cpu_figure
    figure = float(psutil.cpu_percent(interval=None))
    _cpu_figure = figure if _cpu_read_at is not None else None
    _cpu_read_at = now
    return figure


def cost_usd(wall_s: float, price_per_hour: float) -> float:
    """The run's cost so far as the trainer can count it: forja's formula (forja/cost/run.py: the VMs'
    hourly rate over the time up for the run) with what the VM knows, its wall time over all sessions.

    It leaves out what only the controller sees: the setup before the trainer started, the time after
    it until forja fetched the results, and the disk. So it is the live "cost so far" while the run
    goes on (metrics.jsonl, the live endpoint, `forja top`); once the run has ended forja settles the
    run's cost in its history, and every view shows that figure, this one as "of which training"."""
    return wall_s / 3600.0 * price_per_hour


def progress_line(record: dict[str, Any], total_steps: int, eta_s: float | None) -> str:
    """``step 120/400 | loss 0.3120 | lr 1.80e-03 | 11,234 samples/s | ... | 1.2¢ | eta 1m 10s`` for a
    person to read, figures as `trainer.figures` (and so `forja`) shows them; metrics.jsonl keeps
    every digit."""
    parts = [
        f"step {record['step']}/{total_steps}",
        f"loss {figures.loss(record['loss'])}",
        f"lr {record['lr']:.2e}",
        figures.per_second(record["samples_per_s"], "samples"),
        *([figures.per_second(record["tokens_per_s"], "tokens")] if record.get("tokens_per_s") else []),
        *([mfu_text] if (mfu_text := mfu_words(record)) else []),
        f"data wait {100.0 * record['data_wait_s'] / max(record['step_time_s'], 1e-9):.0f}%",
    ]
    if record.get("gpu_mem_gb") is not None:
        util = record.get("gpu_util")
        parts.append(f"gpu {record['gpu_mem_gb']:.1f} GB" + (f" {util:.0f}%" if util is not None else ""))
    parts.append(f"cpu {record['cpu_util']:.0f}%")
    parts.append(figures.money(record["cost_usd"]))
    if eta_s is not None:
        parts.append(f"eta {figures.duration(eta_s)}")
    return " | ".join(parts)


def mfu_words(record: dict[str, Any]) -> str:
    """``MFU 34% (61% of measured)``: against the datasheet peak and the measured matmul ceiling, as
    known (trainer.mfu); empty when neither is."""
    peak, ceiling = record.get("mfu"), record.get("mfu_ceiling")
    if peak is not None and ceiling is not None:
        return f"MFU {100 * peak:.0f}% ({100 * ceiling:.0f}% of measured)"
    if ceiling is not None:
        return f"MFU {100 * ceiling:.0f}% of measured"
    return f"MFU {100 * peak:.0f}%" if peak is not None else ""


def process_started_monotonic() -> float:
    """When this process started, on the ``time.monotonic`` scale (interpreter start-up and imports
    are paid for too: measured, a 5.2 s digits process spent only 1.4 s in the training loop)."""
    age = max(0.0, time.time() - psutil.Process().create_time())
    return time.monotonic() - age


class Clock:
    """Monotonic seconds of this session, plus wall time carried over from earlier sessions.

    ``start`` is when the session began paying (``train()`` was called, or the process started when
    run from the command line), so cost covers setup, evaluation and the final save, not only the loop.
    """

    def __init__(self, carried_s: float = 0.0, start: float | None = None) -> None:
        self.start = time.monotonic() if start is None else start
        self.carried_s = carried_s

    def session_s(self) -> float:
        return time.monotonic() - self.start

    def total_s(self) -> float:
        return self.carried_s + self.session_s()
