"""``plan``: the peak memory, the largest micro-batch and the step time on a GPU, predicted on a CPU.

Why trace instead of measure: the GPU is what costs money, and the question "does batch 6 fit on an
L4" should be answered before renting one. One whole training step (forward, backward, gradient
clipping, optimizer step) runs under ``FakeTensorMode``: every tensor has its shape, dtype and
storage but no memory, so a 124M-parameter model costs nothing to trace. PyTorch's own
``MemTracker`` follows every storage that lives during the step and gives its peak; the run's
precision (autocast) and optimizer are the run's. The target GPU's constants (``trainer/gpus.yaml``:
usable memory, CUDA context, allocator overhead, measured ceilings) turn the traced peak into what
``nvidia-smi`` would show, and the step's operations into a time: each op takes the longer of its
FLOPs (torch.utils.flop_counter's formulas) over the GPU's *measured* matmul rate and its bytes over
the memory bandwidth, plus a launch; the host's own per-op time bounds a small model from below.

When the plan runs on the device it targets (``--gpu cpu``, or the bench on a lent GPU), no rate is
assumed: one rate does not describe a device (a CPU multiplies 64-wide matrices at a fraction of its
256-wide rate, runs bf16 attention backward at a tenth of it and GELU far below its bandwidth). Each
op of the traced step is timed there alone, at its own shapes and dtypes (a short microbenchmark,
cached per device, thread count and torch version in ``cache_dir``/plan_ops.json; on a GPU the
matmuls, convolutions and attention, the rest staying roofline). On a CPU, whose kernels branch on
values (a max-pool over MNIST's blank borders runs three times faster than over noise), each op is
timed on the values it had in one real step of two samples, repeated to its shapes; elsewhere on
random ones. What the host spends around the ops (Python, modules, autograd, the optimizer's loop,
weights read cold) is measured per op call and phase: on a CPU on that same real step of the model,
elsewhere on a small probe model with the run's precision and optimizer. On a CPU with one torch
thread both are timed in the process's CPU time, so a machine others load moves them less.

What is traced on the CPU stands in for the GPU: the tensors autograd keeps are the same, but the
kernels differ (SDPA's CPU kernel keeps the same log-sum-exp as flash attention; fused AdamW keeps
no temporaries, the traced per-parameter loop keeps one parameter's worth). Where fake tensors cannot
follow the model (a custom kernel, ``.item()`` deciding the control flow), the layer is named and
the plan falls back to the hook measurement of :mod:`trainer.estimate` on real CPU tensors. Every
figure says whether it was traced, measured or modelled, and how sure it is.

Standalone like the rest of the trainer: forja passes nothing but the config and the GPU's name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from trainer.config import ConfigError, TrainConfig
from trainer.gpus import MIB, GpuSpec, gpu_table, named

log = logging.getLogger(__name__)

#: Micro-batch sizes shown in the table (those above the largest that fits are left out).
TABLE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: Ops that move no data and launch nothing: their outputs alias their inputs or are metadata
#: (besides every op torch marks a view, and the ``prim`` namespace: ``prim.device``, sizes).
FREE_OPS = frozenset({
    "detach", "lift_fresh", "empty", "empty_strided", "_local_scalar_dense", "alias", "_unsafe_view",
    "view", "_reshape_alias", "reshape", "unsqueeze", "squeeze", "t", "transpose", "permute", "expand",
    "slice", "select", "split", "split_with_sizes", "unbind", "as_strided", "set_", "is_same_size",
})  # fmt: skip
#: How sure each kind of figure is (checked by bench/plan_accuracy.py; widened where the constants
#: are modelled rather than measured on the target).
SURE = {"traced": 0.10, "measured": 0.05, "modelled": 0.25, "fallback": 0.20, "calibrated": 0.05}


class PlanError(ConfigError):
    """A plan that cannot be made as asked: the message names what to change."""


# -- the GPU table: trainer/gpus.py reads it; the plan adds this machine's CPU and files ----------


def find_gpu(name: str) -> GpuSpec:
    """The GPU called ``name`` (catalog name or alias, any case), ``cpu`` for this machine, or a YAML
    file holding one entry of the table's form."""
    if name.lower() == "cpu":
        return cpu_spec()
    path = Path(name).expanduser()
    if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
        entry = yaml.safe_load(path.read_text())
        try:
            return GpuSpec(**{"name": path.stem, **entry, "aliases": tuple(entry.get("aliases", ()))})
        except TypeError as exc:
            problem = f"--gpu: {path} is not a GPU entry like those of trainer/gpus.yaml ({exc})"
            raise PlanError([problem]) from None
    spec = named(name)
    if spec is not None:
        return spec
    table = gpu_table()
    known = ", ".join(f"{s.aliases[0] if s.aliases else s.name}" for s in table.values())
    raise PlanError([f"--gpu: {name!r} is not a GPU the plan knows (known: {known}, cpu; or a YAML file)"])


def clock(device: str = "cpu") -> Callable[[], float]:
    """The clock to time work on ``device`` with. On a CPU running torch on one thread, the process's
    CPU time: what the work would take on a quiet machine, whatever else shares it (other processes'
    turns are not counted); the wall clock elsewhere (a GPU's sync, several threads)."""
    if device == "cpu" and torch.get_num_threads() == 1:
        return time.process_time
    return time.perf_counter


def _timed(fn: Callable[[], Any], seconds: float = 0.2, least: int = 3, device: str = "cpu") -> float:
    """Median-free best-of timing: the fastest of repeated calls within ``seconds``."""
    now = clock(device)
    fn()
    best, spent, n = math.inf, 0.0, 0
    while n < least or spent < seconds:
        start = now()
        fn()
        took = now() - start
        best, spent, n = min(best, took), spent + took, n + 1
    return best


