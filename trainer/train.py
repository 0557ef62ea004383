"""The training loop: one function you can read top to bottom (nanoGPT's shape, with survival added).

Order of a run (``_train``): resolve the config for this machine -> find the batch if asked -> build
model and optimizer -> resume from the newest valid checkpoint -> loop. Inside the loop, after each
optimizer step, one tiny all-reduce makes every rank agree on "stop now" (SIGTERM) and "checkpoint
now" (timer); logging, evaluation and checkpoints are gated by intervals. Before the optimizer
step, the loss is judged (trainer.divergence: NaN, Inf or over a bound stops the run as "diverged").
Nothing in the loop syncs the GPU except that check (every ``check_finite_every_steps``) and log steps.

The loop fits on one screen: each part of a step is a named function below ``_train`` that takes
the session's parts and the loop's state explicitly (:mod:`trainer.loop_state`), never a closure.
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

from trainer import distributed, exit_codes, finite, live, metrics
from trainer import mfu as mfu_rules
from trainer import resume as resume_rules
from trainer.batch_finder import BatchResult, find_batch, free_memory, is_oom, model_fingerprint
from trainer.batches import correct_count, to_device
from trainer.benchmark import matmul_ceiling
from trainer.checkpoint import CheckpointManager, NoValidCheckpoint, rng_state, set_rng_state
from trainer.config import ConfigError, TrainConfig, dump, field_docs
from trainer.data import (
    BatchPlan,
    ResumableSampler,
    StreamPosition,
    epoch_iterator,
    eval_batches,
    largest_divisor_plan,
    make_loader,
    make_position,
    plan_batches,
    sized_len,
)
from trainer.divergence import Judge, Verdict, good_checkpoint, sentence, weights_record
from trainer.errors import UserCodeError
from trainer.export import export_at_end
from trainer.folder_lock import folder_lock
from trainer.hardware import peak_flops
from trainer.loop_state import Feed, LoopState, Net, Parts, Saved, Start
from trainer.mfu import Utilisation
from trainer.mirror import PREEMPTED_UPLOAD_WAIT_S, CheckpointMirror, MirrorUnavailable, bucket_url
from trainer.optim import Schedule, build_optimizer
from trainer.precision import make_amp
from trainer.preemption import VM_END, StopRequest, VmEnd, forget_stop_request, stopped_by
from trainer.report import history, record_failure
from trainer.run_folder import CHECKPOINTS_DIR, CONFIG, EVENTS, METRICS, OOM_RECORD, write_atomic
from trainer.runtime import Runtime, compile_cache_dir, prepare
from trainer.summary import Summary
from trainer.version import __version__

log = logging.getLogger(__name__)

# Under DDP, the micro-batch an OOM lowered is left in the output folder for the restart (OOM_RECORD,
# see write_oom_record): the rank that ran out of memory cannot retry alone, its peers wait in a collective.
#: How a session that ends normally exits, by the status it ends with (trainer.exit_codes).
EXIT_CODES = {"completed": exit_codes.COMPLETED, "preempted": exit_codes.PREEMPTED,
              "diverged": exit_codes.DIVERGED}  # fmt: skip


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
    model: nn.Module,
    rt: Runtime,
    batch_size: int,
    should_stop: Callable[[], bool] | None = None,
    progress: Callable[[], None] | None = None,
) -> dict[str, float] | None:
    """Mean loss and (for class logits) accuracy on the eval set, sharded over ranks then summed.

    Returns None when ``should_stop`` says so before a batch: a SIGTERM during a long evaluation
    must not eat Spot's 30 s notice (measured before: 4.25 s with 100k samples), so the evaluation is
    abandoned and the run saves at once. Every rank checks at the same batch count (the most any
    rank has), so under DDP they all abandon together. ``progress`` is called after each batch: a
    long evaluation is progress, not a stall (trainer.live).
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
        if progress is not None:
            progress()
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


def measure_utilisation(model: nn.Module, rt: Runtime, micro_batch: int) -> Utilisation:
    """The session's MFU inputs (trainer.mfu): FLOPs per sample (the model's own statement, else
    counted on a GPU), tokens per sample, the datasheet peak and a measured matmul ceiling."""
    from trainer.batch_finder import sample_batch

    device = rt.world.device
    stated = getattr(model, "flops_per_sample", None)
    fps: float | None = None
    if callable(stated):
        try:
            fps = float(stated())
        except Exception as exc:  # the model's own statement failed: count as for any model
            log.info("model.flops_per_sample() failed (%s)", exc)
    tokens: int | None = getattr(model, "tokens_per_sample", None)
    if not isinstance(tokens, int) and sized_len(rt.train_data) is not None:  # a stream is not read here
        with contextlib.suppress(Exception), torch.random.fork_rng(devices=[]):  # insight only
            batch = sample_batch(rt.train_data, 1, torch.device("cpu"), False, rt.loss_fn.collate)
            tokens = mfu_rules.tokens_per_sample(model, batch)
    if fps is None and device.type == "cuda":
        fps = flops_per_sample(model, rt, micro_batch, rt.loss_fn)
    if fps is None:
        return Utilisation(tokens_per_sample=tokens, note=mfu_rules.UNCOUNTED_NOTE)
    peak = peak_flops(torch.cuda.get_device_name(device), rt.precision) if device.type == "cuda" else None
    try:
        ceiling = matmul_ceiling(device, rt.precision)
    except Exception as exc:  # a probe that cannot run leaves the datasheet figure
        log.info("matmul ceiling not measured (%s)", exc)
        ceiling = None
    note = mfu_rules.CPU_NOTE if device.type == "cpu" else None
    if device.type == "cuda" and peak is None:
        name = torch.cuda.get_device_name(device)
        note = f"no datasheet peak for {name} ({rt.precision}) in trainer.hardware: MFU vs the ceiling only"
    return Utilisation(fps, tokens, peak, ceiling, note)


