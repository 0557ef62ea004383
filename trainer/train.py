"""The training loop: one function you can read top to bottom (nanoGPT's shape, with survival added).

Order of a run: resolve the config for this machine -> find the batch if asked -> build model and
optimizer -> resume from the newest valid checkpoint -> loop. Inside the loop, after each optimizer
step, one tiny all-reduce makes every rank agree on "stop now" (SIGTERM) and "checkpoint now"
(timer); logging, evaluation and checkpoints are gated by intervals. Nothing in the loop syncs the
GPU except at log steps.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import trainer
from trainer import distributed, exit_codes, metrics
from trainer import resume as resume_rules
from trainer.batch_finder import find_batch, free_memory, is_oom, model_fingerprint
from trainer.batches import correct_count, to_device
from trainer.checkpoint import CheckpointManager, NoValidCheckpoint, fsync_dir, rng_state, set_rng_state
from trainer.config import ConfigError, TrainConfig, dump, field_docs
from trainer.data import (
    BatchPlan,
    epoch_iterator,
    eval_batches,
    largest_divisor_plan,
    make_loader,
    make_position,
    plan_batches,
    sized_len,
)
from trainer.errors import UserCodeError
from trainer.hardware import peak_flops
from trainer.optim import Schedule, build_optimizer
from trainer.precision import make_amp
from trainer.preemption import StopRequest
from trainer.runtime import Runtime, compile_cache_dir, prepare

log = logging.getLogger(__name__)

#: Under DDP, the micro-batch an OOM lowered, left in the output folder for the restart (see
#: write_oom_record): the rank that ran out of memory cannot retry alone, its peers wait in a collective.
OOM_RECORD = "oom.json"


@dataclass
class RunResult:
    """What ``train`` returns: the summary written to summary.json and the process exit code."""

    status: str
    exit_code: int
    out_dir: Path
    summary: dict[str, Any] = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def stop_check(world: distributed.World, request: StopRequest) -> Callable[[], bool]:
    """Whether any rank was asked to stop: a flag read alone, or agreed by all ranks (one tiny collective)."""
    if not world.distributed:
        return lambda: request.requested
    return lambda: distributed.agree_max(world, [float(request.requested)])[0] > 0


@torch.no_grad()
def evaluate(
    model: nn.Module, rt: Runtime, batch_size: int, should_stop: Callable[[], bool] | None = None
) -> dict[str, float] | None:
    """Mean loss and (for class logits) accuracy on the eval set, sharded over ranks then summed.

    Returns None when ``should_stop`` says so before a batch: a SIGTERM during a long evaluation
    must not eat Spot's 30 s notice (measured before: 4.25 s with 100k samples), so the evaluation is
    abandoned and the run saves at once. Every rank checks at the same batch count (the most any
    rank has), so under DDP they all abandon together.
    """
    data, world = rt.eval_data, rt.world
    length = None if data is None else sized_len(data)
    if data is None or length == 0:
        return {}
    amp = make_amp(rt.precision, world.device.type)
    loss_sum, correct, count, classify = 0.0, 0.0, 0.0, True
    model.eval()
    batches = eval_batches(data, batch_size, world.rank, world.size, rt.loss_fn.collate)
    # a sized set: as many checks on every rank as the first rank has batches; a stream's batch count
    # differs between ranks, so under DDP it is not checked per batch (only alone)
    slots = range(0, -(-length // world.size), batch_size) if length is not None else itertools.count()
    check_each = should_stop is not None and (length is not None or not world.distributed)
    for _slot in slots:
        if check_each and should_stop():
            model.train()
            return None
        batch = next(batches, None)
        if batch is None:  # this rank has fewer samples than the first rank: only the check above
            if length is None:
                break
            continue
        with amp.autocast():
            scored = rt.loss_fn(model, to_device(batch, world.device, rt.channels_last))
        loss_sum += float(scored.loss) * scored.size
        count += scored.size
        hits = correct_count(scored.logits, scored.targets)
        if hits is None:
            classify = False
        else:
            correct += float(hits)
    model.train()
    loss_sum, correct, count = distributed.sum_over_ranks(world, [loss_sum, correct, count])
    result = {"eval_loss": loss_sum / max(count, 1.0)}
    if classify:
        result["accuracy"] = correct / max(count, 1.0)
    return result


def flops_per_sample(
    model: nn.Module, rt: Runtime, micro_batch: int, loss_fn: Callable[..., Any]
) -> float | None:
    """Training FLOPs per sample (forward + backward) counted by FlopCounterMode on one micro-batch."""
    from torch.utils.flop_counter import FlopCounterMode

    from trainer.batch_finder import sample_batch

    try:
        with torch.random.fork_rng(devices=[rt.world.device] if rt.world.device.type == "cuda" else []):
            batch = sample_batch(
                rt.train_data, micro_batch, rt.world.device, rt.channels_last, rt.loss_fn.collate
            )
            counter = FlopCounterMode(display=False)
            with counter, make_amp(rt.precision, rt.world.device.type).autocast():
                loss_fn(model, batch).loss.backward()
        model.zero_grad(set_to_none=True)
        return counter.get_total_flops() / micro_batch
    except Exception as exc:  # counting is insight, not a reason to fail a run
        log.info("FLOP count unavailable (%s)", exc)
        model.zero_grad(set_to_none=True)
        return None


def clip_gradients(params: list[torch.Tensor], max_norm: float, device: torch.device) -> None:
    """Clip the global grad norm to ``max_norm``.

    On a GPU ``clip_grad_norm_`` always rescales (by a factor clamped to 1) so the host never waits
    for the norm. On a CPU there is nothing to wait for, and skipping the no-op rescale of every
    gradient when the norm is already small saves a measurable share of a small model's step. The
    result is the same bit for bit: the skipped rescale multiplies by exactly 1.0.
    """
    if device.type != "cpu":
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    if float(total) > max_norm:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)


def lower_micro_batch(plan: BatchPlan) -> BatchPlan:
    """After an OOM: the next smaller micro-batch that divides the per-process batch (32 -> 16 x 2).

    The global batch stays the same through accumulation, so the run's optimisation is unchanged.
    One rule for both ways out: a single process goes on at once, a DDP run after its restart.
    """
    return largest_divisor_plan(plan.micro_batch - 1, plan.global_batch, plan.world_size)


def oom_at_micro_batch_1(step: int, exc: BaseException) -> UserCodeError:
    """Nothing smaller to try: a restart would fail the same way, so it is the user's to fix."""
    return UserCodeError(
        f"out of memory at step {step} with micro-batch 1 (one sample per process): the model does not "
        f"fit; use a smaller model or sequence, precision: bf16, or a GPU with more memory ({exc})"
    )


