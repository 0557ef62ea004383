"""Turn a validated config into concrete choices for this machine: device, dtype, layout, loaders.

Why one place: ``train``, ``find-batch`` and ``estimate`` must make the *same* decisions (a batch
found in bf16 channels-last is meaningless for an fp32 run), and the decisions are printed and
saved in the resolved config so a person can see what "auto" became.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer import distributed, precision
from trainer.batches import Objective
from trainer.config import ConfigError, TrainConfig
from trainer.data import StepSource, choose_workers, is_stream
from trainer.errors import user_code
from trainer.imports import build, check_arguments, load_callable
from trainer.run_folder import COMPILE_CACHE_DIR

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """The decided run: where it runs, in which dtype and layout, and the user's model/data/loss."""

    config: TrainConfig
    world: distributed.World
    precision: str
    channels_last: bool
    num_workers: int
    pin_memory: bool
    model_fn: Callable[[], nn.Module]
    loss_fn: Objective  # the user's loss wrapped: loss_fn(model, batch) -> Scored (trainer.batches)
    train_data: Any
    eval_data: Any


def has_conv(model_fn: Callable[[], nn.Module]) -> bool:
    """Whether the model has 2-D convolutions, checked on the meta device (no memory, no RNG draw)."""
    try:
        with torch.device("meta"):
            model = model_fn()
    except Exception:  # a factory that cannot build on meta: assume no (the safe default)
        return False
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def wants_channels_last(requested: bool | str, device: str, dtype: str, conv: bool) -> bool:
    """auto: on for conv models on CUDA with AMP (tensor-core convs want NHWC); off on CPU."""
    if requested != "auto":
        return bool(requested)
    return device == "cuda" and dtype in ("bf16", "fp16") and conv


def configure_determinism(config: TrainConfig, device: str) -> None:
    if config.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    elif device == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def build_model(factory: Callable[..., nn.Module], path: str, args: dict[str, Any]) -> nn.Module:
    """The user's model; an exception from their factory (bad model_args...) is a UserCodeError."""
    from trainer.errors import user_code

    with user_code("model", f"{path} with model_args {args}"):
        return factory(**args)


def load_data(config: TrainConfig) -> tuple[Any, Any]:
    data_fn = load_callable(config.data, "data", config.project_dir)
    check_arguments(data_fn, config.data_args, "data_args")
    with user_code("data", f"{config.data} with data_args {config.data_args}"):
        out = data_fn(**config.data_args)
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise ConfigError(
            [f"data: {config.data} must return (train_dataset, eval_dataset); eval may be None"]
        )
    train, held = out
    if is_stream(train):
        if config.epochs is not None and not isinstance(train, StepSource):  # shards know their length
            raise ConfigError(
                [f"epochs: {config.data} returned an iterable dataset, whose length is unknown (set steps)"]
            )
    elif not hasattr(train, "__len__") or not hasattr(train, "__getitem__"):
        raise ConfigError(
            [
                f"data: {config.data} returned a {type(train).__name__} for training; give a map-style "
                "dataset (__len__ and __getitem__) or a torch IterableDataset"
            ]
        )
    elif len(train) == 0:
        raise ConfigError([f"data: {config.data} returned an empty training dataset"])
    return train, held


def make_objective(config: TrainConfig) -> Objective:
    """The loss and collate the config names, built once (a class is instantiated with its *_args)."""
    loss, collate = None, None
    if config.loss != "auto":
        loss = build(config.loss, "loss", config.loss_args, "loss_args", config.project_dir)
    if config.collate is not None:
        collate = build(config.collate, "collate", config.collate_args, "collate_args", config.project_dir)
    return Objective(loss, config.loss, config.label_key, collate)


def prepare(config: TrainConfig) -> Runtime:
    """Resolve every 'auto', join the process group if any, load data; nothing trains yet."""
    try:
        device_kind = distributed.pick_device(config.device)
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    model_factory = load_callable(config.model, "model", config.project_dir)
    check_arguments(model_factory, config.model_args, "model_args")
    model_fn = functools.partial(build_model, model_factory, config.model, config.model_args)
    loss_fn = make_objective(config)
    world = distributed.setup(device_kind, config.ddp_timeout_s)
    if config.memory_fraction is not None and device_kind == "cuda":
        torch.cuda.set_per_process_memory_fraction(config.memory_fraction, world.device)
    configure_determinism(config, device_kind)
    dtype = precision.resolve(config.precision, device_kind)
    if dtype == "fp16" and device_kind == "cpu":
        raise ConfigError(["precision: fp16 needs device cuda (use bf16 or fp32 on cpu)"])
    train, held = load_data(config)
    return Runtime(
        config=config,
        world=world,
        precision=dtype,
        channels_last=wants_channels_last(config.channels_last, device_kind, dtype, has_conv(model_fn)),
        num_workers=choose_workers(config.num_workers, device_kind),
        pin_memory=(device_kind == "cuda") if config.pin_memory == "auto" else bool(config.pin_memory),
        model_fn=model_fn,
        loss_fn=loss_fn,
        train_data=train,
        eval_data=held,
    )


def compile_cache_dir(config: TrainConfig, out_dir: Path) -> Path:
    """Inductor's cache on the run's disk, so a restart after preemption skips the cold compile."""
    return (
        Path(os.path.expanduser(config.compile_cache_dir))
        if config.compile_cache_dir
        else out_dir / COMPILE_CACHE_DIR
    )