def clip_gradients(params: list[torch.Tensor], max_norm: float, device: torch.device) -> None:
    """Clip the global grad norm to ``max_norm``.

    On a GPU ``clip_grad_norm_`` always rescales (by a factor clamped to 1) so the host never waits
    for the norm. On a CPU there is nothing to wait for, and skipping the no-op rescale of every
    gradient when the norm is already small saves a measurable share of a small model's step. The
    result is the same bit for bit: the skipped rescale multiplies by exactly 1.0. With every
    gradient of one dtype (the usual case) the norm is ``get_total_norm``'s own computation without
    its per-call grouping by device and dtype, which took half its time (95 us vs 53 us for the
    digits CNN, about 1 % of its step): the same kernels on the same tensors in the same order.
    """
    if device.type != "cpu":
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    if len({g.dtype for g in grads}) == 1:
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    else:
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
    write_atomic(out / OOM_RECORD, json.dumps(record))


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
    with folder_lock(out) if rt.world.is_main else contextlib.nullcontext():
        return _locked_train(rt, out, on_step, started)


def _locked_train(rt: Runtime, out: Path, on_step: Callable[[int], None] | None, started: float) -> RunResult:
    """`train` once rank 0 holds the folder's lock (trainer.folder_lock): a failure note written
    here is this run's, never another trainer's."""
    config = rt.config
    mirror = make_mirror(rt, out)
    endpoint = live.start(out, os.environ.get("FORJA_RUN") or out.name, rt.world.is_main)
    ended_well = False
    try:
        result = _train(rt, out, on_step, started, mirror, endpoint)
        ended_well = True
        return result
    except Exception as exc:
        if rt.world.is_main and out.is_dir() and not isinstance(exc, ConfigError):
            with contextlib.suppress(OSError):  # a full disk cannot take the note either
                record_failure(out, exc)
        raise
    finally:
        if mirror is not None:  # a failed run's newest checkpoint matters as much (bounded wait)
            mirror.close(config.checkpoint_upload_wait_s)
        if endpoint is not None:
            endpoint.close()
        distributed.teardown(rt.world if ended_well else None)


def make_mirror(rt: Runtime, out: Path) -> CheckpointMirror | None:
    """Rank 0's bucket mirror (trainer.mirror) when a bucket is set, by the config or the environment.

    The run's prefix is its name: ``FORJA_RUN`` (set by forja's launcher), else the run folder's name.
    The run folder's logs go along (``logs/``), and come back at a start on a fresh disk.
    """
    url = bucket_url(rt.config.checkpoint_bucket)
    if url is None or not rt.world.is_main:
        return None
    run = os.environ.get("FORJA_RUN") or out.name
    try:
        mirror = CheckpointMirror(url, run, keep=rt.config.keep_checkpoints, run_dir=out)
    except ValueError as exc:  # FORJA_CHECKPOINT_BUCKET is read here, not by the config's validation
        raise ConfigError([f"checkpoint_bucket: {exc}"]) from None
    mirror.restore_logs()  # before this session writes a line (even a failure's) into the run folder
    return mirror