def _autograd_op_us(device: str = "cpu") -> float:
    """Microseconds per op that a training step spends outside the ops themselves: Python, modules,
    autograd's graph. A tiny MLP's forward, backward and SGD step, timed whole, less its ops each
    timed alone (:class:`OpTimes`), over the ops OpCost counts in it."""
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(8)))
    x = torch.zeros(2, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    def step() -> None:
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    spec = GpuSpec("count", 1, 0, 0, {"fp32": 1.0}, 1.0, 0, 0, "fp32")
    counter = OpCost(spec, tf32=False, timer=OpTimes(device))
    with counter:
        step()
    counter.finish()
    calls = max(counter.hosted(*counter.calls), 1)
    alone = sum(counter.seconds.values())
    return max(_timed(step) - alone, 0.0) / calls * 1e6


def cpu_spec() -> GpuSpec:
    """This CPU as a target, every constant measured now: the plan's own check on a machine without a
    GPU (bench/plan_accuracy.py compares it with real steps)."""
    from trainer.precision import cpu_has_fast_bf16

    size = 256  # the shapes a model that trains on a CPU has, not a peak-friendly 4096
    a, b = torch.randn(size, size), torch.randn(size, size)
    fp32 = 2 * size**3 / _timed(lambda: a @ b) / 1e12
    tflops = {"fp32": fp32, "tf32": fp32}
    if cpu_has_fast_bf16():
        ah, bh = a.bfloat16(), b.bfloat16()
        tflops["bf16"] = 2 * size**3 / _timed(lambda: ah @ bh) / 1e12
    big = torch.empty(8 * MIB)  # 32 MB: past the caches
    bandwidth = 2 * big.nbytes / _timed(lambda: big.mul_(1.0)) / 1e9
    host_op = _autograd_op_us()
    try:
        available = int(
            next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemAvailable"))
            .split()[1]
        ) / 1024
    except (OSError, StopIteration, ValueError):
        available = 8 * 1024.0
    return GpuSpec(
        name="cpu",
        usable_mib=available,
        context_mib=0.0,
        allocator_overhead=0.0,
        tflops=tflops,
        bandwidth_gbs=bandwidth,
        launch_us=0.0,
        host_op_us=host_op,
        auto_precision="bf16" if cpu_has_fast_bf16() else "fp32",
        aliases=("CPU",),
        sources={
            k: "measured: on this CPU now"
            for k in ("usable_mib", "tflops", "bandwidth_gbs", "host_op_us")
        }
        | {"context_mib": "measured: none on a CPU", "allocator_overhead": "modelled: none counted",
           "heavy_ops": "measured: each op timed here at its own shapes, on the values of a real step",
           "host_op_us_by_phase": "measured: on the model's own real step of two samples"},
        measure_on="cpu",
    )


# -- what one step costs, op by op ----------------------------------------------------------------


def _nbytes(value: Any) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


#: The ops whose speed no single rate describes: a CPU's matmul rate falls with small shapes, and its
#: attention backward runs at a tenth of it. When the plan runs on its target, each of these is timed
#: there at the shapes the step gives it (:class:`OpTimes`).
TIMED_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
})  # fmt: skip


#: Op times kept per device in the cache (about 300 bytes each).
CACHED_OPS = 5000


