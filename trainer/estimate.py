"""``estimate``: how much memory training needs, and how big a model or batch would fit.

Why measure activations instead of guessing: parameters and gradients follow from the parameter
count (fp32 master weights 4 B + gradients 4 B, plus a 2 B/param autocast copy in bf16/fp16), the
optimizer's state from one measured step (AdamW moments: 8 B/param, so 16 B/param in all; SGD with
momentum 4 B), but activations depend on the model's shape. They are measured exactly, on any
device, by summing the tensors autograd saves for backward during one forward pass
(``saved_tensors_hooks``). The user's rule of thumb, 2 bytes per parameter in fp16/bf16, is what
*inference* weights take; training adds the rest, and the table shows both.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.batch_finder import sample_batch
from trainer.optim import build_optimizer
from trainer.precision import make_amp
from trainer.runtime import Runtime

GB = 1e9
BYTES_PER_PARAM = {"weights_fp32": 4, "grads": 4, "adamw_state": 8}
HALF_COPY = 2  # autocast keeps a bf16/fp16 copy of the weights during forward
HEADROOM = 0.9  # CUDA context, allocator rounding and fragmentation eat the rest


def activation_bytes(rt: Runtime, model: torch.nn.Module, batch: int) -> int:
    """Bytes autograd keeps alive between forward and backward for one micro-batch (unique storages)."""
    sample = sample_batch(rt.train_data, batch, rt.world.device, rt.channels_last, rt.loss_fn.collate)
    return saved_bytes(model, rt.loss_fn, sample, rt.precision)


def saved_bytes(model: torch.nn.Module, loss_fn: Any, sample: Any, precision: str) -> int:
    """What :func:`activation_bytes` measures, from the parts alone (``sample``: a collated batch on
    the model's device). The plan's fallback (trainer.plan) uses it where fake tensors cannot follow
    the model."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            make_amp(precision, device.type).autocast(),
        ):
            loss = loss_fn(model, sample).loss
        loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(n for ptr, n in seen.items() if ptr not in param_ptrs)


def fixed_bytes(config: Any, model: torch.nn.Module, precision: str) -> float:
    """Weights, gradients, the optimizer's measured state and the autocast copy: what a step holds
    whatever the batch (the same count :func:`estimate` makes)."""
    n = sum(p.numel() for p in model.parameters())
    state = _state_bytes(config, model, torch.device("cpu"))
    half = HALF_COPY if precision in ("bf16", "fp16") else 0
    return n * (BYTES_PER_PARAM["weights_fp32"] + BYTES_PER_PARAM["grads"] + half) + state


def optimizer_state_bytes(rt: Runtime, model: torch.nn.Module) -> int:
    """Bytes of per-element state the configured optimizer keeps, measured after one step.

    Measured, not assumed: AdamW keeps 8 B/param, SGD with momentum 4, plain SGD 0, and a user's
    optimizer whatever it keeps. Per-step scalars (Adam's ``step``) are left out. The step runs on
    zero gradients of the throwaway estimate model.
    """
    return _state_bytes(rt.config, model, rt.world.device)


def _state_bytes(config: Any, model: torch.nn.Module, device: torch.device) -> int:
    optimizer = build_optimizer(config, model, device)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    shapes = {id(p): p.shape for p in model.parameters()}
    total = 0
    for param, state in optimizer.state.items():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.shape == shapes.get(id(param)):
                total += value.numel() * value.element_size()
    model.zero_grad(set_to_none=True)
    return total


def device_memory_gb(rt: Runtime, requested: float | None) -> tuple[float, str]:
    if requested is not None:
        return requested, "as given (--memory-gb)"
    if rt.world.device.type == "cuda":
        total = torch.cuda.get_device_properties(rt.world.device).total_memory / GB
        return total, torch.cuda.get_device_name(rt.world.device)
    from trainer.gpus import MIB, named

    l4 = named("L4")  # trainer/gpus.yaml: what nvidia-smi shows on a G2
    if l4 is None:
        raise RuntimeError("trainer/gpus.yaml has no L4 entry, the project's target GPU")
    return l4.usable_mib * MIB / GB, f"NVIDIA L4 ({l4.usable_mib:,.0f} MiB usable), the project's target GPU"


