"""One process or many: the same code path, with torchrun's environment deciding.

Why a process-group timeout: a peer lost with its VM otherwise leaves the survivors blocked in a
collective forever (observed: a gloo restart hung for 19 minutes), burning paid GPU hours. With
a timeout they fail, exit non-zero, and torchrun or systemd restarts them from the last checkpoint.
Multi-node needs nothing here: torchrun's own rendezvous arguments fill the same variables.
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from trainer.config import ConfigError

_joined = False  # set once this process is in a group (setup, teardown): it then ends by exit_process


@dataclass(frozen=True)
class World:
    """Where this process stands: rank, how many, and the device it drives."""

    rank: int = 0
    local_rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    control_group: Any = None  # a gloo group for per-step flags: no GPU sync on the hot path

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def pick_device(requested: str) -> str:
    """auto -> cuda when a GPU is visible, else cpu; cuda without a GPU is an error naming the key."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was requested but no GPU is visible (use device: auto or cpu)")
    return requested


def setup(device_kind: str, timeout_s: float) -> World:
    """Join the process group when launched by torchrun (nccl on GPU, gloo on CPU)."""
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if device_kind == "cuda"
            else torch.device("cpu")
        )
        return World(device=device)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        # one process per GPU: torchrun's LOCAL_RANK is this process's GPU on its host
        visible = torch.cuda.device_count()
        if local_rank >= visible:
            shown = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
            problem = (
                f"LOCAL_RANK {local_rank} has no GPU: the host has {visible} (CUDA_VISIBLE_DEVICES={shown});"
                f" start at most {visible} processes per host (trainer_run_nproc_per_node: auto counts them)"
            )
            raise ConfigError([problem])  # a restart would fail the same way: exit 2
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    timeout = datetime.timedelta(seconds=timeout_s)
    global _joined
    _joined = True
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device_kind == "cuda" else "gloo",
            timeout=timeout,
            device_id=device if device_kind == "cuda" else None,
        )
    # Per-step agreement (stop? checkpoint?) goes over a CPU/gloo group: an NCCL all-reduce of a
    # flag would force a host-device sync every step and stall the GPU's queue.
    control = dist.new_group(backend="gloo", timeout=timeout) if device_kind == "cuda" else None
    return World(rank=rank, local_rank=local_rank, size=size, device=device, control_group=control)


def finish(code: int) -> int:
    """``code``, for a process that never joined a process group; one that did (now or before)
    ends here instead, through :func:`exit_process`. Use: ``sys.exit(distributed.finish(code))``."""
    if _joined or (dist.is_available() and dist.is_initialized()):
        exit_process(code)
    return code


def exit_process(code: int) -> NoReturn:
    """End a process that joined a process group, without the interpreter's finalization.

    DDP's reducer keeps the gloo group alive after ``destroy_process_group``, and one of its worker
    threads may still be releasing a finished collective's tensors when the interpreter finalizes.
    That thread then needs the GIL, cannot have it, and the process aborts ("terminate called
    without an active exception", SIGABRT) although its run completed; torchrun then reports the
    whole run failed. Two-rank launches on a 2-core machine kept busy: 4 of 78 aborted so (a core
    dump showed exactly that thread), 0 of 120 since they end here. What finalization would do
    that matters is done here first: other non-daemon threads are joined, atexit handlers run
    (logging's flush among them), and stdout/stderr are flushed.
    """
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def teardown(world: World | None = None) -> None:
    """Leave the process group; given the `world` of a run that ended well, first wait for every rank.

    A rank that destroys its gloo group and exits while a peer is still finishing can make that
    peer abort ("terminate called without an active exception"), and torchrun then reports the
    whole completed run as failed. After an error there is no barrier: a dead peer would hold it
    for the whole timeout.
    """
    global _joined
    if dist.is_available() and dist.is_initialized():
        _joined = True  # a group the caller joined itself (runlib): its process still ends by finish()
        if world is not None:
            barrier(world)
        dist.destroy_process_group()


def agree_max(world: World, values: list[float]) -> list[float]:
    """Element-wise maximum over ranks (one tiny collective): one rank's stop request stops all."""
    if not world.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=world.control_group)
    return tensor.tolist()


def agree_min_int(world: World, value: int) -> int:
    """The smallest value over ranks (find-batch: every rank must fit the same micro-batch)."""
    if not world.distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=world.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def sum_over_ranks(world: World, values: list[float]) -> list[float]:
    if not world.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=world.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def gather_objects(world: World, obj: Any) -> list[Any]:
    """Every rank's ``obj`` on every rank (used for per-rank RNG states in a checkpoint)."""
    if not world.distributed:
        return [obj]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()
