"""The run configuration: one YAML file, validated before anything is built.

Why pydantic with ``extra="forbid"``: a typo in a key (``lerning_rate``) must stop the run with a
message naming the key, not silently train with a default for hours on paid hardware. Every error
is turned into a line that names the key path and says how to fix it (:class:`ConfigError`).
"""

from __future__ import annotations

import difflib
import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

Precision = Literal["auto", "fp32", "bf16", "fp16"]
Device = Literal["auto", "cpu", "cuda"]
Auto = Literal["auto"]


class ConfigError(ValueError):
    """A configuration the trainer refuses, with one line per problem (key path, what, fix)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid trainer config:\n" + "\n".join(f"  - {p}" for p in problems))


class LrSchedule(BaseModel):
    """Warm-up then (optionally) cosine decay; the LR is a pure function of the step."""

    model_config = ConfigDict(extra="forbid")

    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up from 0 to lr.")
    min_lr: float = Field(0.0, ge=0.0, description="LR reached at the last step when cosine is on.")
    cosine: bool = Field(True, description="Cosine decay from lr to min_lr after warm-up (else constant).")
    scheduler: str | None = Field(
        None,
        description="A torch.optim.lr_scheduler name (OneCycleLR) or path; null: the built-in schedule.",
    )
    scheduler_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the scheduler (stepped per optimizer step)."
    )


class TrainConfig(BaseModel):
    """Every knob of a run, each with its default and unit (the README's config reference)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    # What to train (each a 'package.module:name' import path or a './file.py:name' file path)
    model: str = Field("trainer.demo:digits_cnn", description="Model factory or class (import or file path).")
    model_args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the model.")
    data: str = Field("trainer.demo:digits", description="Data factory returning (train, eval) datasets.")
    data_args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the data.")
    loss: str = Field(
        "auto",
        description="auto: the model's own loss if it returns one, else cross-entropy; or loss(output, y).",
    )
    loss_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the loss (a class is built with them)."
    )
    collate: str | None = Field(
        None, description="collate_fn(samples) -> batch (import or file path); null: torch's default_collate."
    )
    collate_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for collate (a class is built with them)."
    )
    label_key: str | None = Field(
        None, description="Target key in dict batches; null: 'labels', else 'label'."
    )
    project_dir: str | None = Field(
        None, description="Folder for relative file paths; null: $FORJA_PROJECT_DIR, cwd, PYTHONPATH."
    )

    # How long
    steps: int = Field(1000, gt=0, description="Optimizer steps to train for.")
    epochs: int | None = Field(None, gt=0, description="Train for this many epochs instead of steps.")

    # Batch
    batch_size: int | Auto = Field(32, description="Micro-batch per process; 'auto' runs find-batch.")
    max_batch_size: int = Field(4096, gt=0, description="Upper bound for find-batch (CPU has no OOM).")
    find_batch_margin: float = Field(
        0.1, ge=0.0, lt=1.0, description="find-batch uses this fraction less than the largest batch that fit."
    )
    min_steps_per_epoch: int = Field(
        20, gt=0, description="batch_size auto: never fewer optimizer steps per epoch than this."
    )
    effective_batch_size: int | None = Field(
        None, gt=0, description="Global batch per optimizer step (micro x accumulation x processes)."
    )

    # Optimizer
    optimizer: str = Field("AdamW", description="A torch.optim name (SGD, Adam...) or an import/file path.")
    optimizer_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the optimizer (momentum, eps...)."
    )
    lr: float = Field(1e-3, gt=0.0, description="Peak learning rate, passed to the optimizer as lr.")
    lr_schedule: LrSchedule = Field(default_factory=LrSchedule, description="Warm-up and decay.")
    weight_decay: float | None = Field(
        None, ge=0.0, description="Passed to the optimizer when set; null: its default (AdamW: 0.01)."
    )
    betas: tuple[float, float] | None = Field(
        None, description="Passed to the optimizer when set; null: its default (AdamW: 0.9, 0.999)."
    )
    grad_clip: float = Field(1.0, ge=0.0, description="Max global grad norm; 0 turns clipping off.")

    # Divergence (trainer.divergence): a run whose loss turns NaN, infinite or too large stops as
    # "diverged" (exit 7, not restarted) instead of burning GPU hours and exporting a broken model.
    check_finite_every_steps: int = Field(
        1, gt=0, description="Judge the loss every N steps (a host sync each); 1 stops at the first bad step."
    )
    skip_nonfinite: int = Field(
        0, ge=0, description="NaN/Inf-loss steps skipped (no update) before the run counts as diverged."
    )
    divergence_loss_bound: float | None = Field(
        None, gt=0.0, description="A finite loss above this also counts as diverged; null: only NaN/Inf."
    )

    # Speed
    precision: Precision = Field(
        "auto", description="auto: bf16 where fast, else fp16+GradScaler, else fp32."
    )
    compile: bool = Field(False, description="torch.compile the model (slow first step, cached on disk).")
    compile_cache_dir: str | None = Field(
        None, description="Inductor cache; default <out_dir>/compile-cache."
    )
    channels_last: bool | Auto = Field("auto", description="auto: on for conv models on CUDA with AMP.")
    num_workers: int | Auto = Field("auto", description="DataLoader workers; auto: 0 on CPU, up to 4 on GPU.")
    pin_memory: bool | Auto = Field("auto", description="Pinned host memory; auto: on with CUDA.")
    device: Device = Field("auto", description="auto: cuda when available, else cpu.")
    deterministic: bool = Field(False, description="Deterministic kernels (bit-exact resume on GPU).")
    memory_fraction: float | None = Field(
        None, gt=0.0, le=1.0, description="Cap this process's share of GPU memory (find-batch tests)."
    )

    # Where and how often
    seed: int = Field(1337, description="Seeds Python, NumPy, torch and the data order.")
    out_dir: str = Field("runs/run", description="Run folder: config, metrics, checkpoints, plots.")
    cache_dir: str = Field("~/.cache/forja/trainer", description="find-batch results cache.")
    checkpoint_every_s: float = Field(300.0, ge=0.0, description="Checkpoint timer in seconds; 0 is off.")
    checkpoint_every_steps: int = Field(0, ge=0, description="Checkpoint every N steps; 0 is off.")
    checkpoint_min_interval_s: float = Field(
        30.0, ge=0.0, description="Skip an epoch-end checkpoint this soon after the previous one."
    )
    keep_checkpoints: int = Field(3, ge=1, description="Newest checkpoints kept on disk.")
    checkpoint_bucket: str | None = Field(
        None,
        description="Mirror checkpoints to gs://BUCKET/PREFIX/<run>/; null: $FORJA_CHECKPOINT_BUCKET.",
    )
    checkpoint_upload_wait_s: float = Field(
        120.0, ge=0.0, description="At the end of a run, wait at most this long for the last upload."
    )
    allow_fresh_start: bool = Field(
        False, description="Start again from step 0 when every checkpoint of the run fails verification."
    )
    allow_legacy_checkpoints: bool = Field(
        False, description="Load checkpoints without a checksum footer (older trainers) unverified."
    )
    allow_config_change: bool = Field(
        False, description="Resume even when the model, data or optimisation changed since the checkpoint."
    )
    eval_every_steps: int = Field(0, ge=0, description="Evaluate every N steps; 0: only at the end.")
    eval_batch_size: int | None = Field(None, gt=0, description="Eval micro-batch; default batch_size.")
    log_every_steps: int = Field(10, gt=0, description="Metrics line and progress every N steps.")
    price_per_hour: float = Field(0.0, ge=0.0, description="USD per hour of this machine, for cost.")
    render_plots: bool = Field(True, description="Render plots/*.png when train ends (report does it too).")
    export_model: bool = Field(
        True, description="A completed run writes model/ (safetensors + model.json), also to the bucket."
    )
    ddp_timeout_s: float = Field(600.0, gt=0.0, description="Process-group timeout: a lost peer fails.")

    @field_validator("model", "data", "loss", "collate")
    @classmethod
    def _callable_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None or (info.field_name == "loss" and value == "auto"):
            return value
        module, sep, attr = value.rpartition(":")
        if not sep or not module or not attr:
            raise ValueError(f"must be 'package.module:callable' or './file.py:callable' (got {value!r})")
        return value

    @field_validator("checkpoint_bucket")
    @classmethod
    def _bucket_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        from trainer.gcs import parse_bucket_url  # torch-free: forja checks configs on the controller

        parse_bucket_url(value)
        return value

    @model_validator(mode="after")
    def _combinations(self) -> TrainConfig:
        problems: list[str] = []
        if self.epochs is not None and "steps" in self.model_fields_set:
            problems.append("steps/epochs: set one of them, not both (remove steps or epochs)")
        if isinstance(self.batch_size, int):
            if self.batch_size < 1:
                problems.append(f"batch_size: must be >= 1 or 'auto' (got {self.batch_size})")
            elif self.effective_batch_size is not None and self.effective_batch_size % self.batch_size:
                problems.append(
                    f"effective_batch_size: {self.effective_batch_size} is not a multiple of batch_size "
                    f"{self.batch_size} (use a multiple, or batch_size: auto to pick a divisor)"
                )
        if self.epochs is None and self.lr_schedule.warmup_steps >= self.steps:
            problems.append(
                f"lr_schedule.warmup_steps: {self.lr_schedule.warmup_steps} must be < steps {self.steps} "
                "(lower warmup_steps or raise steps)"
            )
        sched = self.lr_schedule
        if sched.scheduler is not None and (sched.warmup_steps or sched.min_lr):
            problems.append(
                f"lr_schedule.scheduler: {sched.scheduler} replaces the built-in warm-up/cosine schedule "
                "(remove lr_schedule.warmup_steps and lr_schedule.min_lr, or the scheduler)"
            )
        for args_key, owner, value in (
            ("loss_args", "loss", None if self.loss == "auto" else self.loss),
            ("collate_args", "collate", self.collate),
            ("lr_schedule.scheduler_args", "lr_schedule.scheduler", sched.scheduler),
        ):
            args = sched.scheduler_args if args_key.startswith("lr_schedule") else getattr(self, args_key)
            if args and value is None:
                problems.append(f"{args_key}: given without {owner} (set {owner}, or remove {args_key})")
        if self.lr_schedule.min_lr > self.lr:
            problems.append(
                f"lr_schedule.min_lr: {self.lr_schedule.min_lr} is above lr {self.lr} (use min_lr <= lr)"
            )
        if self.device == "cpu" and self.precision == "fp16":
            problems.append("precision: fp16 needs device cuda (use bf16 or fp32 on cpu)")
        if self.device == "cpu" and self.memory_fraction is not None:
            problems.append("memory_fraction: only applies to device cuda (remove it for cpu)")
        if isinstance(self.num_workers, int) and self.num_workers < 0:
            problems.append(f"num_workers: must be >= 0 or 'auto' (got {self.num_workers})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML/JSON-able dict (tuples as lists), the form saved in runs and checkpoints."""
        return self.model_dump(mode="json")


def field_docs() -> dict[str, tuple[Any, str]]:
    """Key path -> (default, description) for every config key (the README table is checked against it)."""
    docs: dict[str, tuple[Any, str]] = {}
    for name, info in TrainConfig.model_fields.items():
        if name == "lr_schedule":
            for sub, sub_info in LrSchedule.model_fields.items():
                default = sub_info.get_default(call_default_factory=True)
                docs[f"lr_schedule.{sub}"] = (default, sub_info.description or "")
            continue
        default = info.get_default(call_default_factory=True)
        docs[name] = (default, info.description or "")
    return docs


# Names other trainers use for our keys: a typo of any of them points at ours.
ALIASES = {
    "learning_rate": "lr",
    "max_steps": "steps",
    "num_steps": "steps",
    "num_epochs": "epochs",
    "micro_batch_size": "batch_size",
    "global_batch_size": "effective_batch_size",
    "gradient_clipping": "grad_clip",
    "max_grad_norm": "grad_clip",
    "lr_scheduler": "lr_schedule",
    "dtype": "precision",
    "mixed_precision": "precision",
    "output_dir": "out_dir",
    "warmup": "warmup_steps",
    "save_every_steps": "checkpoint_every_steps",
    "save_total_limit": "keep_checkpoints",
    "optim": "optimizer",
    "optimizer_kwargs": "optimizer_args",
    "collate_fn": "collate",
    "data_collator": "collate",
    "label_names": "label_key",
}


def _suggest(name: str, known: list[str]) -> str | None:
    """The key the user probably meant: a close match among our keys or other trainers' names for them."""
    candidates = known + [alias for alias, key in ALIASES.items() if key in known]
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return ALIASES.get(close[0], close[0]) if close else None


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    if loc and loc[0] == "lr_schedule":
        return list(LrSchedule.model_fields)
    return list(TrainConfig.model_fields)


_TYPE_WORDS = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "dict_type": "a mapping",
    "tuple_type": "a list of two numbers",
}