def _train(
    rt: Runtime,
    out: Path,
    on_step: Callable[[int], None] | None,
    started: float,
    mirror: CheckpointMirror | None = None,
    endpoint: live.LiveMetrics | None = None,
) -> RunResult:
    """One session: set up, resume, loop, summarise. Each part of a step is a function below this one."""
    config, world = rt.config, rt.world
    if world.is_main:
        out.mkdir(parents=True, exist_ok=True)
    if config.compile:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache_dir(config, out)))
    seed_everything(config.seed)

    # -- batch plan (fixed, or found by trial), model, optimizer, precision
    feed, found = batch_plan(rt)
    steps_per_epoch = feed.sampler.steps_per_epoch
    total_steps = config.epochs * steps_per_epoch if config.epochs else config.steps
    net = build_net(rt, feed.plan, total_steps)

    # -- resume from the newest checkpoint that loads (rank 0 reads, everyone receives)
    ckpts = CheckpointManager(out / CHECKPOINTS_DIR, keep=config.keep_checkpoints,
                              allow_legacy=config.allow_legacy_checkpoints)  # fmt: skip
    saved = read_checkpoint(rt, out, ckpts, mirror)
    model_code = model_fingerprint(rt.model_fn)
    feed, oom_fallbacks, oom_restart = keep_oom_lowering(rt, feed, saved)
    resolved = resolve_config(rt, out, feed.plan)
    start = restore(rt, out, saved, resolved, net, model_code, steps_per_epoch)

    # -- run files (rank 0 only): resolved config, metrics (redone steps dropped), events
    # A folder with earlier sessions but no loadable checkpoint is a restart from step 0, not a new run.
    restarted = saved.state is not None or (
        world.is_main and any(True for _ in metrics.read_jsonl(out / EVENTS))
    )
    events, metric_log, lost_steps, wall_s = open_run_files(rt, out, resolved, start, restarted)
    if saved.state is not None:
        rngs = saved.state["rng"]
        set_rng_state(rngs[world.rank] if len(rngs) == world.size else rngs[0])
    p = Parts(
        rt=rt,
        out=out,
        net=net,
        ckpts=ckpts,
        model_code=model_code,
        total_steps=total_steps,
        steps_per_epoch=steps_per_epoch,
        resumed_from=start.step if restarted else None,
        events=events,
        metric_log=metric_log,
        gpu=metrics.GpuProbe(world.device),
        mirror=mirror,
        live=endpoint,
    )
    s = LoopState(
        feed=feed,
        resolved=resolved,
        clock=metrics.Clock(wall_s, start=started),
        step=start.step,
        epoch=start.epoch,
        step_in_epoch=start.step_in_epoch,
        oom_fallbacks=oom_fallbacks,
        judge=Judge(skip_budget=config.skip_nonfinite, bound=config.divergence_loss_bound),
    )
    announce(p, s, found, saved, start, lost_steps, oom_restart)
    if endpoint is not None:
        endpoint.track(total_steps, lambda: metrics.cost_usd(s.clock.total_s(), config.price_per_hour))
        endpoint.progress(s.step)
        endpoint.set_phase("train")

    # -- the loop: micro-batches, optimizer step, agree on stop/save, log, evaluate, checkpoint
    metrics.cpu_utilisation()
    net.model.train()
    s.start_loop()
    vm_end = VmEnd.from_env()  # a Flex-start VM's end: stop (save, mirror) a margin before it
    if vm_end.stale and p.main:
        print(f"ignoring {vm_end.stale}", flush=True)
    with StopRequest() as stop_request:
        while s.step < total_steps:
            loss: torch.Tensor | float | None = None
            try:
                loss = accumulate_gradients(p, s)
            except Exception as exc:
                if not is_oom(exc):
                    raise
                raise_unless_oom_is_recoverable(p, s, exc)
            if loss is None:  # out of memory: handled here, outside the except block that pins the tensors
                recover_from_oom(p, s)
                continue
            verdict = judge_loss(p, s, loss)
            if verdict == "diverged":
                break
            lr = optimizer_step(p, s) if verdict == "ok" else skip_batch(p, s)
            epoch_end = advance(p, s)
            if p.live is not None:
                p.live.progress(s.step)
            if vm_end.due():
                stop_request.request(VM_END)
            stop, timer_due, epoch_due = agree_on_stop_and_saves(p, s, stop_request, epoch_end)
            last_step = s.step == total_steps
            if s.step % config.log_every_steps == 0 or stop or last_step:
                log_step(p, s, loss, lr)
            if every(config.eval_every_steps, s.step) and not (last_step or stop):
                stop = evaluate_between_steps(p, s, stop_request)
            reason = checkpoint_reason(config, s.step, stop, last_step, epoch_due, timer_due)
            if reason is not None:
                save_checkpoint(p, s, reason)
            if on_step is not None:
                on_step(s.step)
            if stop:
                record_stop(p, s, stop_request)
                break

    loop_s = time.monotonic() - s.loop_start
    if s.status == "completed":  # the last step's checkpoint is on disk: a stop now only skips the evaluation
        final_evaluation(p, s)
    if s.status == "completed" and p.main and config.export_model:  # trainer.export: model/ + bucket
        export_model(p, s)
    if p.mirror is not None:
        finish_uploads(p, s)
    summary = write_run_summary(p, s, loop_s) if world.is_main else {}
    if s.divergence is not None and world.is_main:
        log.error("run %s", sentence(s.divergence))
    return RunResult(status=s.status, exit_code=EXIT_CODES[s.status], out_dir=out, summary=summary)


# -- setup ---------------------------------------------------------------------------------------


def make_feed(rt: Runtime, plan: BatchPlan, sampler: ResumableSampler | StreamPosition | None = None) -> Feed:
    """The loader for ``plan``, with its own generator (its sampler made here unless given)."""
    if sampler is None:
        sampler = make_position(rt.train_data, plan, rt.world.rank, rt.config.seed)
    loader, generator = make_loader(rt.train_data, sampler, rt.num_workers, rt.pin_memory, rt.loss_fn.collate)
    return Feed(plan, sampler, loader, generator)


def batch_plan(rt: Runtime) -> tuple[Feed, BatchResult | None]:
    """The batch plan and its loader: a fixed micro-batch, or one found by trial on a throwaway model
    (its RNG use is forked away). An impossible batch for this world size or dataset is a ConfigError."""
    config, world = rt.config, rt.world
    found = None
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
            plan = plan_batches(int(config.batch_size), config.effective_batch_size, world.size)
        sampler = make_position(rt.train_data, plan, world.rank, config.seed)
    except ValueError as exc:  # the user's to fix
        raise ConfigError([str(exc)]) from None
    return make_feed(rt, plan, sampler), found


def build_net(rt: Runtime, plan: BatchPlan, total_steps: int) -> Net:
    """Model (channels-last, compiled, DDP-wrapped as decided), optimizer, LR schedule and precision."""
    config, device = rt.config, rt.world.device
    raw_model = rt.model_fn().to(device)
    if rt.channels_last:
        raw_model = raw_model.to(memory_format=torch.channels_last)
    n_params = sum(p.numel() for p in raw_model.parameters())
    # FLOPs for MFU, counted before DDP wraps the model (its gradient hooks must not see this backward)
    utilisation = measure_utilisation(raw_model, rt, plan.micro_batch)
    model: nn.Module = raw_model
    if config.compile:
        model = torch.compile(model)
    if rt.world.distributed:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = build_optimizer(config, raw_model, device)
    schedule = Schedule(config, optimizer, total_steps)  # before a resume loads the optimizer's LRs
    amp = make_amp(rt.precision, device.type)
    params = [p for p in raw_model.parameters() if p.requires_grad]
    return Net(raw_model, model, params, optimizer, schedule, amp, n_params, utilisation)