def estimate(
    rt: Runtime, memory_gb: float | None = None, probe_batches: tuple[int, int] = (2, 8)
) -> dict[str, Any]:
    """Predicted peak memory for the configured micro-batch, and the largest batch/model that fit."""
    model = rt.model_fn().to(rt.world.device)
    if rt.channels_last:
        model = model.to(memory_format=torch.channels_last)
    n = sum(p.numel() for p in model.parameters())
    half = rt.precision in ("bf16", "fp16")
    small, large = probe_batches
    act_small, act_large = activation_bytes(rt, model, small), activation_bytes(rt, model, large)
    state_bytes = optimizer_state_bytes(rt, model)
    state_per_param = state_bytes / max(n, 1)
    per_param = BYTES_PER_PARAM["weights_fp32"] + BYTES_PER_PARAM["grads"] + state_per_param
    per_param += HALF_COPY if half else 0
    fixed = n * per_param
    per_sample = (act_large - act_small) / (large - small)
    act_base = max(0.0, act_small - per_sample * small)
    micro = rt.config.batch_size if isinstance(rt.config.batch_size, int) else large
    total_gb, source = device_memory_gb(rt, memory_gb)
    budget = total_gb * GB * HEADROOM
    largest_batch = int((budget - fixed - act_base) // per_sample) if per_sample > 0 else None
    result: dict[str, Any] = {
        "params": n,
        "precision": rt.precision,
        "optimizer": rt.config.optimizer,
        "bytes_per_param_training": per_param,
        "memory_gb": {
            "weights": n * BYTES_PER_PARAM["weights_fp32"] / GB,
            "gradients": n * BYTES_PER_PARAM["grads"] / GB,
            "optimizer_state": state_bytes / GB,
            "autocast_copy": n * HALF_COPY / GB if half else 0.0,
            "activations_per_sample": per_sample / GB,
            "activations_at_micro_batch": (act_base + per_sample * micro) / GB,
            "predicted_peak_at_micro_batch": (fixed + act_base + per_sample * micro) / GB,
        },
        "micro_batch": micro,
        "device_memory_gb": total_gb,
        "device_memory_source": source,
        "largest_micro_batch_predicted": largest_batch,
        "largest_model_params": {
            "inference_bf16_2_bytes_per_param": int(budget // 2),
            "training_mixed_precision_adamw": int(budget // (sum(BYTES_PER_PARAM.values()) + HALF_COPY)),
        },
    }
    if rt.world.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(rt.world.device)
        optimizer = build_optimizer(rt.config, model, rt.world.device)
        sample = sample_batch(rt.train_data, micro, rt.world.device, rt.channels_last, rt.loss_fn.collate)
        with make_amp(rt.precision, "cuda").autocast():
            loss = rt.loss_fn(model, sample).loss
        loss.backward()
        optimizer.step()
        result["memory_gb"]["measured_peak_at_micro_batch"] = (
            torch.cuda.max_memory_allocated(rt.world.device) / GB
        )
    return result


def format_estimate(r: dict[str, Any]) -> str:
    m = r["memory_gb"]
    lines = [
        f"parameters                {r['params']:,}  "
        f"({r['precision']}, {r['bytes_per_param_training']:g} B/param "
        f"to train with {r['optimizer']})",
        f"  weights (fp32)          {m['weights']:.4f} GB",
        f"  gradients               {m['gradients']:.4f} GB",
        f"  optimizer state         {m['optimizer_state']:.4f} GB (measured)",
        f"  autocast copy           {m['autocast_copy']:.4f} GB",
        f"activations (measured)    {m['activations_per_sample'] * 1e3:.3f} MB per sample",
        f"predicted peak at micro-batch {r['micro_batch']}: {m['predicted_peak_at_micro_batch']:.3f} GB",
    ]
    if "measured_peak_at_micro_batch" in m:
        lines.append(f"measured peak (one real step):    {m['measured_peak_at_micro_batch']:.3f} GB")
    lines += [
        f"device memory             {r['device_memory_gb']:.1f} GB ({r['device_memory_source']}); "
        f"planning with {int(HEADROOM * 100)}% of it",
        f"largest micro-batch       {r['largest_micro_batch_predicted']} "
        "(predicted; confirm with find-batch)",
        f"largest model, inference in bf16/fp16 (2 B/param):   "
        f"{r['largest_model_params']['inference_bf16_2_bytes_per_param'] / 1e9:.1f} B params",
        f"largest model, training with AMP + AdamW (18 B/param, before activations): "
        f"{r['largest_model_params']['training_mixed_precision_adamw'] / 1e9:.2f} B params",
    ]
    return "\n".join(lines)