def _describe(err: dict[str, Any]) -> str:
    """One human line for one pydantic error: key path, what is wrong, how to fix it."""
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p in {"int", "literal['auto']"}))
    key = ".".join(str(p) for p in loc) or "(config)"
    kind = err["type"]
    got = err.get("input")
    if kind == "extra_forbidden":
        name = str(loc[-1])
        close = _suggest(name, _known_keys(loc))
        hint = f"did you mean '{close}'?" if close else "remove it; trainer/README.md lists the keys"
        return f"{key}: unknown key ({hint})"
    if kind == "value_error":
        msg = str(err["msg"]).removeprefix("Value error, ")
        return msg if not loc else f"{key}: {msg}"
    if kind == "literal_error":
        return f"{key}: {err['msg'].lower()} (got {got!r})"
    if kind in _TYPE_WORDS:
        return f"{key}: must be {_TYPE_WORDS[kind]} (got {got!r})"
    if kind == "missing" and loc and isinstance(loc[-1], int):  # a list shorter than its fixed length
        parent = ".".join(str(p) for p in loc[:-1])
        return f"{parent}: too few items (item {loc[-1] + 1} is missing; betas takes two, e.g. [0.9, 0.999])"
    if kind == "missing":
        return f"{key}: required key is missing (add it)"
    return f"{key}: {err['msg']} (got {got!r})"


