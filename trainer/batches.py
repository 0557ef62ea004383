"""From any batch and any model output to one loss: tuples, dicts (Hugging Face style), ``.loss`` objects.

Why one place: the training step, evaluation, find-batch, the FLOP count and ``estimate`` all run the
user's model on a batch and need the same answer to "what goes in, what is the loss, what are the
logits". Conventions, the same as torch's and Hugging Face's:

- a batch is a tuple/list ``(input, target, ...)`` -> ``model(input)`` (a tuple input is spread:
  ``model(*input)``); a lone tensor or a 1-tuple has no target;
- a dict batch -> ``model(**batch)``, keeping only the keys ``forward`` accepts (all of them when it
  takes ``**kwargs``); the target is ``batch[label_key]`` (default ``labels``, else ``label``), so a
  Hugging Face model that takes ``labels`` computes its own loss;
- the output is a tensor (the logits), a dict/``ModelOutput`` (``loss``, ``logits``), an object with
  ``.loss``/``.logits``, or a tuple. A tuple whose first element is a 0-dim tensor is
  ``(loss, logits, ...)`` (Hugging Face's ``return_dict=False`` given labels); any other tuple is
  ``(logits, ...)``. Why 0-dim: a loss reduced to one number has no dimensions, and logits always
  have some (a class score per sample at least), so the rule never reads one as the other. A loss
  left as shape ``(1,)`` is read as logits: reduce it (``.mean()``) or return a dict.

``loss: auto`` uses the model's own loss when its output has one, else cross-entropy on the logits
(flattened over positions for token-level ``(B, T, C)`` logits, ignoring label -100). A named loss is
always ``loss(logits, target)``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.errors import UserCodeError

log = logging.getLogger(__name__)

DEFAULT_LABEL_KEYS = ("labels", "label")


def to_device(batch: Any, device: torch.device, channels_last: bool = False) -> Any:
    """The same structure with every tensor on ``device`` (4-D float tensors channels-last if asked)."""
    if isinstance(batch, torch.Tensor):
        moved = batch.to(device, non_blocking=True)
        if channels_last and moved.dim() == 4 and moved.is_floating_point():
            moved = moved.contiguous(memory_format=torch.channels_last)
        return moved
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, channels_last) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        moved_items = [to_device(v, device, channels_last) for v in batch]
        if hasattr(batch, "_fields"):  # a namedtuple is built from positional fields
            return type(batch)(*moved_items)
        return type(batch)(moved_items)
    return batch


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / DataParallel / torch.compile wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if inner is None and isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            inner = model.module
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def forward_keys(model: nn.Module) -> frozenset[str] | None:
    """Keyword names ``model.forward`` accepts; None when it takes ``**kwargs`` (then pass everything)."""
    try:
        params = inspect.signature(unwrap(model).forward).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def leads_with_loss(output: Any) -> bool:
    """Whether a tuple output is ``(loss, logits, ...)``: its first element is a 0-dim tensor."""
    return (
        isinstance(output, tuple | list)
        and bool(output)
        and isinstance(output[0], torch.Tensor)
        and output[0].dim() == 0
    )


def output_loss(output: Any) -> torch.Tensor | None:
    """The loss a model computed itself (``output["loss"]``, ``.loss``, a tuple's 0-dim first), if any."""
    if isinstance(output, Mapping):
        value = output.get("loss")
    elif isinstance(output, tuple | list) and not hasattr(output, "loss"):
        value = output[0] if leads_with_loss(output) else None
    else:
        value = getattr(output, "loss", None)
    return value if isinstance(value, torch.Tensor) else None


def output_logits(output: Any) -> torch.Tensor | None:
    """The prediction tensor in a model's output (the tensor itself, ``logits``, or a tuple's first
    element, the second when the first is the loss)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        value = output.get("logits")
    elif isinstance(output, tuple | list) and not hasattr(output, "logits"):
        first = 1 if leads_with_loss(output) else 0
        value = output[first] if len(output) > first else None
    else:
        value = getattr(output, "logits", None)
    return value if isinstance(value, torch.Tensor) else None


def batch_size(batch: Any) -> int:
    """Number of samples in a collated batch: the leading size of its first tensor (or list)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        values: Any = batch.values()
    else:
        values = batch if isinstance(batch, tuple | list) else ()
    for value in values:
        if isinstance(value, torch.Tensor | Mapping | tuple | list):
            return batch_size(value)
    return len(batch) if hasattr(batch, "__len__") else 1


def correct_count(logits: torch.Tensor | None, targets: Any) -> torch.Tensor | None:
    """Correct top-1 predictions when the output is class logits (N, C) and the target integer labels (N)."""
    if (
        logits is None
        or not isinstance(targets, torch.Tensor)
        or targets.is_floating_point()
        or logits.dim() != 2
        or targets.dim() != 1
        or logits.shape[0] != targets.shape[0]
    ):
        return None
    return (logits.argmax(dim=1) == targets).sum()


@dataclass
class Scored:
    """One forward pass: the loss to minimise, the logits (if any), the targets (if any), the batch size."""

    loss: torch.Tensor
    logits: torch.Tensor | None
    targets: Any
    size: int


class Objective:
    """How the user's batch becomes a loss: collate, split into input and target, forward, score.

    ``collate`` is kept here so that every code path that builds a batch (the loader, evaluation,
    find-batch, ``estimate``) builds the same one.
    """

    def __init__(
        self,
        loss: Callable[..., Any] | None,
        loss_name: str = "auto",
        label_key: str | None = None,
        collate: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        self.loss, self.loss_name, self.label_key, self.collate = loss, loss_name, label_key, collate
        self._keys: dict[int, frozenset[str] | None] = {}
        self._told_dropped = False

    # -- input and target
    def label_of(self, batch: Mapping[str, Any]) -> tuple[str | None, Any]:
        keys = (self.label_key,) if self.label_key else DEFAULT_LABEL_KEYS
        for key in keys:
            if key in batch:
                return key, batch[key]
        return None, None

    def targets(self, batch: Any) -> Any:
        if isinstance(batch, Mapping):
            return self.label_of(batch)[1]
        if isinstance(batch, tuple | list) and len(batch) >= 2:
            return batch[1]
        return None

    def forward(self, model: nn.Module, batch: Any) -> Any:
        """Run ``model`` on the batch's input part (see the module docstring for the conventions)."""
        if isinstance(batch, Mapping):
            return model(**self._model_kwargs(model, batch))
        inputs = batch[0] if isinstance(batch, tuple | list) else batch
        if isinstance(inputs, Mapping):
            return model(**self._model_kwargs(model, inputs))
        if isinstance(inputs, tuple | list):
            return model(*inputs)
        return model(inputs)

    def _model_kwargs(self, model: nn.Module, batch: Mapping[str, Any]) -> dict[str, Any]:
        ident = id(unwrap(model))
        if ident not in self._keys:
            self._keys[ident] = forward_keys(model)
        accepted = self._keys[ident]
        if accepted is None:
            return dict(batch)
        kwargs = {k: v for k, v in batch.items() if k in accepted}
        if not kwargs:
            raise UserCodeError(
                f"model: forward() takes ({', '.join(sorted(accepted))}) but the batch has keys "
                f"{sorted(batch)}; name forward's parameters after the batch keys, or return tuples"
            )
        dropped = sorted(set(batch) - set(kwargs))
        if dropped and not self._told_dropped:
            log.info("batch keys not passed to the model (its forward does not take them): %s", dropped)
            self._told_dropped = True
        return kwargs

    # -- loss
    def __call__(self, model: nn.Module, batch: Any) -> Scored:
        """Forward ``batch`` through ``model`` and score it."""
        output = self.forward(model, batch)
        targets = self.targets(batch)
        logits = output_logits(output)
        if self.loss is None:
            loss = output_loss(output)
            if loss is None:
                loss = self._default_loss(output, logits, targets)
        else:
            if targets is None:
                raise UserCodeError(
                    f"loss: {self.loss_name} needs a target, but the batch has none "
                    "(samples as (input, target), or a 'labels' key; or loss: auto for a model that "
                    "returns its own loss)"
                )
            loss = self.loss(logits if logits is not None else output, targets)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise UserCodeError(
                f"loss: {self.loss_name} gave {shape}, not a single number (reduce it, e.g. with .mean())"
            )
        return Scored(loss=loss, logits=logits, targets=targets, size=batch_size(batch))

    def _default_loss(self, output: Any, logits: torch.Tensor | None, targets: Any) -> torch.Tensor:
        if logits is None or not isinstance(targets, torch.Tensor):
            what = type(output).__name__
            raise UserCodeError(
                f"loss: auto needs the model's own loss (a 'loss' key or .loss in its output) or logits and "
                f"a target; the model returned a {what}"
                + ("" if isinstance(targets, torch.Tensor) else " and the batch has no target")
                + " (pass labels to a model that computes its loss, or set loss)"
            )
        if logits.dim() > 2 and targets.dim() == logits.dim() - 1 and logits.shape[:-1] == targets.shape:
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return F.cross_entropy(logits, targets)