def resolve_config(rt: Runtime, out: Path, plan: BatchPlan) -> TrainConfig:
    """The config as this run resolved it (device, precision, batch...): config.yaml and each checkpoint."""
    return rt.config.model_copy(
        update={
            "device": rt.world.device.type,
            "precision": rt.precision,
            "batch_size": plan.micro_batch,
            "effective_batch_size": plan.global_batch,
            "channels_last": rt.channels_last,
            "num_workers": rt.num_workers,
            "pin_memory": rt.pin_memory,
            "out_dir": str(out),
        }
    )


def read_checkpoint(
    rt: Runtime, out: Path, ckpts: CheckpointManager, mirror: CheckpointMirror | None = None
) -> Saved:
    """Rank 0 reads the newest checkpoint that verifies (and an OOM record); every rank receives it.

    With a bucket mirror, the bucket's newest verified checkpoint is pulled first when it is newer
    than the disk's. Raises NoValidCheckpoint (or MirrorUnavailable) on every rank (the others
    would wait in the broadcast otherwise) when checkpoints exist but none verifies and a fresh
    start is not allowed (or the bucket cannot be read and the disk holds none).
    """
    world = rt.world
    state: dict[str, Any] | None = None
    skipped: list[str] = []
    resumed_file, no_valid, oom_record, unavailable = "", None, None, None
    if world.is_main:
        oom_record = read_oom_record(out)
        for stale in ckpts.remove_stale_temporaries():
            log.warning("removed a checkpoint a killed writer left half-written: %s", stale.name)
        try:
            if mirror is not None:
                mirror.sync_at_start(ckpts)
            found_ckpt = ckpts.load_for_resume(rt.config.allow_fresh_start)
        except NoValidCheckpoint as exc:
            found_ckpt, no_valid = None, str(exc)
        except MirrorUnavailable as exc:
            found_ckpt, unavailable = None, str(exc)
        if found_ckpt is not None:
            state, resumed_file = found_ckpt.state, found_ckpt.path.name
            skipped = [p.name for p in found_ckpt.skipped]
            log.info("resuming from %s", resumed_file)
        else:
            skipped = [p.name for p in ckpts.corrupt()]
    if world.distributed:
        box = [(state, no_valid, resumed_file, oom_record, unavailable)]
        torch.distributed.broadcast_object_list(box, src=0)
        state, no_valid, resumed_file, oom_record, unavailable = box[0]
    if no_valid is not None:
        raise NoValidCheckpoint(no_valid)
    if unavailable is not None:
        raise MirrorUnavailable(unavailable)
    return Saved(state, resumed_file, skipped, oom_record)


def keep_oom_lowering(
    rt: Runtime, feed: Feed, saved: Saved
) -> tuple[Feed, list[dict[str, int]], dict[str, Any] | None]:
    """An OOM lowered the micro-batch in an earlier session: starting high again would OOM again.

    The checkpoint keeps it, and under DDP so does the failing rank's record; the lower one is the
    newer (a tie goes to the checkpoint: the record was applied and saved already). Returns the feed
    to use, the fallbacks so far, and the record when it is what lowers the micro-batch now.
    """
    plan = feed.plan
    lowered = newest_oom_lowering(plan.global_batch, saved.state, saved.oom_record)
    if lowered is None or int(lowered["oom_micro_batch"]) >= plan.micro_batch:
        return feed, [], None
    plan = largest_divisor_plan(int(lowered["oom_micro_batch"]), plan.global_batch, rt.world.size)
    log.info("keeping micro-batch %d x %d, lowered after an OOM", plan.micro_batch, plan.accum_steps)
    oom_restart = lowered if lowered is saved.oom_record else None
    return make_feed(rt, plan), list(lowered.get("oom_fallbacks", [])), oom_restart


def restore(
    rt: Runtime,
    out: Path,
    saved: Saved,
    resolved: TrainConfig,
    net: Net,
    model_code: str,
    steps_per_epoch: int | None,
) -> Start:
    """Load the checkpoint into model, optimizer, schedule and scaler; refuse unsafe config changes."""
    state, config = saved.state, rt.config
    if state is None:
        return Start()
    changes = resume_rules.compare(
        state.get("config", {}), resolved.to_dict(), {k: d for k, (d, _) in field_docs().items()}
    )
    if changes.refused and not config.allow_config_change:
        raise ConfigError(resume_rules.refusal(changes, saved.file, str(out)))
    config_changes = changes.allowed + [f"{c} (allowed by allow_config_change)" for c in changes.refused]
    if state.get("model_code") not in (None, model_code):
        config_changes.append("the model's code changed (its parameters still match the checkpoint)")
    for change in config_changes:
        log.warning("resuming with a change since %s: %s", saved.file, change)
    try:
        net.raw_model.load_state_dict(state["model"])
    except RuntimeError as exc:  # missing, unexpected or resized parameters
        raise ConfigError(resume_rules.model_mismatch(exc, saved.file)) from None
    net.optimizer.load_state_dict(state["optimizer"])
    net.schedule.load_state_dict(state.get("scheduler"))
    net.amp.scaler.load_state_dict(state["scaler"])
    step, epoch, step_in_epoch = int(state["step"]), int(state["epoch"]), int(state["step_in_epoch"])
    global_batch = int(resolved.effective_batch_size or 0)
    if int(state.get("global_batch", global_batch)) != global_batch:
        log.warning(
            "the global batch changed since the checkpoint (%s -> %s): resume is not exact",
            state.get("global_batch"),
            global_batch,
        )
    if steps_per_epoch is not None and step_in_epoch >= steps_per_epoch:  # fewer, larger steps now
        epoch, step_in_epoch = epoch + 1, 0
    return Start(step, epoch, step_in_epoch, float(state.get("wall_s", 0.0)), config_changes)