def validate(raw: dict[str, Any]) -> TrainConfig:
    """Validate a raw mapping; raise :class:`ConfigError` listing every problem with its key."""
    if not isinstance(raw, dict):
        raise ConfigError([f"(config): the file must hold a mapping of keys, got {type(raw).__name__}"])
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as exc:
        seen: list[str] = []
        for err in exc.errors():
            line = _describe(dict(err))
            for part in line.split("; ") if err["type"] == "value_error" and not err["loc"] else [line]:
                if part not in seen:
                    seen.append(part)
        raise ConfigError(seen) from None


def builtin_config_path(name: str) -> Path | None:
    """The packaged config called ``name`` (``digits`` -> trainer/configs/digits.yaml), if any."""
    candidate = resources.files("trainer") / "configs" / f"{name}.yaml"
    return Path(str(candidate)) if candidate.is_file() else None


def parse_override(item: str) -> tuple[list[str], Any]:
    """``lr_schedule.warmup_steps=10`` -> (['lr_schedule', 'warmup_steps'], 10); values parse as YAML."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError([f"--set {item!r}: expected key=value (for example --set steps=200)"])
    return key.strip().split("."), yaml.safe_load(value) if value != "" else ""


def _read_yaml(file: Path) -> Any:
    """The file's YAML, or a ConfigError that names the file, the line and the column itself (PyYAML's
    own message says "<unicode string>" for text it was handed)."""
    data = file.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError([f"(config): {file} is not UTF-8 text: byte {data[exc.start]:#04x} at line {line}, "
                           f"column {column}; save it as UTF-8"]) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"(config): {file} is not valid YAML{where}: {problem}"]) from None


def load(path: str | os.PathLike[str], overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML config (a path, or a built-in name such as ``digits``), apply --set overrides."""
    file = Path(path)
    if not file.is_file():
        builtin = builtin_config_path(str(path))
        if builtin is None:
            raise ConfigError(
                [f"--config: no such file {str(path)!r} (give a YAML path or 'digits'/'mnist')"]
            )
        file = builtin
    raw = _read_yaml(file)
    if raw is None:
        raise ConfigError([f"(config): {file} is empty; give the keys to change (model, data, steps...), "
                           "or the built-in demo by name ('digits')"])
    if not isinstance(raw, dict):
        raise ConfigError([f"(config): {file} must hold a mapping of keys, got {type(raw).__name__}"])
    for item in overrides or []:
        keys, value = parse_override(item)
        node = raw
        for part in keys[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError([f"--set {item!r}: {part} is not a mapping"])
        node[keys[-1]] = value
    return validate(raw)


def dump(config: TrainConfig) -> str:
    """YAML text of a (resolved) config, keys in schema order."""
    data = config.to_dict()
    if config.epochs is not None:
        data.pop("steps")  # derived from epochs; saving both would make the file invalid
    return yaml.safe_dump(data, sort_keys=False)
