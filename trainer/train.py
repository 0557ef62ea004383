"""The training loop: one function you can read top to bottom (nanoGPT's shape, with survival added).

Order of a run: resolve the config for this machine -> find the batch if asked -> build model and
optimizer -> resume from the newest valid checkpoint -> loop. Inside the loop, after each optimizer
step, one tiny all-reduce makes every rank agree on "stop now" (SIGTERM) and "checkpoint now"
(timer); logging, evaluation and checkpoints are gated by intervals. Nothing in the loop syncs the
GPU except at log steps.
"""

from __future__ import annotations

import contextlib
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
from trainer import distributed, metrics
from trainer.batch_finder import find_batch
from trainer.checkpoint import CheckpointManager, rng_state, set_rng_state
from trainer.config import ConfigError, TrainConfig, dump
from trainer.data import ResumableSampler, epoch_iterator, make_loader, plan_batches
from trainer.hardware import peak_flops
from trainer.precision import make_amp
from trainer.preemption import StopRequest
from trainer.runtime import Runtime, compile_cache_dir, prepare
from trainer.schedule import lr_at

log = logging.getLogger(__name__)

EXIT_COMPLETED, EXIT_FAILED, EXIT_BAD_CONFIG, EXIT_PREEMPTED = 0, 1, 2, 3


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


def to_device(batch: Any, device: torch.device, channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, targets = batch[0], batch[1]
    inputs = inputs.to(device, non_blocking=True)
    if channels_last and inputs.dim() == 4:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    return inputs, targets.to(device, non_blocking=True)


@torch.no_grad()
def evaluate(model: nn.Module, rt: Runtime, batch_size: int) -> dict[str, float]:
    """Mean loss and (for class logits) accuracy on the eval set, sharded over ranks then summed."""
    data, world = rt.eval_data, rt.world
    if data is None or len(data) == 0:
        return {}
    amp = make_amp(rt.precision, world.device.type)
    indices = list(range(world.rank, len(data), world.size))
    loss_sum, correct, count, classify = 0.0, 0.0, 0.0, True
    model.eval()
    for first in range(0, len(indices), batch_size):
        chunk = indices[first : first + batch_size]
        if hasattr(data, "tensors"):
            index = torch.as_tensor(chunk)
            batch = tuple(t[index] for t in data.tensors)
        else:
            batch = torch.utils.data.default_collate([data[i] for i in chunk])
        inputs, targets = to_device(batch, world.device, rt.channels_last)
        with amp.autocast():
            out = model(inputs)
            loss = rt.loss_fn(out, targets)
        loss_sum += float(loss) * len(chunk)
        count += len(chunk)
        if out.dim() == 2 and not targets.is_floating_point():
            correct += float((out.argmax(dim=1) == targets).sum())
        else:
            classify = False
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
            inputs, targets = sample_batch(rt.train_data, micro_batch, rt.world.device, rt.channels_last)
            counter = FlopCounterMode(display=False)
            with counter, make_amp(rt.precision, rt.world.device.type).autocast():
                loss_fn(model(inputs), targets).backward()
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
) -> RunResult:
    """Train (or resume) the run in ``out_dir``; return its summary. Raises ConfigError on bad input."""
    out = Path(os.path.expanduser(str(out_dir if out_dir is not None else config.out_dir))).resolve()
    rt = prepare(config)
    ended_well = False
    try:
        result = _train(rt, out, on_step)
        ended_well = True
        return result
    except Exception as exc:
        if rt.world.is_main and out.is_dir() and not isinstance(exc, ConfigError):
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
    summary.update({"status": "failed", "error": f"{type(exc).__name__}: {exc}", "time": time.time()})
    write_summary(out, summary)
    events = metrics.JsonLines(out / "events.jsonl")
    events.write({"event": "fail", "time": time.time(), "error": f"{type(exc).__name__}: {exc}"})
    events.close()