def write_oom_record(out: Path, record: dict[str, Any]) -> None:
    """Leave ``record`` in ``out/oom.json`` for the restart: the file is the old one or the whole new one."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{OOM_RECORD}.tmp-{os.getpid()}"
    with open(tmp, "w") as handle:
        json.dump(record, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, out / OOM_RECORD)
    fsync_dir(out)


def read_oom_record(out: Path) -> dict[str, Any] | None:
    """The record an OOM under DDP left (None without one; an unreadable one is reported and ignored)."""
    try:
        record = json.loads((out / OOM_RECORD).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s, which cannot be read (%s)", out / OOM_RECORD, exc)
        return None
    return record if isinstance(record, dict) else None


def newest_oom_lowering(global_batch: int, *sources: dict[str, Any] | None) -> dict[str, Any] | None:
    """Of the sources (a checkpoint's state, an OOM record) that carry an OOM's lowered micro-batch for
    this global batch, the one with the lowest (micro-batches only go down, so it is the newest; a tie
    goes to the first)."""
    kept = [
        s
        for s in sources
        if s and int(s.get("oom_micro_batch", 0)) > 0 and int(s.get("global_batch", 0)) == global_batch
    ]
    return min(kept, key=lambda s: int(s["oom_micro_batch"]), default=None)


def history(events_path: Path) -> dict[str, Any]:
    """Preemptions and lost steps over all sessions of a run folder, from events.jsonl."""
    sessions: list[list[dict[str, Any]]] = []
    for event in metrics.read_jsonl(events_path):
        if event.get("event") in ("start", "resume") or not sessions:
            sessions.append([])
        sessions[-1].append(event)
    interrupted = sum(1 for s in sessions[:-1] if s[-1].get("event") not in ("finish",))
    lost = sum(int(e.get("lost_steps", 0)) for s in sessions for e in s if e.get("event") == "resume")
    return {"preemptions": interrupted, "lost_steps": lost}


def train(
    config: TrainConfig,
    out_dir: str | os.PathLike[str] | None = None,
    on_step: Callable[[int], None] | None = None,
    started_at: float | None = None,
) -> RunResult:
    """Train (or resume) the run in ``out_dir``; return its summary. Raises ConfigError on bad input.

    ``started_at`` (``time.monotonic`` scale) is when this session began costing money; default:
    now. The command line passes the process's start, so cost counts imports and setup too.
    Other errors are classified by :func:`trainer.errors.exit_code_for` (user code, a full disk,
    no valid checkpoint: each its own exit code).
    """
    started = time.monotonic() if started_at is None else started_at
    out = Path(os.path.expanduser(str(out_dir if out_dir is not None else config.out_dir))).resolve()
    rt = prepare(config)
    ended_well = False
    try:
        result = _train(rt, out, on_step, started)
        ended_well = True
        return result
    except Exception as exc:
        if rt.world.is_main and out.is_dir() and not isinstance(exc, ConfigError):
            with contextlib.suppress(OSError):  # a full disk cannot take the note either
                record_failure(out, exc)
        raise
    finally:
        distributed.teardown(rt.world if ended_well else None)


def record_failure(out: Path, exc: BaseException) -> None:
    """summary.json says 'failed' with the error; events.jsonl closes the session with 'fail'."""
    from trainer.report import write_summary

    summary_path = out / "summary.json"
    summary: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads(summary_path.read_text())
    from trainer.errors import exit_code_for

    summary.update(
        {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "exit_code": exit_code_for(exc),
            "time": time.time(),
        }
    )
    write_summary(out, summary)
    events = metrics.JsonLines(out / "events.jsonl")
    events.write({"event": "fail", "time": time.time(), "error": f"{type(exc).__name__}: {exc}"})
    events.close()


def _train(rt: Runtime, out: Path, on_step: Callable[[int], None] | None, started: float) -> RunResult:
    config, world, device = rt.config, rt.world, rt.world.device
    main = world.is_main
    collate = rt.loss_fn.collate  # the user's collate_fn (None: torch's default)
    if main:
        out.mkdir(parents=True, exist_ok=True)
    if config.compile:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache_dir(config, out)))
    seed_everything(config.seed)

    # -- batch plan: fixed, or found by trial on a throwaway model (its RNG use is forked away)
    try:
        n_train = sized_len(rt.train_data)  # None for a stream
        if config.effective_batch_size and n_train is not None and config.effective_batch_size > n_train:
            raise ValueError(
                f"batch: the global batch {config.effective_batch_size} is larger than the "
                f"{n_train} training samples (lower effective_batch_size)"
            )
        if config.batch_size == "auto":
            found = find_batch(
                config, world, rt.model_fn, rt.loss_fn, rt.train_data, rt.precision, rt.channels_last
            )
            plan = plan_batches(found.plan["micro_batch"], config.effective_batch_size, world.size)
        else:
            found = None
            plan = plan_batches(int(config.batch_size), config.effective_batch_size, world.size)
        sampler = make_position(rt.train_data, plan, world.rank, config.seed)
    except ValueError as exc:  # an impossible batch for this world size / dataset: the user's to fix
        raise ConfigError([str(exc)]) from None
    steps_per_epoch = sampler.steps_per_epoch
    total_steps = config.epochs * steps_per_epoch if config.epochs else config.steps
    loader, loader_gen = make_loader(rt.train_data, sampler, rt.num_workers, rt.pin_memory, collate)

    # -- model, optimizer, precision
    raw_model = rt.model_fn().to(device)
    if rt.channels_last:
        raw_model = raw_model.to(memory_format=torch.channels_last)
    n_params = sum(p.numel() for p in raw_model.parameters())
    # FLOPs for MFU, counted before DDP wraps the model (its gradient hooks must not see this backward)
    fps = flops_per_sample(raw_model, rt, plan.micro_batch, rt.loss_fn) if device.type == "cuda" else None
    model: nn.Module = raw_model
    if config.compile:
        model = torch.compile(model)
    if world.distributed:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = build_optimizer(config, raw_model, device)
    schedule = Schedule(config, optimizer, total_steps)  # before a resume loads the optimizer's LRs
    amp = make_amp(rt.precision, device.type)
    resolved = config.model_copy(
        update={
            "device": device.type,
            "precision": rt.precision,
            "batch_size": plan.micro_batch,
            "effective_batch_size": plan.global_batch,
            "channels_last": rt.channels_last,
            "num_workers": rt.num_workers,
            "pin_memory": rt.pin_memory,
            "out_dir": str(out),
        }
    )

    # -- resume from the newest checkpoint that loads (rank 0 reads, everyone receives)
    ckpts = CheckpointManager(out / "checkpoints", keep=config.keep_checkpoints)
    state: dict[str, Any] | None = None
    skipped: list[str] = []
    resumed_file, no_valid, oom_record = "", None, None
    if main:
        oom_record = read_oom_record(out)
        for stale in ckpts.remove_stale_temporaries():
            log.warning("removed a checkpoint a killed writer left half-written: %s", stale.name)
        try:
            found_ckpt = ckpts.load_for_resume(config.allow_fresh_start)
        except NoValidCheckpoint as exc:  # every rank must hear it, or the others wait in broadcast
            found_ckpt, no_valid = None, str(exc)
        if found_ckpt is not None:
            state, resumed_file = found_ckpt.state, found_ckpt.path.name
            skipped = [p.name for p in found_ckpt.skipped]
            log.info("resuming from %s", resumed_file)
        else:
            skipped = [p.name for p in ckpts.corrupt()]
    if world.distributed:
        box = [(state, no_valid, resumed_file, oom_record)]
        torch.distributed.broadcast_object_list(box, src=0)
        state, no_valid, resumed_file, oom_record = box[0]
    if no_valid is not None:
        raise NoValidCheckpoint(no_valid)
    model_code = model_fingerprint(rt.model_fn)
    config_changes: list[str] = []
    oom_fallbacks: list[dict[str, int]] = []
    step, epoch, step_in_epoch, carried_wall = 0, 0, 0, 0.0
    # An OOM lowered the micro-batch in an earlier session: starting high again would OOM again. The
    # checkpoint keeps it, and under DDP so does the failing rank's record; the lower one is the newer
    # (a tie goes to the checkpoint: the record was applied and saved already).
    lowered = newest_oom_lowering(plan.global_batch, state, oom_record)
    oom_restart: dict[str, Any] | None = None  # the record, when it is what lowers the micro-batch now
    if lowered is not None and int(lowered["oom_micro_batch"]) < plan.micro_batch:
        plan = largest_divisor_plan(int(lowered["oom_micro_batch"]), plan.global_batch, world.size)
        sampler = make_position(rt.train_data, plan, world.rank, config.seed)
        loader, loader_gen = make_loader(rt.train_data, sampler, rt.num_workers, rt.pin_memory, collate)
        resolved = resolved.model_copy(update={"batch_size": plan.micro_batch})
        oom_fallbacks = list(lowered.get("oom_fallbacks", []))
        oom_restart = lowered if lowered is oom_record else None
        log.info("keeping micro-batch %d x %d, lowered after an OOM", plan.micro_batch, plan.accum_steps)
    if state is not None:
        changes = resume_rules.compare(
            state.get("config", {}), resolved.to_dict(), {k: d for k, (d, _) in field_docs().items()}
        )
        if changes.refused and not config.allow_config_change:
            raise ConfigError(resume_rules.refusal(changes, resumed_file, str(out)))
        config_changes = changes.allowed + [f"{c} (allowed by allow_config_change)" for c in changes.refused]
        if state.get("model_code") not in (None, model_code):
            config_changes.append("the model's code changed (its parameters still match the checkpoint)")
        for change in config_changes:
            log.warning("resuming with a change since %s: %s", resumed_file, change)
        try:
            raw_model.load_state_dict(state["model"])
        except RuntimeError as exc:  # missing, unexpected or resized parameters
            raise ConfigError(resume_rules.model_mismatch(exc, resumed_file)) from None
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state.get("scheduler"))
        amp.scaler.load_state_dict(state["scaler"])
        step, epoch, step_in_epoch = int(state["step"]), int(state["epoch"]), int(state["step_in_epoch"])
        carried_wall = float(state.get("wall_s", 0.0))
        if int(state.get("global_batch", plan.global_batch)) != plan.global_batch:
            log.warning(
                "the global batch changed since the checkpoint (%s -> %s): resume is not exact",
                state.get("global_batch"),
                plan.global_batch,
            )
        if steps_per_epoch is not None and step_in_epoch >= steps_per_epoch:  # fewer, larger steps now
            epoch, step_in_epoch = epoch + 1, 0

    # -- run files (rank 0 only): resolved config, metrics (redone steps dropped), events.
    # A folder with earlier sessions but no loadable checkpoint is a restart from step 0, not a new run.
    restarted = state is not None or (main and any(True for _ in metrics.read_jsonl(out / "events.jsonl")))
    events = metrics.JsonLines(out / "events.jsonl") if main else None
    metric_log: metrics.JsonLines | None = None
    lost_steps = 0
    if main:
        (out / "config.yaml").write_text(dump(resolved))
        last = metrics.truncate_after(out / "metrics.jsonl", step) if restarted else None
        if last is not None:
            lost_steps = max(0, int(last.get("step", step)) - step)
            carried_wall = max(carried_wall, float(last.get("wall_s", 0.0)))
        metric_log = metrics.JsonLines(out / "metrics.jsonl")
    carried_wall = distributed.agree_max(world, [carried_wall])[0]
    if state is not None:
        rngs = state["rng"]
        set_rng_state(rngs[world.rank] if len(rngs) == world.size else rngs[0])

    def event(kind: str, **fields: Any) -> None:
        if events is not None:
            events.write({"event": kind, "time": time.time(), "step": step, **fields})

    if not restarted:
        event(
            "start",
            world_size=world.size,
            plan=plan.__dict__,
            params=n_params,
            precision=rt.precision,
            device=str(device),
            find_batch=found.to_dict() if found else None,
        )
    else:
        event(
            "resume",
            resumed_from_step=step,
            lost_steps=lost_steps,
            skipped_checkpoints=skipped,
            world_size=world.size,
            config_changes=config_changes,
        )
    if oom_restart is not None and oom_fallbacks:
        last_oom = oom_fallbacks[-1]
        event("oom", from_micro_batch=last_oom["from"], micro_batch=plan.micro_batch, accum=plan.accum_steps,
              rank=oom_restart.get("rank"), failed_at_step=last_oom["step"])  # fmt: skip
    resumed_from = step if restarted else None
    if main:
        log.info(
            "training %s: %s parameters, %s on %s x%d, micro-batch %d x accumulation %d x %d processes = "
            "global batch %d, %d steps (%s per epoch), start at step %d",
            config.model,
            f"{n_params:,}",
            rt.precision,
            device.type,
            world.size,
            plan.micro_batch,
            plan.accum_steps,
            world.size,
            plan.global_batch,
            total_steps,
            steps_per_epoch,
            step,
        )

    def save_checkpoint(reason: str) -> None:
        rngs = distributed.gather_objects(world, rng_state())
        if main:
            write_start = time.monotonic()
            path = ckpts.save(
                {
                    "step": step,
                    "epoch": epoch,
                    "step_in_epoch": step_in_epoch,
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scaler": amp.scaler.state_dict(),
                    "scheduler": schedule.state_dict(),
                    "rng": rngs,
                    "config": resolved.to_dict(),
                    "global_batch": plan.global_batch,
                    "world_size": world.size,
                    "wall_s": clock.total_s(),
                    "model_code": model_code,
                    "oom_micro_batch": plan.micro_batch if oom_fallbacks else 0,
                    "oom_fallbacks": oom_fallbacks,
                    "torch_version": str(torch.__version__),
                    "trainer_version": trainer.__version__,
                },
                step,
            )
            write_s = round(time.monotonic() - write_start, 4)
            event("checkpoint", reason=reason, path=path.name, write_s=write_s)

    # -- the loop
    clock = metrics.Clock(carried_wall, start=started)
    ddp = isinstance(model, DistributedDataParallel)
    params = [p for p in raw_model.parameters() if p.requires_grad]
    status, last_saved, last_ckpt_time = "completed", -1, time.monotonic()
    loop_start, loop_start_step = time.monotonic(), step
    window_start, window_step, data_wait = time.perf_counter(), step, 0.0
    final_loss: float | None = None
    eval_result: dict[str, float] = {}
    iterator = None
    metrics.cpu_utilisation()
    gpu = metrics.GpuProbe(device)
    model.train()
    with StopRequest() as stop_request:
        while step < total_steps:
            if iterator is None:
                iterator = epoch_iterator(loader, loader_gen, config.seed, epoch, step_in_epoch)
            loss_acc: torch.Tensor | float = 0.0
            out_of_memory = False
            try:
                for micro in range(plan.accum_steps):
                    wait_start = time.perf_counter()
                    batch = next(iterator, None)
                    if batch is None:  # a stream's pass ended (always between steps): start the next pass
                        epoch, step_in_epoch = epoch + 1, 0
                        iterator = epoch_iterator(loader, loader_gen, config.seed, epoch, 0)
                        batch = next(iterator, None)
                        if batch is None:
                            raise UserCodeError(
                                f"data: {config.data} yielded less than one global batch "
                                f"({plan.global_batch} samples) in a pass"
                            )
                    data_wait += time.perf_counter() - wait_start
                    batch = to_device(batch, device, rt.channels_last)
                    last_micro = micro == plan.accum_steps - 1
                    sync = model.no_sync() if ddp and not last_micro else contextlib.nullcontext()
                    with sync:
                        with amp.autocast():
                            loss = rt.loss_fn(model, batch).loss
                            if plan.accum_steps > 1:
                                loss = loss / plan.accum_steps
                        amp.scaler.scale(loss).backward()
                    loss_acc = loss.detach() if micro == 0 else loss_acc + loss.detach()
            except Exception as exc:
                if not is_oom(exc):
                    raise
                if plan.micro_batch == 1:
                    raise oom_at_micro_batch_1(step, exc) from exc
                if world.distributed:  # peers wait in a collective: this rank cannot retry alone
                    lower = lower_micro_batch(plan)
                    fallback = {"step": step, "from": plan.micro_batch, "to": lower.micro_batch}
                    record = {"oom_micro_batch": lower.micro_batch, "global_batch": plan.global_batch,
                              "oom_fallbacks": [*oom_fallbacks, fallback], "rank": world.rank,
                              "error": f"{type(exc).__name__}: {exc}"}  # fmt: skip
                    write_oom_record(out, record)
                    raise RuntimeError(
                        f"out of memory on rank {world.rank} at step {step} with micro-batch "
                        f"{plan.micro_batch}: recorded in {OOM_RECORD}; the restart goes on from the newest "
                        f"checkpoint with {lower.micro_batch} x {lower.accum_steps} accumulation ({exc})"
                    ) from exc
                out_of_memory = True  # handled below, outside the except block that pins the tensors
            if out_of_memory:
                batch = loss = loss_acc = None
                optimizer.zero_grad(set_to_none=True)
                free_memory(device)
                before = plan.micro_batch
                plan = lower_micro_batch(plan)
                sampler = make_position(rt.train_data, plan, world.rank, config.seed)
                loader, loader_gen = make_loader(
                    rt.train_data, sampler, rt.num_workers, rt.pin_memory, collate
                )
                iterator = None  # the same step again, its samples split into smaller micro-batches
                resolved = resolved.model_copy(update={"batch_size": plan.micro_batch})
                oom_fallbacks.append({"step": step, "from": before, "to": plan.micro_batch})
                log.warning(
                    "out of memory at step %d with micro-batch %d: saving, then going on with %d x %d "
                    "accumulation (global batch %d unchanged)",
                    step,
                    before,
                    plan.micro_batch,
                    plan.accum_steps,
                    plan.global_batch,
                )
                event("oom", from_micro_batch=before, micro_batch=plan.micro_batch, accum=plan.accum_steps)
                save_checkpoint("oom")
                last_saved, last_ckpt_time = step, time.monotonic()
                continue
            lr = schedule.set_lr(step)
            if config.grad_clip > 0:
                amp.scaler.unscale_(optimizer)
                clip_gradients(params, config.grad_clip, device)
            amp.scaler.step(optimizer)
            amp.scaler.update()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            step_in_epoch += 1
            epoch_end = step_in_epoch == steps_per_epoch
            if epoch_end:
                epoch, step_in_epoch, iterator = epoch + 1, 0, None

            # every rank agrees on "stop" (any rank got SIGTERM) and "checkpoint now" (rank 0's timer)
            since_ckpt = time.monotonic() - last_ckpt_time
            timer_due = main and config.checkpoint_every_s > 0 and since_ckpt >= config.checkpoint_every_s
            # epoch ends of a small dataset come every second or so: no point hitting the disk that often
            epoch_due = main and epoch_end and since_ckpt >= config.checkpoint_min_interval_s
            stop_flag, timer_flag, epoch_flag = distributed.agree_max(
                world, [float(stop_request.requested), float(timer_due), float(epoch_due)]
            )
            stop, epoch_save = stop_flag > 0, epoch_flag > 0
            last_step = step == total_steps

            if step % config.log_every_steps == 0 or stop or last_step:
                loss_mean = distributed.sum_over_ranks(world, [float(loss_acc)])[0] / world.size
                final_loss = loss_mean
                now = time.perf_counter()
                steps_done = max(1, step - window_step)
                elapsed = now - window_start
                wall = clock.total_s()
                record = {
                    "step": step,
                    "loss": loss_mean,
                    "lr": lr,
                    "samples_per_s": steps_done * plan.global_batch / max(elapsed, 1e-9),
                    "step_time_s": elapsed / steps_done,
                    "data_wait_s": data_wait / steps_done,
                    "gpu_mem_gb": gpu.peak_memory_gb(),
                    "gpu_util": gpu.utilisation(),
                    "cpu_util": metrics.cpu_utilisation(),
                    "cost_usd": metrics.cost_usd(wall, config.price_per_hour),
                    "wall_s": wall,
                    "time": time.time(),
                    "epoch": epoch,
                }
                if fps is not None:
                    peak = peak_flops(torch.cuda.get_device_name(device), rt.precision)
                    record["mfu"] = fps * record["samples_per_s"] / peak if peak else None
                if metric_log is not None:
                    metric_log.write(record)
                    rate = (step - loop_start_step) / max(time.monotonic() - loop_start, 1e-9)
                    print(
                        metrics.progress_line(
                            record, total_steps, (total_steps - step) / rate if rate else None
                        ),
                        flush=True,
                    )
                window_start, window_step, data_wait = time.perf_counter(), step, 0.0

            if config.eval_every_steps and step % config.eval_every_steps == 0 and not last_step and not stop:
                evaluated = evaluate(
                    model, rt, config.eval_batch_size or plan.micro_batch, stop_check(world, stop_request)
                )
                if evaluated is None:  # SIGTERM during the evaluation: save now, evaluate after the restart
                    stop = True
                    event("eval_abandoned")
                else:
                    eval_result = evaluated
                    event("eval", **eval_result)

            every_steps = config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0
            if timer_flag > 0 or epoch_save or every_steps or stop or last_step:
                reasons = {"stop": stop, "final": last_step, "epoch": epoch_save, "interval": every_steps}
                reason = next((name for name, hit in reasons.items() if hit), "timer")
                save_checkpoint(reason)
                last_saved, last_ckpt_time = step, time.monotonic()
            if on_step is not None:
                on_step(step)
            if stop:
                status = "preempted"
                event(
                    "preempt",
                    signal=stop_request.signal_name or "peer",
                    saved_step=last_saved,
                    seconds_to_save=time.monotonic() - stop_request.received_at
                    if stop_request.received_at
                    else None,
                )
                break

    loop_s = time.monotonic() - loop_start
    if status == "completed":  # the last step's checkpoint is on disk: a stop now only skips the evaluation
        with StopRequest() as final_stop:
            evaluated = evaluate(
                model, rt, config.eval_batch_size or plan.micro_batch, stop_check(world, final_stop)
            )
        if evaluated is None:
            status = "preempted"  # the restart finds the final checkpoint and evaluates
            signal_name = final_stop.signal_name or "peer"
            event("preempt", signal=signal_name, saved_step=last_saved, during="evaluation")
        else:
            eval_result = evaluated
            event("finish", **eval_result)
    samples_per_s = (step - loop_start_step) * plan.global_batch / max(loop_s, 1e-9)
    summary: dict[str, Any] = {}
    if main:
        assert metric_log is not None and events is not None
        metric_log.close()
        events.close()
        past = history(out / "events.jsonl")
        ckpt_files = ckpts.list()
        wall_s = clock.total_s()  # read once: the summary's cost is exactly its wall time at the rate
        summary = {
            "status": status,
            "steps": step,
            "total_steps": total_steps,
            "final_loss": final_loss,
            "accuracy": eval_result.get("accuracy"),
            "eval_loss": eval_result.get("eval_loss"),
            "samples_per_s": samples_per_s,
            "wall_s": wall_s,
            "cost_usd": metrics.cost_usd(wall_s, config.price_per_hour),
            "resumed_from_step": resumed_from,
            "lost_steps": past["lost_steps"],
            "preemptions": past["preemptions"],
            "last_checkpoint": ckpt_files[-1].name if ckpt_files else None,
            "best_checkpoint": ckpt_files[-1].name if ckpt_files else None,
            "params": n_params,
            "precision": rt.precision,
            "device": str(device),
            "world_size": world.size,
            "micro_batch": plan.micro_batch,
            "accum_steps": plan.accum_steps,
            "global_batch": plan.global_batch,
            "flops_per_sample": fps,
            "oom_fallbacks": oom_fallbacks,
            "time": time.time(),
        }
        if fps is not None:
            peak = peak_flops(torch.cuda.get_device_name(device), rt.precision)
            summary["mfu"] = fps * samples_per_s / peak if peak else None
        from trainer.report import render, write_summary

        write_summary(out, summary)
        if config.render_plots:
            try:
                render(out)
            except Exception as exc:  # plots are insight; a missing matplotlib must not fail a finished run
                log.warning("plots not rendered (%s); `python -m trainer report --run DIR` draws them", exc)
    code = exit_codes.COMPLETED if status == "completed" else exit_codes.PREEMPTED
    return RunResult(status=status, exit_code=code, out_dir=out, summary=summary)
