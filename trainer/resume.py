"""What may change between a checkpoint and the run that resumes it, and what may not.

Why: a resumed run that silently picks up a new learning rate, seed or precision is no longer the
run its metrics describe, and a changed model used to end in a raw ``load_state_dict`` traceback
and exit 1, which systemd retried five times. Now every changed key is named: the ones that only
change *how* the run is carried out (more steps, other intervals, where files go, the
micro-batch at the same global batch) are allowed and said; the ones that change *what* is
trained are refused with exit 2 (``exit_codes.BAD_CONFIG``, never restarted), unless the user
sets ``allow_config_change: true`` on purpose. A key this list does not know (a newer trainer's
key, a new option) counts as unsafe: a refused harmless change costs a re-run with the flag, an
accepted harmful one costs the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Keys whose change leaves the trained model's definition and its optimisation alone.
SAFE_KEYS: dict[str, str] = {
    "steps": "the LR schedule follows the new total",
    "project_dir": "where relative file paths are looked up",
    "epochs": "the LR schedule follows the new total",
    "batch_size": "the micro-batch; the global batch is unchanged",
    "max_batch_size": "",
    "find_batch_margin": "",
    "min_steps_per_epoch": "",
    "num_workers": "",
    "pin_memory": "",
    "compile": "kernels may round differently",
    "compile_cache_dir": "",
    "channels_last": "kernels may round differently",
    "device": "kernels round differently: not bit-exact",
    "deterministic": "",
    "memory_fraction": "",
    "out_dir": "",
    "cache_dir": "",
    "checkpoint_every_s": "",
    "checkpoint_every_steps": "",
    "checkpoint_min_interval_s": "",
    "keep_checkpoints": "",
    "checkpoint_bucket": "",
    "checkpoint_upload_wait_s": "",
    "eval_every_steps": "",
    "eval_batch_size": "",
    "log_every_steps": "",
    "price_per_hour": "",
    "render_plots": "",
    "export_model": "",
    "ddp_timeout_s": "",
    "check_finite_every_steps": "",
    "skip_nonfinite": "",
    "divergence_loss_bound": "",
    "allow_fresh_start": "",
    "allow_config_change": "",
    "allow_legacy_checkpoints": "",
}

#: How a refused key can be changed anyway, when the generic hint is not enough.
HINTS: dict[str, str] = {
    "precision": "precision: auto chose differently on this machine; set precision explicitly",
    "effective_batch_size": "the global batch (batch_size x accumulation x processes) must stay the same",
}


@dataclass
class Changes:
    """Differences between a checkpoint's resolved config and the resuming run's, by key path."""

    allowed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key not in ("model_args", "data_args"):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def compare(saved: dict[str, Any], current: dict[str, Any], defaults: dict[str, Any]) -> Changes:
    """Sort every key that differs into allowed or refused; each entry reads ``key: old -> new``.

    ``defaults`` (key path -> default) stands in for keys a checkpoint predates: a key added to the
    trainer after the checkpoint was written counts as unchanged when the run leaves it at default.
    """
    old, new = _flatten(saved), _flatten(current)
    changes = Changes()
    for key in sorted(set(old) | set(new)):
        before = old.get(key, defaults.get(key))
        after = new.get(key, defaults.get(key))
        if _same(before, after):
            continue
        top = key.split(".")[0]
        line = f"{key}: {before!r} -> {after!r}"
        if top in SAFE_KEYS or key in SAFE_KEYS:
            note = SAFE_KEYS.get(key) or SAFE_KEYS.get(top, "")
            changes.allowed.append(f"{line} ({note})" if note else line)
        else:
            hint = HINTS.get(key)
            changes.refused.append(f"{line} ({hint})" if hint else line)
    return changes


def refusal(changes: Changes, checkpoint: str, out_dir: str) -> list[str]:
    """ConfigError lines for refused changes: one per key (``key: old -> new``), then the ways forward."""
    return [
        *[f"{line} (changed since {checkpoint}; it changes what is trained)" for line in changes.refused],
        f"to resume, restore those values; to start a new run, train into a new folder (not {out_dir}); "
        "to resume with them anyway, set allow_config_change: true (--set allow_config_change=true)",
    ]


def model_mismatch(error: Exception, checkpoint: str) -> list[str]:
    """ConfigError lines for a model whose parameters no longer match the checkpoint's."""
    lines = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
    details = "; ".join(lines[:6]) or str(error)
    return [
        f"model: its parameters differ from {checkpoint}'s (its code or model_args changed): {details}",
        "to resume, restore the model; to start a new run with it, train into a new folder",
    ]