def open_run_files(
    rt: Runtime, out: Path, resolved: TrainConfig, start: Start, restarted: bool
) -> tuple[metrics.JsonLines | None, metrics.JsonLines | None, int, float]:
    """Rank 0 writes config.yaml, drops metrics of steps this session redoes, opens events and metrics.

    Returns (events, metrics, lost steps, wall seconds carried over); the wall time is the most any
    rank knows (the checkpoint's, or the newest metrics line's when that is later).
    """
    events = metric_log = None
    lost_steps, wall_s = 0, start.wall_s
    if rt.world.is_main:
        events = metrics.JsonLines(out / EVENTS)
        (out / CONFIG).write_text(dump(resolved))
        last = metrics.truncate_after(out / METRICS, start.step) if restarted else None
        if last is not None:
            lost_steps = max(0, int(last.get("step", start.step)) - start.step)
            wall_s = max(wall_s, float(last.get("wall_s", 0.0)))
        metric_log = metrics.JsonLines(out / METRICS)
    wall_s = distributed.agree_max(rt.world, [wall_s])[0]
    return events, metric_log, lost_steps, wall_s


def event(p: Parts, s: LoopState, kind: str, **fields: Any) -> None:
    """One line of events.jsonl (rank 0 only), stamped with the time and the step."""
    if p.events is not None:
        p.events.write({"event": kind, "time": time.time(), "step": s.step, **fields})


def announce(
    p: Parts,
    s: LoopState,
    found: BatchResult | None,
    saved: Saved,
    start: Start,
    lost_steps: int,
    oom_restart: dict[str, Any] | None,
) -> None:
    """The session's first events (start, or resume with what it lost) and its one log line."""
    rt, plan = p.rt, s.feed.plan
    world, device = rt.world, rt.world.device
    if rt.world.is_main:
        forget_stop_request(p.out)
    if p.resumed_from is None:
        find = found.to_dict() if found else None
        event(p, s, "start", world_size=world.size, plan=plan.__dict__, params=p.net.n_params,
              precision=rt.precision, device=str(device), find_batch=find,
              utilisation=p.net.utilisation.describe())  # fmt: skip
    else:
        event(p, s, "resume", resumed_from_step=s.step, lost_steps=lost_steps,
              skipped_checkpoints=saved.skipped, world_size=world.size,
              config_changes=start.config_changes)  # fmt: skip
    if oom_restart is not None and s.oom_fallbacks:
        last_oom = s.oom_fallbacks[-1]
        event(p, s, "oom", from_micro_batch=last_oom["from"], micro_batch=plan.micro_batch,
              accum=plan.accum_steps, rank=oom_restart.get("rank"),
              failed_at_step=last_oom["step"])  # fmt: skip
    if p.main:
        log.info(
            "training %s: %s parameters, %s on %s x%d, micro-batch %d x accumulation %d x %d processes = "
            "global batch %d, %d steps (%s per epoch), start at step %d",
            rt.config.model, f"{p.net.n_params:,}", rt.precision, device.type, world.size, plan.micro_batch,
            plan.accum_steps, world.size, plan.global_batch, p.total_steps, p.steps_per_epoch, s.step,
        )  # fmt: skip


# -- one step --------------------------------------------------------------------------------------


def next_batch(p: Parts, s: LoopState) -> Any:
    """The next micro-batch; a stream's pass that ended (always between steps) starts the next pass."""
    assert s.iterator is not None
    batch = next(s.iterator, None)
    if batch is None:
        s.epoch, s.step_in_epoch = s.epoch + 1, 0
        s.iterator = epoch_iterator(s.feed.loader, s.feed.generator, p.config.seed, s.epoch, 0)
        batch = next(s.iterator, None)
        if batch is None:
            raise UserCodeError(
                f"data: {p.config.data} yielded less than one global batch "
                f"({s.feed.plan.global_batch} samples) in a pass"
            )
    return batch


def accumulate_gradients(p: Parts, s: LoopState) -> torch.Tensor | float:
    """Forward and backward over the step's micro-batches; the step's loss (detached, summed).

    Under DDP, gradients are all-reduced on the last micro-batch only (``no_sync`` before it).
    """
    net, plan, device = p.net, s.feed.plan, p.rt.world.device
    ddp = isinstance(net.model, DistributedDataParallel)
    if s.iterator is None:  # at start, after an epoch's end or an OOM: from the position
        s.iterator = epoch_iterator(s.feed.loader, s.feed.generator, p.config.seed, s.epoch, s.step_in_epoch)
    loss_acc: torch.Tensor | float = 0.0
    for micro in range(plan.accum_steps):
        wait_start = time.perf_counter()
        batch = next_batch(p, s)
        s.data_wait += time.perf_counter() - wait_start
        batch = to_device(batch, device, p.rt.channels_last)
        last_micro = micro == plan.accum_steps - 1
        sync = net.model.no_sync() if ddp and not last_micro else contextlib.nullcontext()
        with sync:
            with net.amp.autocast():
                loss = p.rt.loss_fn(net.model, batch).loss
                if plan.accum_steps > 1:
                    loss = loss / plan.accum_steps
            net.amp.scaler.scale(loss).backward()
        loss_acc = loss.detach() if micro == 0 else loss_acc + loss.detach()
    return loss_acc


