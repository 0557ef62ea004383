"""The optimizer and the LR schedule, chosen by name or by path, with arguments.

Why names *and* paths: ``optimizer: SGD`` with ``optimizer_args: {momentum: 0.9}`` covers most
research code; an import or file path (``./lion.py:Lion``) covers the rest. A path may name an
optimizer class (called as ``Class(params, lr=lr, **optimizer_args)``) or a factory whose first
parameter is called ``model`` (called with the model itself, so it can build parameter groups, e.g.
no weight decay on norms and biases).

The schedule is either the built-in one (warm-up then cosine, a pure function of the step, so a
resume needs nothing but the step) or a ``torch.optim.lr_scheduler`` class by name or path, stepped
once per optimizer step and saved in every checkpoint. ``total_steps``/``T_max`` default to the
run's optimizer steps and ``max_lr`` to ``lr``, so ``scheduler: OneCycleLR`` needs no arguments.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any

import torch
from torch import nn

from trainer.config import ConfigError, TrainConfig
from trainer.errors import UserCodeError, user_code
from trainer.imports import check_arguments, load_callable
from trainer.schedule import lr_at

#: Arguments filled from the run when a scheduler takes them and the user did not give them.
RUN_FILLED = ("total_steps", "T_max", "max_lr")


def _named(module: Any, base: type, spec: str, key: str, project_dir: str | None) -> Any:
    """``spec`` as a class of ``module`` (exact name, then any case) or as an import/file path."""
    if ":" in spec:
        return load_callable(spec, key, project_dir)
    names = {
        name: obj
        for name in dir(module)
        if inspect.isclass(obj := getattr(module, name)) and issubclass(obj, base) and obj is not base
    }
    if spec in names:
        return names[spec]
    folded = {name.lower(): obj for name, obj in names.items()}
    if spec.lower() in folded:
        return folded[spec.lower()]
    close = difflib.get_close_matches(spec, list(names), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(
        [
            f"{key}: {spec!r} is not in {module.__name__} ({hint}known: {', '.join(sorted(names))}; "
            "or give 'package.module:Class' or './file.py:Class')"
        ]
    )


def _takes_model(target: Any) -> bool:
    if inspect.isclass(target):
        return False
    try:
        first = next(iter(inspect.signature(target).parameters), None)
    except (TypeError, ValueError):
        return False
    return first == "model"


def build_optimizer(config: TrainConfig, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """The configured optimizer over ``model``'s parameters; ConfigError naming the key on bad arguments."""
    target = _named(torch.optim, torch.optim.Optimizer, config.optimizer, "optimizer", config.project_dir)
    kwargs: dict[str, Any] = {"lr": config.lr}
    source = {"lr": "lr"}
    if config.weight_decay is not None:
        kwargs["weight_decay"], source["weight_decay"] = config.weight_decay, "weight_decay"
    if config.betas is not None:
        kwargs["betas"], source["betas"] = tuple(config.betas), "betas"
    kwargs.update(config.optimizer_args)
    fusable = target in (torch.optim.AdamW, torch.optim.Adam) and device.type == "cuda"
    if fusable and "fused" not in kwargs and "foreach" not in kwargs:
        kwargs["fused"] = True  # one kernel for the whole update on the GPU
    first = model if _takes_model(target) else model.parameters()
    _check_keys(target, kwargs, source, config.optimizer)
    check_arguments(target, kwargs, "optimizer_args", first)
    try:
        optimizer = target(first, **kwargs)
    except (TypeError, ValueError) as exc:  # torch's own checks: "Invalid momentum value: -1"
        raise ConfigError([f"optimizer_args: {config.optimizer} refused its arguments: {exc}"]) from None
    except Exception as exc:
        raise UserCodeError(f"optimizer: {config.optimizer} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserCodeError(
            f"optimizer: {config.optimizer} made a {type(optimizer).__name__}, not a torch.optim.Optimizer"
        )
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])  # the built-in schedule scales each group from here
    return optimizer


def _check_keys(target: Any, kwargs: dict[str, Any], source: dict[str, str], name: str) -> None:
    """A top-level key the optimizer does not take (``betas`` for SGD) is named as that key."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    problems = [
        f"optimizer: {name} takes no lr argument (the trainer passes lr; wrap it in a factory that does)"
        if k == "lr"
        else f"{source[k]}: {name} takes no {k} (remove {source[k]}, or choose another optimizer)"
        for k in kwargs
        if k in source and k not in params
    ]
    if problems:
        raise ConfigError(problems)


class Schedule:
    """Sets the LR before each optimizer step and advances after it; its state goes in checkpoints."""

    def __init__(self, config: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> None:
        self.config, self.optimizer, self.total_steps = config, optimizer, total_steps
        self.scheduler = make_scheduler(config, optimizer, total_steps)

    def set_lr(self, step: int) -> float:
        """Make optimizer step ``step`` (0-based) use its LR; return the LR of the first group."""
        if self.scheduler is not None:
            return float(self.optimizer.param_groups[0]["lr"])
        sched = self.config.lr_schedule
        lr = lr_at(
            step,
            lr=self.config.lr,
            total_steps=self.total_steps,
            warmup_steps=sched.warmup_steps,
            min_lr=sched.min_lr,
            cosine=sched.cosine,
        )
        for group in self.optimizer.param_groups:
            base = group.get("initial_lr", self.config.lr)
            group["lr"] = lr if base == self.config.lr else base * lr / self.config.lr
        return float(self.optimizer.param_groups[0]["lr"])

    def step(self) -> None:
        if self.scheduler is not None:
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """Plain values only, so checkpoints stay loadable with ``weights_only=True``."""
        if self.scheduler is None:
            return {}
        return {k: v for k, v in self.scheduler.state_dict().items() if _plain(v)}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scheduler is not None and state:
            self.scheduler.load_state_dict(state)


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float | str | torch.Tensor):
        return True
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str | int) and _plain(v) for k, v in value.items())
    return False


def make_scheduler(
    config: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The configured torch scheduler (None: the built-in schedule); ConfigError naming the key."""
    sched = config.lr_schedule
    if sched.scheduler is None:
        return None
    key, args_key = "lr_schedule.scheduler", "lr_schedule.scheduler_args"
    lrs = torch.optim.lr_scheduler
    target = _named(lrs, lrs.LRScheduler, sched.scheduler, key, config.project_dir)
    if inspect.isclass(target) and issubclass(target, lrs.ReduceLROnPlateau):
        raise ConfigError(
            [f"{key}: ReduceLROnPlateau needs a metric at every step; use a step-based scheduler"]
        )
    kwargs = dict(sched.scheduler_args)
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    fills = {"total_steps": total_steps, "T_max": total_steps, "max_lr": config.lr}
    for name in RUN_FILLED:
        if name in params and name not in kwargs and not (name == "total_steps" and "epochs" in kwargs):
            kwargs[name] = fills[name]
    check_arguments(target, kwargs, args_key, optimizer)
    try:
        with user_code(key, f"{sched.scheduler} with {args_key} {sched.scheduler_args}"):
            scheduler = target(optimizer, **kwargs)
    except UserCodeError as exc:
        if isinstance(exc.__cause__, TypeError | ValueError):
            refused = f"{args_key}: {sched.scheduler} refused its arguments: {exc.__cause__}"
            raise ConfigError([refused]) from None
        raise
    if not isinstance(scheduler, lrs.LRScheduler):
        made = type(scheduler).__name__
        raise UserCodeError(f"{key}: {sched.scheduler} made a {made}, not an LR scheduler")
    return scheduler