def _train(rt: Runtime, out: Path, on_step: Callable[[int], None] | None) -> RunResult:
    config, world, device = rt.config, rt.world, rt.world.device
    main = world.is_main
    if main:
        out.mkdir(parents=True, exist_ok=True)
    if config.compile:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache_dir(config, out)))
    seed_everything(config.seed)

    # -- batch plan: fixed, or found by trial on a throwaway model (its RNG use is forked away)
    try:
        if config.effective_batch_size and config.effective_batch_size > len(rt.train_data):
            raise ValueError(
                f"batch: the global batch {config.effective_batch_size} is larger than the "
                f"{len(rt.train_data)} training samples (lower effective_batch_size)"
            )
        if config.batch_size == "auto":
            found = find_batch(
                config, world, rt.model_fn, rt.loss_fn, rt.train_data, rt.precision, rt.channels_last
            )
            plan = plan_batches(found.plan["micro_batch"], config.effective_batch_size, world.size)
        else:
            found = None
            plan = plan_batches(int(config.batch_size), config.effective_batch_size, world.size)
        sampler = ResumableSampler(len(rt.train_data), plan, world.rank, config.seed)
    except ValueError as exc:  # an impossible batch for this world size / dataset: the user's to fix
        raise ConfigError([str(exc)]) from None
    steps_per_epoch = sampler.steps_per_epoch
    total_steps = config.epochs * steps_per_epoch if config.epochs else config.steps
    loader, loader_gen = make_loader(rt.train_data, sampler, rt.num_workers, rt.pin_memory)

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
    optimizer = torch.optim.AdamW(
        raw_model.parameters(),
        lr=config.lr,
        betas=config.betas,
        weight_decay=config.weight_decay,
        fused=device.type == "cuda",
    )
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
    if main:
        for stale in ckpts.remove_stale_temporaries():
            log.warning("removed a checkpoint a killed writer left half-written: %s", stale.name)
        found_ckpt = ckpts.load_latest()
        if found_ckpt is not None:
            state = found_ckpt.state
            skipped = [p.name for p in found_ckpt.skipped]
            log.info("resuming from %s", found_ckpt.path.name)
    if world.distributed:
        box = [state]
        torch.distributed.broadcast_object_list(box, src=0)
        state = box[0]
    step, epoch, step_in_epoch, carried_wall = 0, 0, 0, 0.0
    if state is not None:
        raw_model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        amp.scaler.load_state_dict(state["scaler"])
        step, epoch, step_in_epoch = int(state["step"]), int(state["epoch"]), int(state["step_in_epoch"])
        carried_wall = float(state.get("wall_s", 0.0))
        if int(state.get("global_batch", plan.global_batch)) != plan.global_batch:
            log.warning(
                "the global batch changed since the checkpoint (%s -> %s): resume is not exact",
                state.get("global_batch"),
                plan.global_batch,
            )
        if step_in_epoch >= steps_per_epoch:  # fewer, larger steps per epoch now: start the next epoch
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
        )
    resumed_from = step if restarted else None
    if main:
        log.info(
            "training %s: %s parameters, %s on %s x%d, micro-batch %d x accumulation %d x %d processes = "
            "global batch %d, %d steps (%d per epoch), start at step %d",
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
            path = ckpts.save(
                {
                    "step": step,
                    "epoch": epoch,
                    "step_in_epoch": step_in_epoch,
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scaler": amp.scaler.state_dict(),
                    "rng": rngs,
                    "config": resolved.to_dict(),
                    "global_batch": plan.global_batch,
                    "world_size": world.size,
                    "wall_s": clock.total_s(),
                    "torch_version": str(torch.__version__),
                    "trainer_version": trainer.__version__,
                },
                step,
            )
            event("checkpoint", reason=reason, path=path.name)

    # -- the loop
    clock = metrics.Clock(carried_wall)
    ddp = isinstance(model, DistributedDataParallel)
    params = [p for p in raw_model.parameters() if p.requires_grad]
    sched = config.lr_schedule
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
            for micro in range(plan.accum_steps):
                wait_start = time.perf_counter()
                batch = next(iterator)
                data_wait += time.perf_counter() - wait_start
                inputs, targets = to_device(batch, device, rt.channels_last)
                sync = model.no_sync() if ddp and micro < plan.accum_steps - 1 else contextlib.nullcontext()
                with sync:
                    with amp.autocast():
                        loss = rt.loss_fn(model(inputs), targets)
                        if plan.accum_steps > 1:
                            loss = loss / plan.accum_steps
                    amp.scaler.scale(loss).backward()
                loss_acc = loss.detach() if micro == 0 else loss_acc + loss.detach()
            lr = lr_at(
                step,
                lr=config.lr,
                total_steps=total_steps,
                warmup_steps=sched.warmup_steps,
                min_lr=sched.min_lr,
                cosine=sched.cosine,
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            if config.grad_clip > 0:
                amp.scaler.unscale_(optimizer)
                clip_gradients(params, config.grad_clip, device)
            amp.scaler.step(optimizer)
            amp.scaler.update()
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

            if config.eval_every_steps and step % config.eval_every_steps == 0 and not last_step:
                eval_result = evaluate(model, rt, config.eval_batch_size or plan.micro_batch)
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
    if status == "completed":
        eval_result = evaluate(model, rt, config.eval_batch_size or plan.micro_batch)
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
    code = EXIT_COMPLETED if status == "completed" else EXIT_PREEMPTED
    return RunResult(status=status, exit_code=code, out_dir=out, summary=summary)