def raise_unless_oom_is_recoverable(p: Parts, s: LoopState, exc: BaseException) -> None:
    """An OOM this process cannot get past: at micro-batch 1 (the user's to fix), or under DDP.

    Under DDP the peers wait in a collective, so this rank cannot retry alone: it records the lowered
    micro-batch in oom.json and fails; the restart goes on from the newest checkpoint with it.
    """
    plan, world, step = s.feed.plan, p.rt.world, s.step
    if plan.micro_batch == 1:
        raise oom_at_micro_batch_1(step, exc) from exc
    if not world.distributed:
        return
    lower = lower_micro_batch(plan)
    fallback = {"step": step, "from": plan.micro_batch, "to": lower.micro_batch}
    record = {"oom_micro_batch": lower.micro_batch, "global_batch": plan.global_batch,
              "oom_fallbacks": [*s.oom_fallbacks, fallback], "rank": world.rank,
              "error": f"{type(exc).__name__}: {exc}"}  # fmt: skip
    write_oom_record(p.out, record)
    raise RuntimeError(
        f"out of memory on rank {world.rank} at step {step} with micro-batch "
        f"{plan.micro_batch}: recorded in {OOM_RECORD}; the restart goes on from the newest "
        f"checkpoint with {lower.micro_batch} x {lower.accum_steps} accumulation ({exc})"
    ) from exc


def recover_from_oom(p: Parts, s: LoopState) -> None:
    """Alone, after an OOM: the same step again with a smaller micro-batch (same global batch), saved."""
    p.net.optimizer.zero_grad(set_to_none=True)
    free_memory(p.rt.world.device)
    before = s.feed.plan.micro_batch
    s.feed = make_feed(p.rt, lower_micro_batch(s.feed.plan))
    plan = s.feed.plan
    s.iterator = None  # the same step again, its samples split into smaller micro-batches
    s.resolved = s.resolved.model_copy(update={"batch_size": plan.micro_batch})
    s.oom_fallbacks.append({"step": s.step, "from": before, "to": plan.micro_batch})
    log.warning(
        "out of memory at step %d with micro-batch %d: saving, then going on with %d x %d "
        "accumulation (global batch %d unchanged)",
        s.step, before, plan.micro_batch, plan.accum_steps, plan.global_batch,
    )  # fmt: skip
    event(p, s, "oom", from_micro_batch=before, micro_batch=plan.micro_batch, accum=plan.accum_steps)
    save_checkpoint(p, s, "oom")


def judge_loss(p: Parts, s: LoopState, loss: torch.Tensor | float) -> Verdict:
    """The step's verdict on its loss, before the optimizer applies it (trainer.divergence): "ok",
    "skip" (a bad batch within skip_nonfinite) or "diverged" (the loop stops; nothing is saved).

    On the steps checked (check_finite_every_steps) this is a host sync and, under DDP, one tiny
    all-reduce, so every rank reaches the same verdict on the mean loss.
    """
    step = s.step + 1  # the optimizer step this loss would make
    if not every(p.config.check_finite_every_steps, step):
        return "ok"
    world = p.rt.world
    value = distributed.sum_over_ranks(world, [float(loss)])[0] / world.size
    verdict = s.judge.judge(step, value)
    if verdict == "skip":
        log.warning("step %d: loss is %s; batch skipped (%d of skip_nonfinite %d)",
                    step, finite.word(value), len(s.judge.skipped), s.judge.skip_budget)  # fmt: skip
        event(p, s, "skip_nonfinite", step=step, loss=finite.word(value), skipped=len(s.judge.skipped))
    elif verdict == "diverged":
        s.status = "diverged"
        s.final_loss = value
        s.divergence = s.judge.stop(step, value, p.ckpts, p.main)
        event(p, s, "diverged", **s.divergence)
    return verdict


def skip_batch(p: Parts, s: LoopState) -> float:
    """A bad batch skipped: its gradients dropped, no update; the schedule still moves on with the step."""
    net = p.net
    lr = net.schedule.set_lr(s.step)
    net.optimizer.zero_grad(set_to_none=True)
    net.schedule.step()
    return lr


def optimizer_step(p: Parts, s: LoopState) -> float:
    """Set this step's LR, clip (unscaled) gradients, step and clear them; returns the LR."""
    net, config = p.net, p.config
    lr = net.schedule.set_lr(s.step)
    if config.grad_clip > 0:
        net.amp.scaler.unscale_(net.optimizer)
        clip_gradients(net.params, config.grad_clip, p.rt.world.device)
    net.amp.scaler.step(net.optimizer)
    net.amp.scaler.update()
    net.schedule.step()
    net.optimizer.zero_grad(set_to_none=True)
    return lr


def advance(p: Parts, s: LoopState) -> bool:
    """Count the step done; True when it ended an epoch (the next step starts the next epoch's iterator)."""
    s.step += 1
    s.step_in_epoch += 1
    if s.step_in_epoch != p.steps_per_epoch:
        return False
    s.epoch, s.step_in_epoch, s.iterator = s.epoch + 1, 0, None
    return True


def agree_on_stop_and_saves(
    p: Parts, s: LoopState, stop_request: StopRequest, epoch_end: bool
) -> tuple[bool, bool, bool]:
    """(stop, timer save, epoch save), the same on every rank: one tiny all-reduce per step.

    Stop: any rank got SIGTERM. Timer: rank 0's checkpoint_every_s elapsed. Epoch: an epoch ended and
    checkpoint_min_interval_s passed (a small dataset's epochs come every second or so: no point
    hitting the disk that often).
    """
    config = p.config
    since_ckpt = time.monotonic() - s.last_ckpt_time
    timer_due = p.main and config.checkpoint_every_s > 0 and since_ckpt >= config.checkpoint_every_s
    epoch_due = p.main and epoch_end and since_ckpt >= config.checkpoint_min_interval_s
    stop, timer, epoch = distributed.agree_max(
        p.rt.world, [float(stop_request.requested), float(timer_due), float(epoch_due)]
    )
    return stop > 0, timer > 0, epoch > 0


