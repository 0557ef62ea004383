"""The training loop's state, in small typed objects: what a session builds once, what the loop moves.

Why: the loop was one 354-line function whose closures read locals that were rebound later (the
checkpoint writer read ``clock``, assigned 24 lines after it). Now each part of a step is a named
function in :mod:`trainer.train` that takes these objects explicitly. ``Parts`` (frozen) is built by
the setup and never rebound; everything a step changes lives in ``LoopState``; so a reader sees who
writes what, and the loop itself fits on one screen.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer import metrics
from trainer.checkpoint import CheckpointManager
from trainer.config import TrainConfig
from trainer.data import BatchPlan, InMemoryBatches, ResumableSampler, StreamPosition
from trainer.divergence import Judge
from trainer.live import LiveMetrics
from trainer.mfu import Utilisation
from trainer.mirror import CheckpointMirror
from trainer.optim import Schedule
from trainer.precision import Amp
from trainer.runtime import Runtime


@dataclass(frozen=True)
class Feed:
    """The batch plan and the loader that follows it; an OOM replaces it whole with a smaller micro-batch."""

    plan: BatchPlan
    sampler: ResumableSampler | StreamPosition
    loader: DataLoader | InMemoryBatches  # InMemoryBatches: a TensorDataset read by this process
    generator: torch.Generator  # the loader's own: re-seeded per epoch, so resume draws nothing global


@dataclass(frozen=True)
class Net:
    """The model being trained and what updates it."""

    raw_model: nn.Module  # the user's module: parameters and state_dict (checkpoints hold these)
    model: nn.Module  # what runs forward: raw_model, compiled and/or wrapped by DDP
    params: list[torch.Tensor]  # the trainable parameters, for gradient clipping
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    amp: Amp
    n_params: int
    # MFU's inputs (trainer.mfu): FLOPs per sample (the model's own statement, else counted on a GPU
    # only), tokens per sample, the datasheet peak and the measured ceiling
    utilisation: Utilisation = field(default_factory=Utilisation)


@dataclass(frozen=True)
class Saved:
    """What rank 0 read at start and every rank received: the checkpoint to resume from, if any."""

    state: dict[str, Any] | None = None
    file: str = ""
    skipped: list[str] = field(default_factory=list)  # files that failed verification
    oom_record: dict[str, Any] | None = None  # left by a rank that ran out of memory under DDP


@dataclass(frozen=True)
class Start:
    """Where this session starts: a checkpoint's position (or zero) and the wall time already spent."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    wall_s: float = 0.0
    config_changes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Parts:
    """Everything the loop uses and never rebinds: built once by the setup."""

    rt: Runtime
    out: Path
    net: Net
    ckpts: CheckpointManager
    model_code: str  # fingerprint of the model's source, stored in each checkpoint
    total_steps: int
    steps_per_epoch: int | None  # None for a stream
    resumed_from: int | None  # the step this session resumed from (None: a new run)
    events: metrics.JsonLines | None  # rank 0 only
    metric_log: metrics.JsonLines | None  # rank 0 only
    gpu: metrics.GpuProbe
    mirror: CheckpointMirror | None = None  # rank 0 with a checkpoint bucket: uploads in the background
    live: LiveMetrics | None = None  # rank 0 with a metrics port: the Prometheus endpoint (trainer.live)

    @property
    def config(self) -> TrainConfig:
        return self.rt.config

    @property
    def main(self) -> bool:
        return self.rt.world.is_main


@dataclass
class LoopState:
    """What the loop advances: position, batch plan, clock, last results (the loop's functions write it)."""

    feed: Feed
    resolved: TrainConfig  # the config as this run resolved it (saved in checkpoints and config.yaml)
    clock: metrics.Clock
    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    iterator: Iterator[Any] | None = None  # None: start (or restart) the epoch's iterator at the position
    oom_fallbacks: list[dict[str, int]] = field(default_factory=list)
    status: str = "completed"
    #: What stopped the loop early: a signal's name, "peer", or VM_END (trainer.preemption).
    stopped_by: str | None = None
    judge: Judge = field(default_factory=Judge)  # the loss's verdicts (trainer.divergence)
    divergence: dict[str, Any] | None = None  # set when the run diverged
    last_saved: int = -1
    final_loss: float | None = None
    eval_result: dict[str, float] = field(default_factory=dict)
    # timing: the loop's start, the last checkpoint, the current logging window
    loop_start: float = 0.0
    loop_start_step: int = 0
    last_ckpt_time: float = 0.0
    window_start: float = 0.0
    window_step: int = 0
    data_wait: float = 0.0

    def start_loop(self) -> None:
        """Start the loop's clocks: throughput, the checkpoint timer and the first logging window."""
        self.last_ckpt_time = self.loop_start = time.monotonic()
        self.loop_start_step = self.window_step = self.step
        self.window_start, self.data_wait = time.perf_counter(), 0.0
