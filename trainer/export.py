"""The trained model, out of forja's checkpoint format: safetensors weights plus what rebuilds them.

Why: a checkpoint (:mod:`trainer.checkpoint`) is for resuming. It holds the optimizer, RNG
states and the resolved config in a pickle-framed zip that only ``torch.load`` reads. A model used
elsewhere wants the weights alone, in a format any framework can read without running code:
safetensors. It also needs the few facts that rebuild the module around them. So an export is a
folder::

    <out_dir>/model/model.safetensors   the weights (state_dict order; tied tensors stored once)
    <out_dir>/model/model.json          what rebuilds it (FORMAT_VERSION below): the model's import
                                        path and model_args, the step, dtype, the weights' sha256,
                                        the tied names, the checkpoint it came from

Tied or shared tensors: safetensors refuses two names over one storage. A name whose tensor is
the same view of the same storage as an earlier name (tied embeddings) is stored once and listed
in ``tied`` (alias -> stored name); :func:`load_model` puts it back before ``load_state_dict``.
Other tensors over shared or non-contiguous storage (channels-last weights, slices) are copied
contiguous first: the values are the same, only the layout changes.

Atomic: model.json is written last and holds the weights' sha256, so it is the completion marker.
An export first removes the old model.json, then renames the new weights into place, then writes
the new model.json. A folder without model.json is incomplete, and a model.json whose sha256 does
not match its weights is refused by :func:`load_model`. The bucket copy (:func:`upload_model`)
keeps the same order under ``PREFIX/<run>/model/``.

This module imports torch only where tensors are handled: the controller (``forja model push``)
checks an export with :func:`verify` without torch installed.

Entry points: the end of a completed run (``export_model: true``, the default), and on request
``python -m trainer export RUN_DIR``, which exports the newest checkpoint that verifies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.finite import describe_tensors, nonfinite_tensors
from trainer.gcs import storage_client
from trainer.run_folder import CHECKPOINTS_DIR, MODEL_DIR, atomic_path, write_atomic
from trainer.version import __version__

if TYPE_CHECKING:  # torch is imported where tensors are handled: forja reads model.json without it
    import torch
    from torch import nn

log = logging.getLogger(__name__)

# The exported model's folder inside a run folder, and its bucket prefix beside ``checkpoints/``, is
# trainer.run_folder.MODEL_DIR; the names inside it are the model folder's own (any --out folder too).
WEIGHTS = "model.safetensors"
CONFIG = "model.json"
#: What model.json's ``format`` says, and the version of its fields this trainer writes and reads.
FORMAT = "forja-model"
FORMAT_VERSION = 1


class ExportError(Exception):
    """An export that cannot be made or a model folder that cannot be loaded; says what and the fix."""


class NonFiniteWeights(ExportError):
    """Weights with NaN or infinite elements: never exported, pushed or loaded (trainer.finite)."""

    def __init__(self, where: str, tensors: list[str]) -> None:
        self.tensors = tensors
        super().__init__(
            f"{where}: {len(tensors)} tensor(s) hold NaN or infinite values ({describe_tensors(tensors)}); "
            "the run diverged. Export a checkpoint from before the divergence with `python -m trainer export "
            "RUN_DIR --step N` (the run's summary.json names it), or train again with a lower lr"
        )


@dataclass(frozen=True)
class Exported:
    """Where an export went and what it holds (model.json's fields)."""

    folder: Path
    info: dict[str, Any]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(8 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _view_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    """Two names with this key are one tensor (same storage, offset, shape, strides, dtype): tied."""
    return (
        tensor.device,
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tensor.stride(),
        tensor.dtype,
    )


def flatten_state(state: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors safetensors can store, tied alias -> stored name) from a state_dict.

    Every value must be a tensor (a model's state_dict is). Moved to the CPU; a tensor sharing
    storage with one already kept, or not contiguous, is copied so that no two stored tensors overlap.
    """
    import torch

    kept: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    first_name: dict[tuple[Any, ...], str] = {}
    storages: set[int] = set()
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise ExportError(f"state_dict entry {name!r} is a {type(value).__name__}, not a tensor")
        key = _view_key(value)
        if key in first_name and value.numel() > 0:
            tied[name] = first_name[key]
            continue
        first_name[key] = name
        tensor = value.detach().cpu()
        pointer = tensor.untyped_storage().data_ptr()
        if tensor.numel() > 0 and (pointer in storages or not tensor.is_contiguous()):
            tensor = tensor.contiguous().clone()
            pointer = tensor.untyped_storage().data_ptr()
        if tensor.numel() > 0:
            storages.add(pointer)
        kept[name] = tensor
    # A kept tensor that is a view into a larger storage shared with a later one was added before
    # the later one was seen: copy every kept tensor whose storage is larger than itself too.
    for name, tensor in kept.items():
        if tensor.numel() and tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
            kept[name] = tensor.clone()
    return kept, tied


def _main_dtype(tensors: Mapping[str, torch.Tensor]) -> str:
    """The dtype of most elements (``float32``, ``bfloat16``...), or ``none`` for an empty state."""
    counts: dict[str, int] = {}
    for tensor in tensors.values():
        name = str(tensor.dtype).removeprefix("torch.")
        counts[name] = counts.get(name, 0) + tensor.numel()
    return max(counts, key=lambda k: counts[k]) if counts else "none"


def export_state(
    state: Mapping[str, Any],
    config: Mapping[str, Any],
    folder: Path,
    *,
    step: int,
    checkpoint: str | None = None,
    run: str | None = None,
) -> Exported:
    """Write ``state`` (a model's state_dict) and what rebuilds it into ``folder`` (see the module doc).

    ``config`` is the run's resolved config (a checkpoint's ``config``): its ``model``,
    ``model_args`` and ``project_dir`` go into model.json.
    """
    import torch
    from safetensors.torch import save_file

    if not config.get("model"):
        raise ExportError("the run's config names no model (model: package.module:factory)")
    tensors, tied = flatten_state(state)
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise NonFiniteWeights(f"the model of step {step}", bad)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).unlink(missing_ok=True)  # from here on the folder is incomplete until the end
    weights = folder / WEIGHTS
    with atomic_path(weights) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    info = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": config["model"],
        "model_args": dict(config.get("model_args") or {}),
        "project_dir": config.get("project_dir"),
        "weights": WEIGHTS,
        "sha256": sha256_file(weights),
        "size": weights.stat().st_size,
        "dtype": _main_dtype(tensors),
        "parameters": sum(t.numel() for t in tensors.values()),
        "tied": tied,
        "step": int(step),
        "run": run,
        "checkpoint": checkpoint,
        "trainer_version": __version__,
        "torch_version": str(torch.__version__),
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    write_atomic(folder / CONFIG, json.dumps(info, indent=2) + "\n")  # then the folder is fsynced
    return Exported(folder, info)


def export_run(
    run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, step: int | None = None
) -> Exported:
    """Export the newest checkpoint of ``run_dir`` that verifies (or the one of ``step``: an earlier
    one, from before a divergence) into ``out`` (default ``run_dir/model``).

    Nothing is set aside: a checkpoint that fails verification is skipped, not renamed (a
    running trainer may own the folder).
    """
    from trainer.checkpoint import CheckpointManager, CorruptCheckpoint, Found, load_checkpoint

    run = Path(os.path.expanduser(str(run_dir))).resolve()
    if not run.is_dir():
        raise ExportError(f"run folder {run} does not exist (give the run's out_dir, e.g. runs/digits)")
    ckpts = CheckpointManager(run / CHECKPOINTS_DIR)
    if not ckpts.list():
        raise ExportError(
            f"run folder {run} has no checkpoint to export (none in {ckpts.folder}); train it first, "
            "or fetch its checkpoints (forja fetch RUN --checkpoints)"
        )
    if step is not None:
        path = ckpts.path_for(step)
        if not path.is_file():
            have = ", ".join(p.name for p in ckpts.list())
            raise ExportError(f"step {step}: no {path.name} in {ckpts.folder} (there are: {have})")
        try:
            found: Found | None = Found(path, load_checkpoint(path), [])
        except CorruptCheckpoint as exc:
            raise ExportError(f"{path.name} does not verify ({exc}); choose another step") from None
    else:
        found = ckpts.load_latest(quarantine=False)
    if found is None:
        raise ExportError(f"no checkpoint in {ckpts.folder} verifies; nothing to export")
    state = found.state
    folder = Path(out) if out is not None else run / MODEL_DIR
    return export_state(
        state["model"],
        state.get("config") or {},
        folder,
        step=int(state["step"]),
        checkpoint=found.path.name,
        run=os.environ.get("FORJA_RUN") or run.name,
    )


def read_info(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """model.json of an exported model, checked for its format; ExportError naming the fix."""
    path = Path(folder) / CONFIG
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise ExportError(
            f"{path} does not exist: not an exported model, or an export that did not finish "
            "(export again: python -m trainer export RUN_DIR)"
        ) from None
    except ValueError as exc:
        raise ExportError(f"{path} is not JSON ({exc})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise ExportError(f"{path} is not a forja model description (format {FORMAT!r})")
    if int(info.get("format_version", 0)) > FORMAT_VERSION:
        raise ExportError(
            f"{path} has format_version {info.get('format_version')}, newer than this trainer reads "
            f"({FORMAT_VERSION}); upgrade forja"
        )
    return info


def verify(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """model.json, after checking that the weights' sha256 is the one it records."""
    info = read_info(folder)
    weights = Path(folder) / str(info.get("weights", WEIGHTS))
    if not weights.is_file():
        raise ExportError(f"{weights} is missing (model.json names it)")
    actual = sha256_file(weights)
    if actual != info.get("sha256"):
        raise ExportError(
            f"{weights}: sha256 {actual[:12]}... is not model.json's {str(info.get('sha256'))[:12]}... "
            "(changed or truncated after the export; export or download it again)"
        )
    bad = nonfinite_tensors(weights)
    if bad:
        raise NonFiniteWeights(str(weights), bad)
    return info


def load_state(folder: str | os.PathLike[str], device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The verified weights as a state_dict, tied names restored (for a model built by hand)."""
    from safetensors.torch import load_file

    info = verify(folder)
    state = load_file(str(Path(folder) / str(info.get("weights", WEIGHTS))), device=str(device))
    for alias, stored in (info.get("tied") or {}).items():
        state[alias] = state[stored]
    return state


def load_model(
    folder: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    project_dir: str | None = None,
) -> nn.Module:
    """Rebuild the exported model in this process: its factory with model_args, the weights loaded.

    The factory is imported as the trainer imports it (``package.module:name`` or a
    ``./file.py:name`` looked up in ``project_dir``, else model.json's project_dir when it exists
    here, else the current folder and PYTHONPATH). Returned in eval mode on ``device``.
    """
    from trainer.imports import check_arguments, load_callable
    from trainer.runtime import build_model

    info = read_info(folder)
    where = project_dir
    if where is None and info.get("project_dir") and Path(str(info["project_dir"])).is_dir():
        where = str(info["project_dir"])
    factory = load_callable(str(info["model"]), "model", where)
    args = dict(info.get("model_args") or {})
    check_arguments(factory, args, "model_args")
    model = build_model(factory, str(info["model"]), args)
    state = load_state(folder, device)
    model.load_state_dict(state, strict=True)
    return model.to(device).eval()


# -- the bucket ---------------------------------------------------------------------------------------


def model_prefix(url: str, run: str) -> tuple[str, str]:
    """(bucket, ``PREFIX/<run>/model/``) for the mirror's ``gs://BUCKET/PREFIX`` and a run name:
    inside the run's own folder (trainer.gcs.run_prefix), so ``--replace`` moves the model with it."""
    from trainer.gcs import run_prefix

    try:
        bucket, prefix = run_prefix(url, run)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    return bucket, f"{prefix}{MODEL_DIR}/"


def upload_model(folder: Path, url: str, run: str, timeout_s: float = 120.0) -> str:
    """Copy an exported model to ``gs://BUCKET/PREFIX/<run>/model/``, model.json last; its gs:// URL.

    The same order as on disk: the old model.json goes first, the weights are uploaded under a
    ``.partial/`` name and copied into place, then model.json (whose sha256 vouches for them).
    A reader that finds model.json finds the weights it describes.
    """
    info = verify(folder)
    bucket_name, prefix = model_prefix(url, run)
    bucket = storage_client().bucket(bucket_name)
    marker = bucket.blob(prefix + CONFIG)
    with contextlib.suppress(Exception):  # absent the first time (NotFound)
        marker.delete(timeout=timeout_s)
    partial = bucket.blob(f"{prefix}.partial/{WEIGHTS}.{uuid.uuid4().hex[:12]}")
    try:
        partial.upload_from_filename(str(folder / WEIGHTS), if_generation_match=0, timeout=timeout_s)
        bucket.copy_blob(partial, bucket, prefix + WEIGHTS, timeout=timeout_s)
    finally:
        with contextlib.suppress(Exception):
            partial.delete(timeout=timeout_s)
    bucket.blob(prefix + CONFIG).upload_from_string(
        json.dumps(info, indent=2) + "\n", content_type="application/json", if_generation_match=0,
        timeout=timeout_s,
    )  # fmt: skip
    return f"gs://{bucket_name}/{prefix}"


def export_at_end(
    out: Path,
    state: Mapping[str, Any],
    config: Mapping[str, Any],
    step: int,
    checkpoint: str | None,
    bucket: str | None,
) -> dict[str, Any]:
    """The end of a completed run (rank 0): export next to the checkpoints, then to the bucket.

    Returns the fields of the run's ``export`` event. A failure is reported there and in the log,
    never raised: the run's training is done and its checkpoint is safe; ``python -m trainer
    export`` can make the export again.
    """
    started = time.monotonic()
    run = os.environ.get("FORJA_RUN") or out.name
    record: dict[str, Any] = {"folder": str(out / MODEL_DIR)}
    try:
        exported = export_state(state, config, out / MODEL_DIR, step=step, checkpoint=checkpoint, run=run)
        record.update(sha256=exported.info["sha256"], size=exported.info["size"])
        if bucket is not None:
            record["bucket"] = upload_model(exported.folder, bucket, run)
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, NonFiniteWeights):
            record["nonfinite_tensors"] = exc.tensors
        log.warning("model export failed (%s); `python -m trainer export %s` tries again",
                    record["error"], out)  # fmt: skip
    record["seconds"] = round(time.monotonic() - started, 3)
    if "error" not in record:
        log.info("model exported to %s%s", record["folder"], f" and {record['bucket']}" if bucket else "")
    return record