def log_step(p: Parts, s: LoopState, loss: torch.Tensor | float, lr: float) -> None:
    """A metrics.jsonl line and a progress line (rank 0) over the window since the last log step.

    A host sync: the loss is averaged over ranks here (and at the divergence check), not every step.
    """
    world, plan = p.rt.world, s.feed.plan
    loss_mean = distributed.sum_over_ranks(world, [float(loss)])[0] / world.size
    s.final_loss = loss_mean
    steps_done = max(1, s.step - s.window_step)
    elapsed = time.perf_counter() - s.window_start
    wall = s.clock.total_s()
    record: dict[str, Any] = {
        "step": s.step,
        "loss": loss_mean,
        "lr": lr,
        "samples_per_s": steps_done * plan.global_batch / max(elapsed, 1e-9),
        "step_time_s": elapsed / steps_done,
        "data_wait_s": s.data_wait / steps_done,
        "gpu_mem_gb": p.gpu.peak_memory_gb(),
        "gpu_util": p.gpu.utilisation(),
        "cpu_util": metrics.cpu_utilisation(),
        "cost_usd": metrics.cost_usd(wall, p.config.price_per_hour),
        "wall_s": wall,
        "time": time.time(),
        "epoch": s.epoch,
    }
    figures = p.net.utilisation.figures(record["samples_per_s"])
    record.update((k, v) for k, v in figures.items() if v is not None)
    if p.metric_log is not None:
        p.metric_log.write(record)
        rate = (s.step - s.loop_start_step) / max(time.monotonic() - s.loop_start, 1e-9)
        eta = (p.total_steps - s.step) / rate if rate else None
        print(metrics.progress_line(record, p.total_steps, eta), flush=True)
        if p.live is not None:
            p.live.logged(loss_mean, record["samples_per_s"], eta, s.data_wait, record)
    s.window_start, s.window_step, s.data_wait = time.perf_counter(), s.step, 0.0


def eval_batch_size(p: Parts, s: LoopState) -> int:
    return p.config.eval_batch_size or s.feed.plan.micro_batch


def evaluate_between_steps(p: Parts, s: LoopState, stop_request: StopRequest) -> bool:
    """Evaluate now; True when a SIGTERM came during it (save now, evaluate after the restart)."""
    began = time.monotonic()  # the event's `seconds`: evaluation in a run's cost (forja.cost.run)
    evaluated = evaluate(p.net.model, p.rt, eval_batch_size(p, s), stop_check(p.rt.world, stop_request),
                         eval_progress(p))  # fmt: skip
    if p.live is not None:
        p.live.set_phase("train")
    if evaluated is None:
        event(p, s, "eval_abandoned")
        return True
    s.eval_result = evaluated
    event(p, s, "eval", seconds=round(time.monotonic() - began, 4), **evaluated)
    return False


def eval_progress(p: Parts) -> Callable[[], None] | None:
    """What an evaluation calls per batch: the live endpoint's progress (and its 'eval' phase), if any."""
    if p.live is None:
        return None
    p.live.set_phase("eval")
    return p.live.progress


def every(interval: int | None, step: int) -> bool:
    """Whether ``step`` falls on an interval (0 or None: never)."""
    return bool(interval) and step % interval == 0


def checkpoint_reason(
    config: TrainConfig, step: int, stop: bool, last_step: bool, epoch_due: bool, timer_due: bool
) -> str | None:
    """Why to save after this step (the first reason that holds), or None to go on."""
    interval = every(config.checkpoint_every_steps, step)
    reasons = {"stop": stop, "final": last_step, "epoch": epoch_due, "interval": interval, "timer": timer_due}
    return next((name for name, hit in reasons.items() if hit), None)


def save_checkpoint(p: Parts, s: LoopState, reason: str) -> None:
    """Every rank's RNG state to rank 0, which writes the checkpoint atomically (trainer.checkpoint)."""
    rngs = distributed.gather_objects(p.rt.world, rng_state())
    if p.main:
        net, plan = p.net, s.feed.plan
        write_start = time.monotonic()
        path = p.ckpts.save(
            {
                "step": s.step,
                "epoch": s.epoch,
                "step_in_epoch": s.step_in_epoch,
                "model": net.raw_model.state_dict(),
                "optimizer": net.optimizer.state_dict(),
                "scaler": net.amp.scaler.state_dict(),
                "scheduler": net.schedule.state_dict(),
                "rng": rngs,
                "config": s.resolved.to_dict(),
                "global_batch": plan.global_batch,
                "world_size": p.rt.world.size,
                "wall_s": s.clock.total_s(),
                "model_code": p.model_code,
                "oom_micro_batch": plan.micro_batch if s.oom_fallbacks else 0,
                "oom_fallbacks": s.oom_fallbacks,
                "torch_version": str(torch.__version__),
                "trainer_version": __version__,
            },
            s.step,
        )
        write_s = round(time.monotonic() - write_start, 4)
        if p.mirror is not None:  # hands the file to the upload thread: microseconds, never the upload
            p.mirror.submit(path, s.step)
        event(p, s, "checkpoint", reason=reason, path=path.name, write_s=write_s)
    s.last_saved, s.last_ckpt_time = s.step, time.monotonic()


def record_stop(p: Parts, s: LoopState, stop_request: StopRequest) -> None:
    """Stopped by a signal (here or on a peer) after the save: the run is 'preempted', to be resumed."""
    s.status = "preempted"
    s.stopped_by = stop_request.signal_name or "peer"
    received = stop_request.received_at
    event(p, s, "preempt", signal=stop_request.signal_name or "peer", saved_step=s.last_saved,
          seconds_to_save=time.monotonic() - received if received else None,
          **stopped_by(p.out))  # fmt: skip


# -- the end ---------------------------------------------------------------------------------------