def op_signature(value: Any) -> Any:
    """A hashable stand-in for an op's argument: a tensor by its layout, anything else as it is."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), str(value.dtype).removeprefix("torch."))
    if isinstance(value, list | tuple):
        return ("seq", tuple(op_signature(v) for v in value))
    if isinstance(value, torch.device):
        return ("device",)  # the fake trace's CPU stands for the target: replayed there
    if isinstance(value, torch.dtype | torch.layout | torch.memory_format):
        return ("attr", str(value).removeprefix("torch."))
    return value


def op_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of an op's argument, in the order :func:`op_signature` lists them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in op_tensors(v)]
    return []


def _span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements of storage a strided tensor reaches, from its first."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(shape, stride, strict=True))


def _alike(sig: Any, like: list[torch.Tensor]) -> bool:
    """Whether ``like`` can lend ``sig``'s tensors their values: as many, of the same dtypes and
    ranks, each shape differing in one dimension at most (the batch's, wherever a view put it)."""
    wanted: list[Any] = []

    def tensors(node: Any) -> None:
        if isinstance(node, tuple) and node and node[0] == "tensor":
            wanted.append(node)
        elif isinstance(node, tuple) and node and node[0] == "seq":
            for v in node[1]:
                tensors(v)

    tensors(sig)
    if len(wanted) != len(like):
        return False
    for (_, shape, _stride, dtype), have in zip(wanted, like, strict=True):
        if str(have.dtype).removeprefix("torch.") != dtype or have.dim() != len(shape):
            return False
        if sum(a != b for a, b in zip(shape, have.shape, strict=True)) > 1:
            return False
    return True


def materialize(sig: Any, device: torch.device, like: Iterator[torch.Tensor] | None = None) -> Any:
    """Real tensors of the layouts :func:`op_signature` recorded, on ``device``.

    Their values are those of ``like`` (the tensors the same op had in a real step at a smaller
    micro-batch, in signature order), its storage repeated to the size needed, each copy rotated by
    an offset of its own: a CPU's branch predictor learns a sequence that repeats exactly (a max-pool
    over 64 copies of two samples ran in 70 % of its time over 128 real ones, over rotated copies in
    96-105 %). Without them, positive values (from a generator of their own: the caller's random
    stream is left alone), zeros for integers."""
    if isinstance(sig, tuple) and sig and sig[0] == "tensor":
        _, shape, stride, dtype_name = sig
        dtype = getattr(torch, dtype_name)
        needed = _span(shape, stride)
        source = next(like, None) if like is not None else None
        base = torch.zeros(needed, dtype=dtype, device=device)
        have = _span(tuple(source.shape), source.stride()) if isinstance(source, torch.Tensor) else 0
        if source is not None and have and needed:
            values = source.as_strided((have,), (1,), source.storage_offset()).to(device)
            generator = torch.Generator().manual_seed(0)
            copies = [values] + [values.roll(int(torch.randint(len(values), (1,), generator=generator)))
                                 for _ in range(-(-needed // len(values)) - 1)]
            base.copy_(torch.cat(copies)[:needed])
        elif dtype.is_floating_point:  # positive: a square root or a log of a negative is a slow NaN
            base.uniform_(0.5, 1.5, generator=torch.Generator(device).manual_seed(0))
        return base.as_strided(shape, stride)
    if isinstance(sig, tuple) and sig and sig[0] == "seq":
        return [materialize(v, device, like) for v in sig[1]]
    if isinstance(sig, tuple) and sig and sig[0] == "device":
        return device
    if isinstance(sig, tuple) and sig and sig[0] == "attr":
        return getattr(torch, sig[1])
    return sig


class OpTimes:
    """Seconds of each op (every op on a CPU, the heavy ones on a GPU) at its own shapes on this
    device, timed once and cached on disk (``cache_dir``/plan_ops.json, keyed by device, thread
    count, clock and torch version): a short microbenchmark per distinct op, so no rate is assumed
    for shapes it was never measured at. Where a real step at a small micro-batch gave the op its
    values (:class:`StepValues`), they are repeated to its shapes: a CPU's max-pool runs three times
    faster over MNIST's blank borders than over noise, and its backward scatters to where the
    maxima really were. Otherwise values are random: an op whose speed depends on its data is timed
    as on dense data."""

    def __init__(self, device: str, cache_dir: str | Path | None = None) -> None:
        self.device = torch.device(device)
        self.path = Path(os.path.expanduser(cache_dir)) / "plan_ops.json" if cache_dir else None
        #: Every op on a CPU (its elementwise ops run far below its bandwidth: bf16 GELU at 1 ns an
        #: element); on a GPU the heavy ones, the rest being bytes over bandwidth plus a launch.
        self.every_op = self.device.type == "cpu"
        timer = getattr(clock(self.device.type), "__name__", "wall")
        self.scope = (f"v1|{_device_name(self.device)}|threads={torch.get_num_threads()}|clock={timer}"
                      f"|torch={torch.__version__}")
        self.times: dict[str, float] = {}
        self.dirty = False
        #: What timing a call costs when the op does nothing (Python, dispatch): not the op's own
        #: time, and counted once already in the host's cost per call (:func:`host_us`).
        one = torch.ones(1, device=self.device)
        self.floor = self._time(torch.ops.aten.add.Tensor, (one, one), {})
        if self.path is not None and self.path.is_file():
            try:
                self.times = dict(json.loads(self.path.read_text()).get(self.scope, {}))
            except (OSError, ValueError, AttributeError):
                self.times = {}

    def seconds(self, func: Any, sig: tuple[Any, Any], like: list[torch.Tensor] | None = None,
                values: str = "") -> float | None:
        """The op's fastest time of a few calls on real tensors; None when it cannot run here.
        ``like``: its tensor arguments in a real step, whose values to repeat; ``values`` names where
        they came from (times on real values are kept apart from those on random ones)."""
        like = like if like and _alike(sig[0], like) else None
        key = f"{func}{sig!r}" + (f"|values={values}" if like else "")
        if key not in self.times:
            try:
                with torch.no_grad():
                    args = materialize(sig[0], self.device, iter(like) if like else None)
                    kwargs = materialize(sig[1], self.device)
                self.times[key] = max(self._time(func, args, kwargs) - self.floor, 0.0)
            except Exception as exc:  # an op that needs values random ones are not: roofline instead
                log.debug("plan: could not time %s here (%s)", func, exc)
                return None
            self.dirty = True
        return self.times[key]

    def _time(self, func: Any, args: Any, kwargs: Any) -> float:
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)

        def call() -> None:
            func(*args, **kwargs)
            sync()

        with torch.no_grad():
            return _timed(call, seconds=0.005, least=3, device=self.device.type)

    def save(self) -> None:
        """Write the new times beside the others (another device's or thread count's are kept)."""
        if self.path is None or not self.dirty:
            return
        wall = self.device.type == "cpu" and clock("cpu") is time.perf_counter
        if wall and os.getloadavg()[0] > (os.cpu_count() or 1):
            return  # timed while others loaded the CPU: not this CPU's times, not kept for later plans
        try:
            whole = json.loads(self.path.read_text()) if self.path.is_file() else {}
        except (OSError, ValueError):
            whole = {}
        # The newest ops only: a bench's bisection times a dozen micro-batches' worth of shapes.
        whole[self.scope] = dict(list(self.times.items())[-CACHED_OPS:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(whole))
            partial.replace(self.path)
            self.dirty = False
        except OSError as exc:
            log.debug("plan: op times not cached (%s)", exc)


_TIMERS: dict[tuple[str, str, int], OpTimes] = {}
_HOST: dict[tuple[Any, ...], dict[str, float]] = {}


def host_us(spec: GpuSpec, parts: Parts) -> dict[str, float]:
    """Microseconds the host spends per op call outside the op, by phase of the step.

    On a CPU target, measured on the model itself: its real step at :data:`VALUES_BATCH` (where its
    ops cost little), each phase's time less its ops timed alone, over the calls it made
    (:meth:`StepValues.host_us`). What a call costs around the op is the model's own: its modules'
    Python, its autograd graph, its optimizer's loop over its parameters, and the weights and
    optimizer state each op reads cold from memory, as they are in a step and not in a loop that
    times one op. On another timed target, or when that step cannot run: two of torch's own
    pre-norm transformer layers, 8 wide (their ops do next to nothing), take one step with the
    run's precision, optimizer and clipping, measured the same way. The phases differ: forward and
    the optimizer run Python per op (modules, the optimizer's loop), backward runs autograd's C++
    engine. Elsewhere, the table's figure for every phase.
    """
    phases = ("forward", "backward", "optimizer")
    timer = op_times(spec, parts.config)
    if timer is None:
        return dict.fromkeys(phases, spec.host_op_us)
    values = step_values(parts) if timer.every_op else None
    if values is not None and set(values.phase_seconds) == set(phases):
        return values.host_us(timer)
    key = (timer.device.type, torch.get_num_threads(), parts.precision, parts.config.optimizer,
           repr(parts.config.optimizer_args), parts.config.grad_clip > 0)
    if key in _HOST:
        return _HOST[key]
    from trainer.optim import build_optimizer
    from trainer.precision import make_amp

    layers = (nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True,
                                         norm_first=True) for _ in range(2))
    model = nn.Sequential(*layers)
    model = model.to(timer.device)
    optimizer = build_optimizer(parts.config, model, timer.device)
    amp = make_amp(parts.precision, timer.device.type)
    x = torch.ones(2, 4, 8, device=timer.device)
    loss: list[torch.Tensor] = []

    def forward() -> None:
        with amp.autocast():
            loss[:] = [model(x).float().sum()]

    def backward() -> None:
        loss[0].backward()

    def update() -> None:
        if parts.config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), parts.config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    counter = OpCost(spec, tf32=False, timer=OpTimes(timer.device.type))
    with counter:
        for phase, run in zip(phases, (forward, backward, update), strict=True):
            counter.phase = phase
            run()
    counter.finish()
    now, best = clock(timer.device.type), dict.fromkeys(phases, math.inf)
    for _ in range(20):
        for phase, run in zip(phases, (forward, backward, update), strict=True):
            start = now()
            run()
            best[phase] = min(best[phase], now() - start)
    # On a CPU the host runs the ops too: their own time is not overhead. A GPU's host only launches.
    ran = counter.seconds if timer.device.type == "cpu" else {}
    outside = {phase: max(best[phase] - ran.get(phase, 0.0), 0.0) for phase in phases}
    _HOST[key] = {phase: outside[phase] * 1e6 / max(counter.calls.get(phase, 0), 1) for phase in phases}
    return _HOST[key]


def op_times(spec: GpuSpec, config: TrainConfig) -> OpTimes | None:
    """The op timer of the target when the plan runs on it (one per device, cache and thread count)."""
    if spec.measure_on is None:
        return None
    key = (spec.measure_on, str(config.cache_dir), torch.get_num_threads())
    if key not in _TIMERS:
        _TIMERS[key] = OpTimes(spec.measure_on, config.cache_dir)
    return _TIMERS[key]


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def _runs_kernel(func: Any, out: Any) -> bool:
    """An op that computes something: not a view, an op that only changes metadata (FREE_OPS), or
    one that returns no tensor."""
    if getattr(func, "is_view", False) or func.overloadpacket.__name__ in FREE_OPS:
        return False
    outs = out if isinstance(out, list | tuple) else (out,)
    return any(isinstance(v, torch.Tensor) for v in outs)


def _place(seen: dict[tuple[str, str], int], phase: str, func: Any) -> tuple[str, str, int]:
    """Where an op is in the step: its phase, its name and how many times it ran there before (the
    same in a real step at another micro-batch, when the model's code does not branch on it)."""
    key = (phase, str(func))
    seen[key] = seen.get(key, 0) + 1
    return phase, str(func), seen[key] - 1


def _observe(
    mode: StepValues | OpCost, func: Any, args: Any, kwargs: dict[str, Any]
) -> tuple[Any, tuple[str, str, int] | None]:
    """What both dispatch modes do first with an op: run it, count the call in the mode's phase and,
    for an op that runs a kernel, give its place in the step (None otherwise).

    ``prim`` ops (``prim.device``: a fake tensor asked for its device by MemTracker, autocast or the
    fake mode itself, about three a real op; a real tensor answers without dispatching) are neither
    counted nor placed, so both modes count the same calls on fake and on real tensors.
    """
    out = func(*args, **kwargs)
    if func.namespace == "prim":
        return out, None
    mode.calls[mode.phase] = mode.calls.get(mode.phase, 0) + 1
    if not _runs_kernel(func, out):
        return out, None
    return out, _place(mode.seen, mode.phase, func)


class StepValues(TorchDispatchMode):
    """The tensors each op of a real training step was given, by :func:`_place`: what
    :class:`OpTimes` times the traced step's ops on, repeated to their shapes, in place of random
    values (see :func:`step_values`). ``name`` says which model and data gave them. Also each op's
    signature, the calls per phase (counted as :class:`OpCost` counts them) and, once the same step
    has run unobserved, each phase's fastest time (``phase_seconds``)."""

    def __init__(self, name: str = "") -> None:
        super().__init__()
        self.name = name
        self.phase = "forward"
        self.args: dict[tuple[str, str, int], list[torch.Tensor]] = {}
        self.ops: list[tuple[str, Any, tuple[Any, Any], tuple[str, str, int]]] = []
        self.calls: dict[str, int] = {}
        self.seen: dict[tuple[str, str], int] = {}
        self.phase_seconds: dict[str, float] = {}
        self._host_us: dict[str, float] | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out, place = _observe(self, func, args, kwargs)
        if place is not None:
            # kept, not copied: an in-place op after this one changes them a little, a copy of
            # every weight for every op that reads it would cost gigabytes on a large model
            self.args[place] = [t.detach() for t in op_tensors(args)]
            self.ops.append((self.phase, func, (op_signature(args), op_signature(kwargs)), place))
        return out

    def host_us(self, timer: OpTimes) -> dict[str, float]:
        """Microseconds per call, by phase, that the real step spent outside its ops: each phase's
        time less its ops timed alone on their own values, over its calls."""
        if self._host_us is None:
            alone = dict.fromkeys(self.phase_seconds, 0.0)
            for phase, func, sig, place in self.ops:
                alone[phase] += timer.seconds(func, sig, self.args[place], self.name) or 0.0
            timer.save()
            self._host_us = {phase: max(took - alone[phase], 0.0) * 1e6 / max(self.calls.get(phase, 0), 1)
                             for phase, took in self.phase_seconds.items()}
        return self._host_us


class PhaseClock:
    """The time of each phase of :func:`_train_step`, taken as it names them (``phase``)."""

    def __init__(self) -> None:
        self.now = clock("cpu")
        self.seconds: dict[str, float] = {}
        self.current: str | None = None
        self.start = 0.0

    @property
    def phase(self) -> str | None:
        return self.current

    @phase.setter
    def phase(self, name: str | None) -> None:
        now = self.now()
        if self.current is not None:
            self.seconds[self.current] = now - self.start
        self.current, self.start = name, self.now()


class OpCost(TorchDispatchMode):
    """Counts, per phase of the step, each op's FLOPs (FlopCounterMode's formulas), bytes read and
    written, and its time on the target: roofline (the longer of compute and memory, plus a launch),
    or, for the heavy ops when ``timer`` is the target's, their time measured there (:meth:`finish`)."""

    def __init__(self, spec: GpuSpec, tf32: bool, timer: OpTimes | None = None,
                 values: StepValues | None = None) -> None:
        super().__init__()
        from torch.utils.flop_counter import flop_registry

        self.registry = flop_registry
        self.spec, self.tf32, self.timer, self.values = spec, tf32, timer, values
        self.phase = "forward"
        self.flops: dict[str, float] = {}
        self.bytes: dict[str, float] = {}
        self.ops: dict[str, int] = {}
        #: Every op the step dispatches, views included (each costs the host its Python, dispatch and
        #: autograd), not the ``prim`` queries only fake tensors make.
        self.calls: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        #: Heavy ops to time on the target once the trace is over (no real tensor inside fake mode),
        #: each with its place in the step (phase, op, occurrence): where ``values`` has its tensors.
        self.pending: list[tuple[str, Any, Any, float, tuple[str, str, int]]] = []
        self.seen: dict[tuple[str, str], int] = {}

    def hosted(self, *phases: str) -> int:
        """The ops the host pays for in ``phases``: every call where the host's cost per call was
        measured (a timed target), the ops that launch kernels where it is the table's per-op figure."""
        counts = self.calls if self.timer is not None else self.ops
        return sum(counts.get(phase, 0) for phase in phases)

    def finish(self) -> None:
        """Time the heavy ops the step ran, on the target, and put them in their phases' seconds in
        place of their roofline estimate (kept where an op cannot run on random values)."""
        if self.timer is None:
            return
        values = self.values.args if self.values is not None else {}
        name = self.values.name if self.values is not None else ""
        for phase, func, sig, modelled, place in self.pending:
            took = self.timer.seconds(func, sig, values.get(place), name)
            if took is not None:
                self.seconds[phase] += took - modelled
        self.pending.clear()
        self.timer.save()

    def _rate(self, dtype: torch.dtype) -> float:
        key = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "tf32" if self.tf32 else "fp32")
        rate = self.spec.tflops.get(key) or self.spec.tflops.get("fp32") or 1.0
        return rate * 1e12

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out, place = _observe(self, func, args, kwargs)
        if place is None:
            return out
        outs = out if isinstance(out, list | tuple) else (out,)
        packet = func.overloadpacket
        flops = 0.0
        if packet in self.registry:
            flops = float(self.registry[packet](*args, **kwargs, out_val=out))
        moved = 0
        for value in (*args, *kwargs.values()):
            moved += _nbytes(value) if not isinstance(value, list | tuple) else sum(_nbytes(v) for v in value)
        moved += sum(_nbytes(v) for v in outs)
        dtype = next((v.dtype for v in outs if isinstance(v, torch.Tensor)), torch.float32)
        took = max(flops / self._rate(dtype), moved / (self.spec.bandwidth_gbs * 1e9))
        took += self.spec.launch_us * 1e-6
        phase = self.phase
        if self.timer is not None and (self.timer.every_op or packet.__name__ in TIMED_OPS):
            self.pending.append((phase, func, (op_signature(args), op_signature(kwargs)), took, place))
        self.flops[phase] = self.flops.get(phase, 0.0) + flops
        self.bytes[phase] = self.bytes.get(phase, 0.0) + moved
        self.ops[phase] = self.ops.get(phase, 0) + 1
        self.seconds[phase] = self.seconds.get(phase, 0.0) + took
        return out


@dataclass
class Trace:
    """One traced step at one micro-batch: its peak and what it did."""

    micro_batch: int
    peak_bytes: int
    categories: dict[str, int]
    flops: float
    #: Device and host seconds of forward + backward (once per micro-batch) and of the optimizer
    #: step with the clipping (once per optimizer step).
    seconds: float
    host_seconds: float
    optimizer_seconds: float
    ops: int
    how: str = "traced"


class ModuleStack:
    """The module running now, by name: what a failure under fake tensors is reported against."""

    def __init__(self, model: nn.Module) -> None:
        self.names = {id(m): n or type(m).__name__ for n, m in model.named_modules()}
        self.types = {id(m): type(m).__name__ for m in model.modules()}
        self.stack: list[int] = []
        self.failed_in: str | None = None

    def __enter__(self) -> ModuleStack:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        def pre(module: nn.Module, _args: Any) -> None:
            self.stack.append(id(module))

        def post(module: nn.Module, _args: Any, _out: Any) -> None:
            if self.stack and self.stack[-1] == id(module):
                self.stack.pop()

        self.handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if exc is not None and self.stack:
            top = self.stack[-1]
            self.failed_in = f"{self.names.get(top, '?')} ({self.types.get(top, '?')})"
        for handle in self.handles:
            handle.remove()


class FakeTraceError(RuntimeError):
    """Fake tensors could not follow the model; ``layer`` says where."""

    def __init__(self, layer: str, cause: BaseException) -> None:
        self.layer = layer
        first = str(cause).splitlines()[0] if str(cause) else ""
        self.reason = f"{type(cause).__name__}: {first}" if first else type(cause).__name__
        super().__init__(f"{layer}: {self.reason}")


@dataclass
class Parts:
    """What a plan needs from the config: model factory, objective, data, precision, optimizer."""

    config: TrainConfig
    model_fn: Callable[[], nn.Module]
    loss_fn: Any
    train_data: Any
    precision: str
    #: The values of one real step, recorded when a CPU target's ops are first timed (step_values).
    values: StepValues | None = field(default=None, repr=False, compare=False)


def load_parts(config: TrainConfig, spec: GpuSpec) -> Parts:
    """The config's model, objective and data, built as ``runtime.prepare`` builds them, and the
    precision ``auto`` becomes on the target (not on this CPU)."""
    import functools

    from trainer.imports import check_arguments, load_callable
    from trainer.runtime import build_model, load_data, make_objective

    factory = load_callable(config.model, "model", config.project_dir)
    check_arguments(factory, config.model_args, "model_args")
    model_fn = functools.partial(build_model, factory, config.model, config.model_args)
    precision = config.precision if config.precision != "auto" else spec.auto_precision
    if precision == "bf16" and not spec.is_cpu and not spec.tflops.get("bf16"):
        raise PlanError([f"precision: {spec.name} has no fast bf16 (use fp16 or auto)"])
    train, _held = load_data(config)
    return Parts(config, model_fn, make_objective(config), train, precision)


def _leaves(batch: Any) -> list[Any]:
    from torch.utils._pytree import tree_leaves

    return tree_leaves(batch)


def _fake_batch(mode: Any, batch: Any) -> Any:
    return tree_map(lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, batch)


def _ready_optimizer(parts: Parts, model: nn.Module, hold_grads: bool) -> tuple[Any, list[torch.Tensor]]:
    """The run's optimizer with the state AdamW makes at the first step (there before every later
    step), and the parameters it updates; with ``hold_grads`` their gradients stay alive."""
    from trainer.optim import build_optimizer

    optimizer = build_optimizer(parts.config, model, torch.device("cpu"))
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    if not hold_grads:
        optimizer.zero_grad(set_to_none=True)
    return optimizer, params


def _train_step(parts: Parts, model: nn.Module, optimizer: Any, params: list[torch.Tensor], batch: Any,
                amp: Any, counter: OpCost | StepValues | PhaseClock, around_forward: Any = None) -> None:
    """Forward, backward, clipping and the update, as both the trace and the recording of values
    run them; ``counter.phase`` says which is running."""
    counter.phase = "forward"
    with around_forward or contextlib.nullcontext(), amp.autocast():
        loss = parts.loss_fn(model, batch).loss
    counter.phase = "backward"
    loss.backward()
    counter.phase = "optimizer"
    if parts.config.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(params, parts.config.grad_clip)  # as the trainer on a GPU
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


#: The micro-batch of the real step whose values a CPU target's ops are timed on (two: a batch norm
#: needs more than one sample; the values are repeated to the traced micro-batch's shapes).
VALUES_BATCH = 2


def step_values(parts: Parts) -> StepValues | None:
    """The tensors each op had in one real training step at :data:`VALUES_BATCH` on this CPU, taken
    once per ``parts``; None where that step fails (the ops are then timed on random values).

    Why: a CPU's kernels branch on values. Its max-pool over MNIST's blank borders (equal values,
    every comparison predicted) runs three times faster than over noise; its backward scatters where
    the maxima were; an embedding reads the rows the tokens name. A step at two samples costs little
    and gives each op the values it meets in training, from the run's own data and model.
    """
    if parts.values is None:
        parts.values = _record_values(parts)
    return parts.values if parts.values.args else None


def _record_values(parts: Parts) -> StepValues:
    from trainer.batch_finder import sample_batch
    from trainer.precision import make_amp

    config = parts.config
    source = [config.model, config.model_args, config.data, config.data_args, config.loss, config.loss_args,
              config.collate, config.collate_args, config.seed]
    name = hashlib.sha256(json.dumps(source, sort_keys=True, default=str).encode()).hexdigest()[:12]
    recorder = StepValues(name)
    try:
        with torch.random.fork_rng(devices=[]):  # the caller's random stream is left alone
            model = parts.model_fn()
            optimizer, params = _ready_optimizer(parts, model, hold_grads=False)
            batch = sample_batch(parts.train_data, VALUES_BATCH, torch.device("cpu"), False,
                                 parts.loss_fn.collate)
            amp = make_amp(parts.precision, "cpu")
            with recorder:
                _train_step(parts, model, optimizer, params, batch, amp, recorder)
            # The same step unobserved, its phases timed: what the host costs per call (host_us)
            timing, spent, runs = PhaseClock(), 0.0, 0
            best = dict.fromkeys(("forward", "backward", "optimizer"), math.inf)
            while runs < 3 or (spent < 0.3 and runs < 50):
                _train_step(parts, model, optimizer, params, batch, amp, timing)
                timing.phase = None
                best = {phase: min(took, timing.seconds[phase]) for phase, took in best.items()}
                spent, runs = spent + sum(timing.seconds.values()), runs + 1
            recorder.phase_seconds = best
    except Exception as exc:  # the trace names what fails; here it only means random values
        log.debug("plan: no real step to take op values from (%s)", exc)
        return StepValues()
    return recorder


def trace_step(parts: Parts, spec: GpuSpec, micro_batch: int, hold_grads: bool = False) -> Trace:
    """One step at ``micro_batch`` under fake tensors: peak bytes (MemTracker) and the op costs.

    The optimizer's state exists before the traced step (as from the second step on), and with
    ``hold_grads`` so do the gradients (accumulation: the next micro-batch runs with them alive).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from trainer.batch_finder import sample_batch
    from trainer.precision import make_amp

    timer = op_times(spec, parts.config)
    values = step_values(parts) if timer is not None and timer.every_op else None
    real = sample_batch(parts.train_data, micro_batch, torch.device("cpu"), False, parts.loss_fn.collate)
    amp = make_amp(parts.precision, "cpu")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            model = parts.model_fn()
    except Exception as exc:
        raise FakeTraceError("the model's factory", exc) from exc
    with mode:
        optimizer, params = _ready_optimizer(parts, model, hold_grads)
    batch = _fake_batch(mode, real)
    tracker = MemTracker()
    tracker.track_external(model, optimizer, *(t for t in _leaves(batch) if isinstance(t, torch.Tensor)))
    cost = OpCost(spec, tf32=not parts.config.deterministic, timer=timer, values=values)
    stack = ModuleStack(model)
    try:
        with mode, tracker, cost, warnings.catch_warnings():
            # MemTracker asks fake storages for their data pointer; torch warns, and the answer is unused
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            _train_step(parts, model, optimizer, params, batch, amp, cost, stack)
    except Exception as exc:
        where = stack.failed_in or ("the loss" if cost.phase == "forward" else f"the {cost.phase}")
        raise FakeTraceError(where, exc) from exc
    cost.finish()
    snapshot = tracker.get_tracker_snapshot("peak")
    per_device = next(iter(snapshot.values()))
    categories = {str(getattr(k, "value", k)): int(v) for k, v in per_device.items() if k != "Total"}
    seconds, host_s, opt_seconds = _step_seconds(cost, spec, parts, params, optimizer)
    return Trace(
        micro_batch=micro_batch,
        peak_bytes=int(per_device["Total"]),
        categories=categories,
        flops=sum(cost.flops.values()),
        seconds=seconds,
        host_seconds=host_s,
        optimizer_seconds=opt_seconds,
        ops=cost.hosted("forward", "backward"),
    )


def _step_seconds(
    cost: OpCost, spec: GpuSpec, parts: Parts, params: list[torch.Tensor], optimizer: Any
) -> tuple[float, float, float]:
    """The device's seconds for forward + backward, the host's seconds for them, and the seconds
    of the optimizer step (clipping included).

    On a CPU the traced ops are what runs. On a GPU the optimizer and the clipping are fused or
    ``foreach`` kernels: a few launches that read and write every parameter, gradient and state once
    (modelled from bytes over bandwidth), not the traced per-parameter loop.
    """
    forward_backward = cost.seconds.get("forward", 0.0) + cost.seconds.get("backward", 0.0)
    per_call = host_us(spec, parts)
    host_s = sum(cost.hosted(phase) * per_call[phase] * 1e-6 for phase in ("forward", "backward"))
    if spec.is_cpu:
        host = cost.hosted("optimizer") * per_call["optimizer"] * 1e-6
        optimizer_s = cost.seconds.get("optimizer", 0.0) + host
        return forward_backward, host_s, optimizer_s
    param_bytes = sum(_nbytes(p) for p in params)
    state_bytes = sum(
        _nbytes(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    )
    clip = 2 * param_bytes if parts.config.grad_clip > 0 else 0
    moved = 2 * param_bytes + param_bytes + 2 * state_bytes + clip
    launches = 4 * math.ceil(len(params) / 64)
    took = moved / (spec.bandwidth_gbs * 1e9) + launches * spec.launch_us * 1e-6
    return forward_backward, host_s, max(took, launches * per_call["optimizer"] * 1e-6)


def fallback_trace(parts: Parts, spec: GpuSpec, micro_batch: int) -> Trace:
    """The hook measurement on real CPU tensors (trainer.estimate): weights, gradients, the
    optimizer's state and the autocast copy by count, activations as autograd saves them."""
    from trainer.batch_finder import sample_batch
    from trainer.estimate import fixed_bytes, saved_bytes

    model = parts.model_fn()
    fixed = fixed_bytes(parts.config, model, parts.precision)
    sample = sample_batch(parts.train_data, micro_batch, torch.device("cpu"), False, parts.loss_fn.collate)
    cost = OpCost(spec, tf32=not parts.config.deterministic, timer=op_times(spec, parts.config))
    with cost:  # the same op costs, counted on the real step the measurement runs
        acts = saved_bytes(model, parts.loss_fn, sample, parts.precision)
    cost.finish()
    ops = cost.hosted(*cost.calls)
    optimizer_s = 2 * fixed / (spec.bandwidth_gbs * 1e9)  # every byte of the step's state read and written
    return Trace(micro_batch, int(fixed + acts), {"fixed": int(fixed), "activations": acts},
                 sum(cost.flops.values()), sum(cost.seconds.values()), ops * spec.host_op_us * 1e-6,
                 optimizer_s, ops, how="fallback")


def _cpu_allocator_peak(step: Callable[[], None]) -> int:
    """The most bytes the CPU allocator held above where it started, during ``step``: its own
    allocation and free events as torch's profiler records them (workspaces included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def measure_step(parts: Parts, micro_batch: int, device: torch.device, repeats: int = 5,
                 hold_grads: bool = False, seconds: float = 0.0) -> dict[str, float]:
    """One real training step at ``micro_batch`` on ``device``, set up as :func:`trace_step` traces
    it: the peak memory and the fastest of ``repeats`` steps, or of as many as fill ``seconds``
    (forward to update, the batch ready).

    On a GPU the peak is the allocator's (``max_memory_allocated``/``max_memory_reserved``). On a
    CPU it is what the tensors alive before the step hold (weights, optimizer state, the batch: counted
    exactly) plus the most the CPU allocator held above that during the step (torch's profiler).
    """
    from trainer.batch_finder import sample_batch
    from trainer.optim import build_optimizer
    from trainer.precision import make_amp

    model = parts.model_fn().to(device)
    optimizer = build_optimizer(parts.config, model, device)
    params = [p for p in model.parameters() if p.requires_grad]
    amp = make_amp(parts.precision, device.type)

    def batch() -> Any:
        return sample_batch(parts.train_data, micro_batch, device, False, parts.loss_fn.collate)

    def step(sample: Any) -> None:
        with amp.autocast():
            loss = parts.loss_fn(model, sample).loss
        amp.scaler.scale(loss).backward()
        if parts.config.grad_clip > 0:
            amp.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, parts.config.grad_clip)
        amp.scaler.step(optimizer)
        amp.scaler.update()
        optimizer.zero_grad(set_to_none=not hold_grads)

    step(batch())  # the optimizer's state, as from the second step on
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times, now = [], clock(device.type)
    while len(times) < repeats or sum(times) < seconds:  # a short step: more tries, a steadier fastest
        sample = batch()  # the loader's rate is measured apart (plan's data_s), as the plan counts it
        sync()
        start = now()
        step(sample)
        sync()
        times.append(now() - start)
    sample = batch()
    # The fastest step: on a machine others share, the slower ones measure them, not the model.
    result: dict[str, float] = {"step_s": min(times)}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step(sample)
        torch.cuda.synchronize(device)
        result["peak_mib"] = torch.cuda.max_memory_allocated(device) / MIB
        result["reserved_mib"] = torch.cuda.max_memory_reserved(device) / MIB
        free, total = torch.cuda.mem_get_info(device)
        result["context_mib"] = (total - free - torch.cuda.memory_reserved(device)) / MIB
    else:
        state = sum(_nbytes(v) for st in optimizer.state.values() for v in st.values()
                    if isinstance(v, torch.Tensor))
        grads = sum(_nbytes(p.grad) for p in params if p.grad is not None)
        before = sum(_nbytes(p) for p in model.parameters()) + state + grads + sum(
            _nbytes(t) for t in _leaves(sample))
        result["peak_mib"] = (before + _cpu_allocator_peak(lambda: step(sample))) / MIB
    return result


# -- the plan --------------------------------------------------------------------------------------


def figure(value: float | int | None, unit: str, how: str, sure: float | None = None) -> dict[str, Any]:
    """A number with its unit, how it was found (traced, measured, modelled, fallback, calibrated)
    and how sure it is (a relative error bound)."""
    return {"value": value, "unit": unit, "how": how, "sure": SURE.get(how, 0.25) if sure is None else sure}


def device_mib(trace_bytes: float, spec: GpuSpec, memory_ratio: float = 1.0) -> float:
    """What the GPU would hold at that traced peak: the allocator's overhead on it, plus the context."""
    return spec.context_mib + trace_bytes * memory_ratio * (1 + spec.allocator_overhead) / MIB


def _data_rate(parts: Parts, micro_batch: int, seconds: float = 0.2) -> float:
    """Samples per second one loader process gets on this CPU (collated as in training)."""
    from torch.utils.data import DataLoader

    from trainer.data import sized_len

    shuffle = sized_len(parts.train_data) is not None  # a stream comes in its own order
    loader = DataLoader(parts.train_data, batch_size=max(1, micro_batch), shuffle=shuffle,
                        collate_fn=parts.loss_fn.collate, num_workers=0)
    count, start = 0, time.perf_counter()
    for batch in loader:
        from trainer.batches import batch_size

        count += batch_size(batch)
        if time.perf_counter() - start > seconds:
            break
    return count / max(time.perf_counter() - start, 1e-9)


@dataclass
class Calibration:
    """Measured over predicted, from an earlier run of the same model (forja plan --calibrate)."""

    memory_ratio: float = 1.0
    time_ratio: float = 1.0
    source: str = ""


def plan(
    config: TrainConfig,
    gpu: str | GpuSpec = "L4",
    gpus: int = 1,
    calibration: Calibration | None = None,
    vcpus: int | None = None,
    measured: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Predict, for ``gpus`` of ``gpu``, the peak per micro-batch, the largest micro-batch that fits
    and its accumulation, the step time and the throughput; see the module docstring for how.

    ``measured`` is what an earlier run of the same model measured on that GPU (``micro_batch``,
    ``accum_steps``, ``peak_reserved_mib``, ``step_s``, ``source``): its micro-batch is traced too,
    and measured over predicted scales every figure of this plan (``forja plan --calibrate``).
    """
    started = time.perf_counter()
    spec = gpu if isinstance(gpu, GpuSpec) else find_gpu(gpu)
    if gpus < 1:
        raise PlanError([f"--gpus: {gpus} is not a GPU count (give 1 or more)"])
    cal = calibration or Calibration()
    parts = load_parts(config, spec)
    from trainer.batch_finder import search_cap
    from trainer.data import largest_divisor_plan, sized_len

    length = sized_len(parts.train_data)
    cap = search_cap(config, length, gpus) if length is not None else config.max_batch_size
    budget = spec.usable_mib
    notes: list[str] = []
    traces: dict[int, Trace] = {}
    fallback: str | None = None

    def at(size: int, hold: bool = False) -> Trace:
        nonlocal fallback
        key = size if not hold else -size
        if key not in traces:
            if fallback is None:
                try:
                    traces[key] = trace_step(parts, spec, size, hold)
                except FakeTraceError as exc:
                    fallback = str(exc)
                    notes.append(
                        f"fake tensors cannot follow the model at {exc.layer} ({exc.reason}); memory "
                        "falls back to the hook measurement on real CPU tensors (trainer.estimate), the "
                        "time to the op costs of that real step"
                    )
                    traces.clear()
            if fallback is not None:
                traces[key] = fallback_trace(parts, spec, size)
        return traces[key]

    def need(size: int, hold: bool = False) -> float:
        return device_mib(at(size, hold).peak_bytes, spec, cal.memory_ratio)

    workers = max(1, min(4, (vcpus or os.cpu_count() or 2) // max(gpus, 1) // 2))
    rates: list[float] = []  # measured when first needed: a refusal does not wait for it

    def data_rate() -> float:
        if not rates:
            rates.append(_data_rate(parts, min(cap, 64)))
        return rates[0]

    def timing(trace: Trace, size: int, accum: int) -> dict[str, float]:
        # A CPU runs the host's work, the kernels and the loading one after another (workers: 0); a
        # GPU overlaps them: the slowest of the three sets the pace of each micro-batch.
        if spec.is_cpu:
            compute = (trace.seconds + trace.host_seconds) * cal.time_ratio
            data = size / data_rate()
            one = compute + data
        else:
            compute = max(trace.seconds, trace.host_seconds) * cal.time_ratio
            data = size / (data_rate() * workers)
            one = max(compute, data)
        step = one * accum + trace.optimizer_seconds * cal.time_ratio
        return {"compute": compute, "data": data, "step": step}

    if measured:
        cal = _calibrate(measured, at, spec, timing)
    notes.extend(_busy_cpu(spec))
    first = at(1)
    if need(1) > budget:
        raise PlanError([_does_not_fit(spec, parts, need(1), first)])
    largest, bad, slope = _search(need, budget, cap)
    margin = config.find_batch_margin if bad is not None else 0.0
    usable = max(1, int(largest * (1 - margin)))
    # The run's own plan: its batch_size, or what find-batch would choose for batch_size: auto.
    wanted = config.batch_size if isinstance(config.batch_size, int) else usable
    try:
        batch_plan = largest_divisor_plan(wanted, config.effective_batch_size, gpus)
    except ValueError as exc:
        raise PlanError([str(exc)]) from None
    micro = batch_plan.micro_batch
    if isinstance(config.batch_size, int) and micro > largest:
        notes.append(
            f"batch_size {micro} does not fit ({need(micro):,.0f} MiB of {budget:,.0f}): the run would "
            f"run out of memory and lower it; set batch_size to {usable} or auto"
        )
    hold = batch_plan.accum_steps > 1
    chosen = at(micro, hold)
    if hold:
        notes.append(f"accumulating {batch_plan.accum_steps} micro-batches: traced with the gradients held")
    if gpus > 1:
        notes.append(f"{gpus} GPUs: each holds the peak shown; the gradients' all-reduce between them is "
                     "not in the step time (DDP overlaps it with backward; over PCIe it may not hide)")

    traced_how = "fallback" if fallback else ("calibrated" if cal.source else "traced")
    time_how = "calibrated" if cal.source else "modelled"
    times = timing(chosen, micro, batch_plan.accum_steps)
    compute_s, data_s, step_s = times["compute"], times["data"], times["step"]
    samples_per_s = batch_plan.global_batch / step_s if step_s > 0 else None
    rate_key = {"bf16": "bf16", "fp16": "fp16"}.get(parts.precision, "tf32")
    datasheet = None if spec.is_cpu else spec.datasheet_tflops(parts.precision)
    total_steps = config.steps
    if config.epochs is not None and length is not None:
        total_steps = config.epochs * max(1, length // batch_plan.global_batch)
    rows = []
    for size in sorted({*(s for s in TABLE_SIZES if s <= max(largest, 1)), largest, micro}):
        traced = (size in traces) or (-size in traces)
        mib = need(size) if traced else need(1) + slope * (size - 1)
        rows.append({"micro_batch": size, "peak_mib": mib, "how": traced_how if traced else "modelled"})
    result: dict[str, Any] = {
        "config": {"model": config.model, "precision": parts.precision, "optimizer": config.optimizer},
        "gpu": {
            "name": spec.name,
            "count": gpus,
            "usable_mib": figure(spec.usable_mib, "MiB", spec.how("usable_mib"), 0.0),
            "context_mib": figure(spec.context_mib, "MiB", spec.how("context_mib")),
            "allocator_overhead": figure(spec.allocator_overhead, "fraction", spec.how("allocator_overhead")),
            "tflops_measured": figure(spec.tflops.get(rate_key), "TFLOPS", spec.how("tflops")),
            "tflops_datasheet": spec.datasheet_tflops(parts.precision),
            "ops_timed_on": spec.measure_on,
            "sources": spec.sources,
        },
        "params": sum(p.numel() for p in _meta_params(parts)),
        "peak_per_micro_batch": rows,
        "largest_micro_batch": figure(largest, "samples", traced_how, 0.0),
        "limited_by": "memory" if bad is not None else "cap",
        "cap": cap,
        "margin": margin,
        "plan": {
            "micro_batch": micro,
            "accum_steps": batch_plan.accum_steps,
            "world_size": batch_plan.world_size,
            "global_batch": batch_plan.global_batch,
        },
        "peak_mib": figure(need(micro, hold), "MiB", traced_how),
        "traced_peak_mib": chosen.peak_bytes / MIB,
        "categories_mib": {k: v / MIB for k, v in chosen.categories.items()},
        "flops_per_step": figure(chosen.flops * batch_plan.accum_steps, "FLOP", "traced" if chosen.flops else
                                 "fallback", 0.02),
        "step_s": figure(step_s, "s", time_how),
        "steps": total_steps,
        "train_s": figure(step_s * total_steps, "s", time_how),
        "compute_s_per_micro_batch": compute_s,
        "host_s_per_micro_batch": chosen.host_seconds,
        "optimizer_s": chosen.optimizer_seconds,
        "data_s_per_micro_batch": figure(data_s, "s", "measured" if spec.is_cpu else "modelled"),
        "data_samples_per_s_one_worker": data_rate(),
        "data_workers": workers if not spec.is_cpu else 0,
        "samples_per_s": figure(samples_per_s, "samples/s", time_how),
        "mfu_datasheet": (chosen.flops * batch_plan.accum_steps / step_s / (datasheet * 1e12))
        if chosen.flops and step_s > 0 and datasheet else None,
        "traces": len(traces),
        "fallback": fallback,
        "calibration": asdict(cal) if cal.source else None,
        "notes": notes,
        "plan_seconds": 0.0,
    }
    tokens = _tokens_per_sample(parts)
    if tokens:
        result["tokens_per_s"] = figure((samples_per_s or 0) * tokens, "tokens/s", time_how)
    result["plan_seconds"] = time.perf_counter() - started
    return result


def _busy_cpu(spec: GpuSpec) -> list[str]:
    """A note when this CPU's ops are timed on the wall clock while others load it: torch's threads
    then wait for each other, and the times are the busy machine's, not the CPU's."""
    threads, cpus = torch.get_num_threads(), os.cpu_count() or 1
    if spec.measure_on != "cpu" or threads == 1 or os.getloadavg()[0] <= cpus:
        return []
    return [f"this CPU was busy while its ops were timed (load {os.getloadavg()[0]:.1f} on {cpus} CPUs, "
            f"{threads} torch threads): the times are the busy machine's; with OMP_NUM_THREADS=1 they are "
            "timed in CPU time, which others' load does not move"]


def _search(need: Callable[[int], float], budget: float, cap: int) -> tuple[int, int | None, float]:
    """The largest micro-batch whose traced peak fits ``budget``: the smallest that does not (None:
    the cap was the limit) and the peak's growth per sample.

    Peak grows about linearly with the micro-batch: two traces give the slope, a jump lands near
    the edge, and a few more traces settle it exactly (each trace is a full fake step).
    """
    slope = max((need(min(2, cap)) - need(1)) / max(min(2, cap) - 1, 1), 1e-9)
    good, bad = (2, None) if cap >= 2 and need(2) <= budget else (1, 2 if cap >= 2 else None)
    guess = good + max(1, int((budget - need(good)) / slope))
    for _ in range(12):
        top = cap if bad is None else bad - 1
        guess = max(good + 1, min(guess, top))
        if good >= top:
            break
        if need(guess) <= budget:
            good = guess
            if good > 2:
                slope = max((need(good) - need(1)) / (good - 1), 1e-9)
            guess = good + max(1, int((budget - need(good)) / slope))
        else:
            bad = guess
            guess = (good + bad) // 2
    return good, bad, slope


def _calibrate(
    measured: Mapping[str, Any],
    at: Callable[[int, bool], Trace],
    spec: GpuSpec,
    timing: Callable[[Trace, int, int], dict[str, float]],
) -> Calibration:
    """Measured over predicted at the earlier run's own micro-batch and accumulation."""
    size, accum = int(measured["micro_batch"]), int(measured.get("accum_steps") or 1)
    trace = at(size, accum > 1)
    memory = time_ = 1.0
    predicted_mib = trace.peak_bytes * (1 + spec.allocator_overhead) / MIB
    if measured.get("peak_reserved_mib") and predicted_mib > 0:
        memory = float(measured["peak_reserved_mib"]) / predicted_mib
    predicted_s = timing(trace, size, accum)["step"]
    if measured.get("step_s") and predicted_s > 0:
        time_ = float(measured["step_s"]) / predicted_s
    return Calibration(memory, time_, str(measured.get("source") or "an earlier run"))


def _meta_params(parts: Parts) -> list[torch.Tensor]:
    try:
        with torch.device("meta"):
            return list(parts.model_fn().parameters())
    except Exception:
        return list(parts.model_fn().parameters())


def _tokens_per_sample(parts: Parts) -> int | None:
    """Tokens in one sample when the data are token sequences (integer 1-D inputs), else None."""
    from trainer.batch_finder import sample_batch

    batch = sample_batch(parts.train_data, 1, torch.device("cpu"), False, parts.loss_fn.collate)
    first = batch[0] if isinstance(batch, tuple | list) else (
        next(iter(batch.values())) if isinstance(batch, Mapping) else batch)
    if isinstance(first, torch.Tensor) and not first.is_floating_point() and first.dim() == 2:
        return int(first.shape[1])
    return None


def _does_not_fit(spec: GpuSpec, parts: Parts, mib: float, trace: Trace) -> str:
    """Micro-batch 1 is over the GPU: by how much, and what would fit."""
    over = mib - spec.usable_mib
    ideas = []
    if parts.precision == "fp32":
        ideas.append("precision: bf16 (autocast halves most activations)")
    if _tokens_per_sample(parts):
        ideas.append("a shorter sequence (model_args/data_args)")
    ideas.append("activation checkpointing in the model (torch.utils.checkpoint keeps a layer's inputs only)")
    tensors = mib - spec.context_mib
    bigger = sorted((g for g in gpu_table().values() if g.usable_mib > tensors + g.context_mib),
                    key=lambda g: g.usable_mib)
    if bigger:
        ideas.append(f"a bigger GPU: {bigger[0].aliases[0] if bigger[0].aliases else bigger[0].name} "
                     f"({bigger[0].usable_mib / 1024:.0f} GiB)")
    return (
        f"batch_size: even a micro-batch of 1 needs {mib / 1024:.2f} GiB on {spec.name}, "
        f"{over / 1024:.2f} GiB over its {spec.usable_mib / 1024:.2f} GiB ({trace.how}); what would fit: "
        + "; ".join(ideas)
    )
