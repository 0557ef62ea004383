"""find-batch: the largest micro-batch that survives a full training step, found in few trials.

Why grow-then-bisect: shrinking by 0.9 from 128 needs 25 trials (24 OOMs) to reach the user's
true limit of 6, and halving misses it (answers 4). Doubling from 1 then bisecting finds 6 exactly in
6 trials. Each trial runs forward, backward *and* two optimizer steps, because AdamW allocates its
8 bytes per parameter at the first step and a forward-only probe underestimates. An OOM is
handled outside the ``except`` block (the traceback's frames hold the tensors), then the cache is
emptied, so one failed trial cannot poison the next. Under DDP every rank must use the same
micro-batch, so the answer is the minimum over ranks.

Results are cached per model *code* (the source files of the model's classes and its parameter
shapes, not only its import path: a model grown from 7.6k to 4.8M parameters once reused the old
answer, which on a GPU means an OOM at start and a restart loop), config, device and dtype, and per
optimizer (its state is part of the peak: AdamW holds 8 bytes a parameter, SGD without momentum
none) and collate and loss (a collate decides what a batch holds, e.g. its padded length), each by
name, arguments and the code of the user's own file. The
plan keeps ``find_batch_margin`` below the largest batch that fit when memory was the limit
(allocator fragmentation and longer batches later in a run need room). ``batch_size: auto`` never
makes an epoch shorter than ``min_steps_per_epoch`` steps: on a CPU nothing runs out of memory, and
the digits demo once became full-batch training (1 step per epoch, 36 s instead of 1.4 s).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset, default_collate

from trainer import distributed
from trainer.batches import Objective, to_device
from trainer.config import TrainConfig
from trainer.data import BatchPlan, largest_divisor_plan, sized_len, take_samples
from trainer.imports import load_callable
from trainer.optim import build_optimizer
from trainer.precision import make_amp
from trainer.run_folder import write_atomic

log = logging.getLogger(__name__)

OOM_MARKERS = (" out of memory", "DefaultCPUAllocator: can't allocate memory", "CUDNN_STATUS_NOT_SUPPORTED")


def is_oom(exc: BaseException) -> bool:
    """CUDA/CPU allocator exhaustion (by type, or by the allocators' messages for older builds)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in OOM_MARKERS)


@dataclass
class Search:
    """Outcome of a search: the largest size that fit (0: none did) and every trial in order."""

    best: int
    trials: list[tuple[int, bool]] = field(default_factory=list)


def grow_then_bisect(fits: Callable[[int], bool], cap: int, start: int = 1) -> Search:
    """Double from ``start`` until a size fails (or ``cap``), then bisect between the last fit and it."""
    result = Search(best=0)

    def trial(size: int) -> bool:
        ok = fits(size)
        result.trials.append((size, ok))
        return ok

    good, bad, size = 0, None, max(1, min(start, cap))
    while True:
        if trial(size):
            good = size
            if size >= cap:
                break
            size = min(size * 2, cap)
        else:
            bad = size
            break
    if bad is not None:
        while bad - good > 1:
            middle = (good + bad) // 2
            if trial(middle):
                good = middle
            else:
                bad = middle
    result.best = good
    return result


def sample_batch(
    dataset: Any,
    size: int,
    device: torch.device,
    channels_last: bool,
    collate: Callable[[list[Any]], Any] | None = None,
) -> Any:
    """``size`` real samples (cycling through smaller data), collated as in training, on ``device``.

    It keeps the batch's structure (a tuple, a dict of tensors...): the objective decides what goes
    into the model (:class:`trainer.batches.Objective`).
    """
    if collate is None and isinstance(dataset, TensorDataset):
        index = torch.as_tensor([i % len(dataset) for i in range(size)])
        batch: Any = tuple(t[index] for t in dataset.tensors)
    else:
        batch = (collate or default_collate)(take_samples(dataset, size))
    return to_device(batch, device, channels_last)


def free_memory(device: torch.device, collect: bool = True) -> None:
    """Return cached blocks to the device; ``collect`` also breaks reference cycles (slow: after OOMs)."""
    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class StepTrial:
    """One real training step (x2) at a given micro-batch on a throwaway model: does it fit?"""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Objective,
        dataset: Any,
        device: torch.device,
        precision: str,
        channels_last: bool,
        lr: float,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        self.model, self.loss_fn, self.dataset, self.device = model, loss_fn, dataset, device
        self.channels_last = channels_last
        self.amp = make_amp(precision, device.type)
        # the run's own optimizer when given: its state (AdamW 8 B/param, SGD 0-4) is part of the peak
        self.optimizer = optimizer if optimizer is not None else torch.optim.AdamW(model.parameters(), lr=lr)
        self.peak_bytes: dict[int, int] = {}

    def _step(self, size: int) -> None:
        batch = sample_batch(self.dataset, size, self.device, self.channels_last, self.loss_fn.collate)
        with self.amp.autocast():
            loss = self.loss_fn(self.model, batch).loss
        self.amp.scaler.scale(loss).backward()
        self.amp.scaler.step(self.optimizer)
        self.amp.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def __call__(self, size: int) -> bool:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        failed = False
        try:
            self._step(size)
            self._step(size)
        except Exception as exc:
            if not is_oom(exc):
                raise
            failed = True  # leave the except block first: its traceback pins the batch's tensors
        if failed:
            self.optimizer.zero_grad(set_to_none=True)
            free_memory(self.device)
            log.info("find-batch: %d does not fit", size)
            return False
        if self.device.type == "cuda":
            self.peak_bytes[size] = torch.cuda.max_memory_reserved(self.device)
        free_memory(self.device, collect=False)  # a trial that fit left no cycles behind
        log.info("find-batch: %d fits", size)
        return True


@dataclass
class BatchResult:
    """What find-batch reports: the limit, the plan that reaches the effective batch, how it was found.

    ``max_micro_batch`` is the largest micro-batch that fit (or the cap, when nothing failed);
    ``usable_micro_batch`` is what the plan may use: ``find_batch_margin`` below it when memory was
    the limit (``limited_by: memory``), the same when the cap was (``limited_by: cap``).
    """

    max_micro_batch: int
    plan: dict[str, int]
    trials: list[tuple[int, bool]]
    from_cache: bool
    cache_key: str
    device: str
    precision: str
    usable_micro_batch: int = 0
    margin: float = 0.0
    limited_by: str = "cap"
    cap: int = 0
    #: Each trial that fit on a GPU: its measured max_memory_reserved in MiB, by micro-batch (what
    #: `python -m trainer plan` predicts, to compare; empty on a CPU, whose allocator keeps no peak).
    peak_reserved_mib: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _source_file(cls: type) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except TypeError:  # a class defined in C, or in a REPL
        return None


def _user_files(classes: Any) -> set[str]:
    """Source files of ``classes`` outside torch (torch's own code is keyed by its version)."""
    torch_root = os.path.dirname(torch.__file__)
    files: set[str] = set()
    for cls in classes:
        path = _source_file(cls) if getattr(cls, "__module__", None) in sys.modules else None
        if path and not path.startswith(torch_root):
            files.add(path)
    return files


def _hash_files(digest: Any, files: set[str]) -> None:
    """The files' contents, not their paths: a project moved to another folder or host is the same code
    (same cached batch, and a resume there does not report the model's code as changed)."""
    contents: list[str] = []
    for path in files:
        try:
            contents.append(hashlib.sha256(Path(path).read_bytes()).hexdigest())
        except OSError:
            continue
    for content in sorted(contents):
        digest.update(content.encode())


def _code_of(obj: Any) -> list[Any]:
    """What defines a callable: a function (unwrapped from ``functools.partial``) or a class and its bases."""
    while hasattr(obj, "func") and callable(obj.func):  # functools.partial
        obj = obj.func
    if inspect.isclass(obj):
        return list(obj.__mro__)
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return [obj]
    return list(type(obj).__mro__)  # an instance: a collate or loss class built with its *_args


def objective_fingerprint(config: TrainConfig, loss_fn: Objective) -> str:
    """The code of the user's optimizer (when given by path), collate and loss (torch's own left out).

    Their names and arguments are in :func:`cache_key` already; this catches an edited file at the
    same path, as :func:`model_fingerprint` does for the model.
    """
    parts: list[Any] = []
    if ":" in config.optimizer:  # a torch.optim name is torch's code, keyed by torch's version
        parts += _code_of(load_callable(config.optimizer, "optimizer", config.project_dir))
    for built in (loss_fn.collate, loss_fn.loss):
        if built is not None:
            parts += _code_of(built)
    files = _user_files(parts)
    if not files:
        return ""
    digest = hashlib.sha256()
    _hash_files(digest, files)
    return digest.hexdigest()[:16]


def model_fingerprint(model_fn: Callable[[], nn.Module]) -> str:
    """The model's code and shape: the source files of its factory and classes (torch's own left out),
    the class of every submodule, and parameter shapes.

    The factory's file and the submodule classes count because a factory function that assembles
    torch's own layers (``nn.Sequential(..., nn.ReLU(), ...)``) has no class of the user's: an edit
    that keeps every shape (ReLU to GELU, a Dropout added) changes memory and must not look unchanged.
    Built on the meta device: no memory, no compute, no draw from the random generators. A factory
    that cannot build there is fingerprinted by the classes it could not build: nothing (the key then
    still holds the model's import path and arguments).
    """
    digest = hashlib.sha256()
    try:
        with torch.device("meta"):
            model = model_fn()
    except Exception as exc:
        log.info("find-batch: the model does not build on the meta device (%s); keyed on its path", exc)
        return "unbuildable"
    # runtime.prepare passes partial(build_model, factory, path, args): the factory is the user's code
    factories = (
        [a for a in model_fn.args if callable(a)] if isinstance(model_fn, functools.partial) else [model_fn]
    )
    classes = [cls for module in model.modules() for cls in type(module).__mro__]
    _hash_files(digest, _user_files([c for f in factories for c in _code_of(f)] + classes))
    for name, module in model.named_modules():
        digest.update(f"{name}:{type(module).__module__}.{type(module).__qualname__};".encode())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
    return digest.hexdigest()[:16]


def search_cap(config: TrainConfig, dataset_length: int, world: int) -> int:
    """The largest micro-batch worth trying: ``max_batch_size``, the data, and an epoch of enough steps.

    Without an ``effective_batch_size`` the micro-batch *is* the global batch (per process), so it
    is also held to ``dataset_length / (world x min_steps_per_epoch)``.
    """
    per_rank = dataset_length // world
    if config.effective_batch_size is None:
        per_rank = dataset_length // (world * config.min_steps_per_epoch)
    return max(1, min(config.max_batch_size, per_rank))


def cache_key(
    config: TrainConfig,
    device: torch.device,
    precision: str,
    channels_last: bool,
    world: int,
    model_code: str = "",
    cap: int = 0,
    objective_code: str = "",
) -> str:
    """Identity of a search: model (path, arguments, code), data, optimizer, collate and loss (name,
    arguments, code), device, dtype, layout, cap, world, torch."""
    ident = {
        "model": config.model,
        "model_code": model_code,
        "cap": cap,
        "model_args": config.model_args,
        "data": config.data,
        "data_args": config.data_args,
        "loss": config.loss,
        "loss_args": config.loss_args,
        "label_key": config.label_key,
        "collate": config.collate,
        "collate_args": config.collate_args,
        "optimizer": config.optimizer,
        "optimizer_args": config.optimizer_args,
        "weight_decay": config.weight_decay,
        "betas": config.betas,
        "objective_code": objective_code,
        "device": device_name(device),
        "precision": precision,
        "channels_last": channels_last,
        "compile": config.compile,
        "memory_fraction": config.memory_fraction,
        "max_batch_size": config.max_batch_size,
        "world": world,
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _cache_file(config: TrainConfig) -> Path:
    return Path(os.path.expanduser(config.cache_dir)) / "find_batch.json"


def read_cache(config: TrainConfig, key: str) -> tuple[int, bool] | None:
    """(largest micro-batch that fit, whether memory was the limit) for ``key``, if cached."""
    try:
        value = json.loads(_cache_file(config).read_text()).get(key)
    except (OSError, ValueError):
        return None
    if not (isinstance(value, dict) and "max_micro_batch" in value):
        return None
    return int(value["max_micro_batch"]), value.get("limited_by") == "memory"


def write_cache(config: TrainConfig, key: str, result: dict[str, Any]) -> None:
    path = _cache_file(config)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
        table[key] = result
        write_atomic(path, json.dumps(table, indent=1, sort_keys=True))
    except OSError as exc:  # a read-only home must not fail training
        log.warning("find-batch: cannot write cache %s (%s)", path, exc)


def find_batch(
    config: TrainConfig,
    world: distributed.World,
    model_fn: Callable[[], nn.Module],
    loss_fn: Objective,
    train_data: Any,
    precision: str,
    channels_last: bool,
    use_cache: bool = True,
) -> BatchResult:
    """Search (or recall) the largest micro-batch, agree on the minimum over ranks, plan accumulation."""
    length = sized_len(train_data)  # None for a stream: only max_batch_size caps the search
    cap = search_cap(config, length, world.size) if length is not None else config.max_batch_size
    code = model_fingerprint(model_fn)
    objective_code = objective_fingerprint(config, loss_fn)
    key = cache_key(config, world.device, precision, channels_last, world.size, code, cap, objective_code)
    cached = read_cache(config, key) if use_cache else None
    trials: list[tuple[int, bool]] = []
    peaks: dict[int, float] = {}
    if cached is not None:
        local_best, local_oom = cached
    else:
        with torch.random.fork_rng(devices=[world.device] if world.device.type == "cuda" else []):
            model = model_fn().to(world.device)
            if channels_last:
                model = model.to(memory_format=torch.channels_last)
            optimizer = build_optimizer(config, model, world.device)
            trial = StepTrial(
                model, loss_fn, train_data, world.device, precision, channels_last, config.lr, optimizer
            )
            search = grow_then_bisect(trial, cap)
            peaks = {size: nbytes / 2**20 for size, nbytes in trial.peak_bytes.items()}
            del trial, model, optimizer
            free_memory(world.device)
        local_best, trials = search.best, search.trials
        local_oom = any(not ok for _, ok in trials)
    best = distributed.agree_min_int(world, local_best)
    memory_limited = distributed.agree_max(world, [float(local_oom)])[0] > 0
    if best < 1:
        raise RuntimeError(
            "find-batch: not even a micro-batch of 1 fits in device memory (use a smaller model, "
            "precision bf16/fp16, or a larger GPU)"
        )
    margin = config.find_batch_margin if memory_limited else 0.0
    usable = max(1, int(best * (1.0 - margin)))
    plan: BatchPlan = largest_divisor_plan(usable, config.effective_batch_size, world.size)
    result = BatchResult(
        max_micro_batch=best,
        plan={
            "micro_batch": plan.micro_batch,
            "accum_steps": plan.accum_steps,
            "world_size": plan.world_size,
            "global_batch": plan.global_batch,
        },
        trials=trials,
        from_cache=cached is not None,
        cache_key=key,
        device=device_name(world.device),
        precision=precision,
        usable_micro_batch=usable,
        margin=margin,
        limited_by="memory" if memory_limited else "cap",
        cap=cap,
        peak_reserved_mib=peaks,
    )
    if cached is None and world.local_rank == 0:
        write_cache(
            config,
            key,
            {
                "max_micro_batch": best,
                "limited_by": result.limited_by,
                "device": result.device,
                "precision": precision,
                "model": config.model,
            },
        )
    return result


def _peak(result: BatchResult, size: int) -> str:
    return f" ({result.peak_reserved_mib[size]:,.0f} MiB)" if size in result.peak_reserved_mib else ""


def format_result(result: BatchResult) -> str:
    """The finder's answer for a person: the limit, how it was found, and the plan that uses it."""
    plan = result.plan
    tried = ", ".join(
        f"{size}{'' if ok else ' OOM'}{_peak(result, size)}" for size, ok in result.trials
    ) or "none (cached)"
    return "\n".join(
        [
            f"device            {result.device} ({result.precision})",
            f"largest micro-batch that fits   {result.max_micro_batch}"
            + ("   [from cache]" if result.from_cache else "")
            + (
                f" (limited by memory; {result.margin:.0%} margin: use {result.usable_micro_batch})"
                if result.limited_by == "memory"
                else f" (limited by the cap {result.cap}: max_batch_size, data size, min_steps_per_epoch)"
            ),
            f"trials            {tried}",
            f"plan              micro-batch {plan['micro_batch']} x accumulation {plan['accum_steps']} "
            f"x {plan['world_size']} process(es) = global batch {plan['global_batch']}",
        ]
    )