def final_evaluation(p: Parts, s: LoopState) -> None:
    """Evaluate the finished run; a SIGTERM now leaves it 'preempted' (the restart finds the final
    checkpoint and evaluates)."""
    began = time.monotonic()
    with StopRequest() as final_stop:
        evaluated = evaluate(p.net.model, p.rt, eval_batch_size(p, s), stop_check(p.rt.world, final_stop),
                             eval_progress(p))  # fmt: skip
    if evaluated is None:
        s.status = "preempted"
        signal_name = final_stop.signal_name or "peer"
        event(p, s, "preempt", signal=signal_name, saved_step=s.last_saved, during="evaluation",
              **stopped_by(p.out))  # fmt: skip
    else:
        s.eval_result = evaluated
        event(p, s, "finish", seconds=round(time.monotonic() - began, 4), **evaluated)


def export_model(p: Parts, s: LoopState) -> None:
    """The finished model as safetensors + model.json in ``out/model/``, and beside the bucket's
    checkpoints (trainer.export); the ``export`` event says where, or why not (never fails the run)."""
    url = bucket_url(p.config.checkpoint_bucket) if p.mirror is not None else None
    ckpt_files = p.ckpts.list()
    if p.live is not None:  # the stall detector's clock starts afresh for the export and its upload
        p.live.progress()
    record = export_at_end(p.out, p.net.raw_model.state_dict(), s.resolved.to_dict(), s.step,
                           ckpt_files[-1].name if ckpt_files else None, url)  # fmt: skip
    event(p, s, "export", **record)
    if record.get("nonfinite_tensors"):  # a finite loss, but the last update broke the weights
        s.status = "diverged"
        good = good_checkpoint(p.ckpts.list(), s.judge.last_finite_step)
        s.divergence = weights_record(s.step, record["nonfinite_tensors"], good)
        event(p, s, "diverged", **s.divergence)


def finish_uploads(p: Parts, s: LoopState) -> None:
    """Wait (bounded) for the last checkpoint's upload, and say in events.jsonl what reached the bucket.

    A preempted run waits less: its VM is about to go (trainer.mirror.PREEMPTED_UPLOAD_WAIT_S). One
    stopped ahead of its VM's known end (VM_END) has its margin for the upload, and waits in full.
    Under DDP the peers wait for rank 0 in a collective meanwhile: at most half their timeout.
    """
    assert p.mirror is not None
    wait_s = p.config.checkpoint_upload_wait_s
    if s.status != "completed" and s.stopped_by != VM_END:
        wait_s = min(wait_s, PREEMPTED_UPLOAD_WAIT_S)
    if p.rt.world.distributed:
        wait_s = min(wait_s, p.config.ddp_timeout_s / 2)
    complete = p.mirror.close(wait_s)
    stats = p.mirror.stats
    event(p, s, "mirror", bucket=p.mirror.url, complete=complete, uploaded_steps=stats.uploaded,
          superseded_steps=stats.superseded, failed_attempts=stats.failed_attempts,
          last_error=stats.last_error)  # fmt: skip


def write_run_summary(p: Parts, s: LoopState, loop_s: float) -> dict[str, Any]:
    """Rank 0: close the run files, write summary.json (every field of trainer.summary) and the plots."""
    from trainer.report import render, write_summary

    assert p.metric_log is not None and p.events is not None
    p.metric_log.close()
    p.events.close()
    rt, plan = p.rt, s.feed.plan
    samples_per_s = (s.step - s.loop_start_step) * plan.global_batch / max(loop_s, 1e-9)
    past = history(p.out / EVENTS)
    ckpt_files = p.ckpts.list()
    wall_s = s.clock.total_s()  # read once: the summary's cost is exactly its wall time at the rate
    summary = Summary(
        status=s.status,
        steps=s.step,
        total_steps=p.total_steps,
        final_loss=s.final_loss,
        accuracy=s.eval_result.get("accuracy"),
        eval_loss=s.eval_result.get("eval_loss"),
        samples_per_s=samples_per_s,
        wall_s=wall_s,
        cost_usd=metrics.cost_usd(wall_s, p.config.price_per_hour),
        resumed_from_step=p.resumed_from,
        lost_steps=past["lost_steps"],
        preemptions=past["preemptions"],
        stops=past["stops"],
        restarts=past["restarts"],
        last_checkpoint=ckpt_files[-1].name if ckpt_files else None,
        best_checkpoint=ckpt_files[-1].name if ckpt_files else None,
        params=p.net.n_params,
        precision=rt.precision,
        device=str(rt.world.device),
        world_size=rt.world.size,
        micro_batch=plan.micro_batch,
        accum_steps=plan.accum_steps,
        global_batch=plan.global_batch,
        flops_per_sample=p.net.utilisation.flops_per_sample,
        **p.net.utilisation.figures(samples_per_s),
        **p.net.utilisation.describe(),
        startup_s=round(s.loop_start - s.clock.start, 3),
        step_s=loop_s / (s.step - s.loop_start_step) if s.step > s.loop_start_step else None,
        **metrics.measured_memory(rt.world.device),
        oom_fallbacks=s.oom_fallbacks,
        exit_code=EXIT_CODES[s.status],
        error=sentence(s.divergence) if s.divergence is not None else None,
        divergence=s.divergence,
        time=time.time(),
    ).to_dict()
    write_summary(p.out, summary)
    # a run that diverged before its first log step has no metrics to draw
    if p.config.render_plots and metrics.logged_any(p.out / METRICS):
        try:
            render(p.out)
        except Exception as exc:  # plots are insight; a missing matplotlib must not fail a finished run
            log.warning("plots not rendered (%s); `python -m trainer report --run DIR` draws them", exc)
    return summary
