"""A sweep's search space: a YAML file of the trainer config's keys and Optuna's distributions.

    # space.yaml
    params:
      lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
      weight_decay: {type: float, low: 0.0, high: 0.1}
      lr_schedule.warmup_steps: {type: int, low: 0, high: 50, step: 10}
      optimizer: {type: categorical, choices: [AdamW, SGD]}
    objectives:                  # optional; default: eval_loss, minimize
      - {metric: eval_loss, direction: minimize}
      - {metric: cost_usd, direction: minimize}

Why checked here, on the controller, before the study exists: a key the config does not have, or a
range Optuna would refuse (low >= high, a log range that reaches 0), would otherwise surface as the
first trial's failure, minutes and a paid VM later, or worse as a silent default. The keys are checked
by the trainer's own loader (`trainer.config.load` with the value as a `--set` override: the same
code the VM runs), so a typo gets the trainer's own "did you mean" and the two can never disagree.

A trial's config is the sweep's config with the trial's values written in (`trial_config`): an
ordinary config file, sent like any other, so each trial is an ordinary forja run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from forja import errors

#: The distributions a space names, as `type:` writes them.
KINDS = ("float", "int", "categorical")
DIRECTIONS = ("minimize", "maximize")
#: What a trial is judged by unless told otherwise: the held-out loss of its final evaluation.
DEFAULT_METRIC = "eval_loss"
DEFAULT_DIRECTION = "minimize"
EXAMPLE = "e.g. lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}"


@dataclass(frozen=True)
class Param:
    """One key of the config and the values a trial may give it."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    def distribution(self) -> Any:
        """The Optuna distribution of this parameter (what `study.ask` samples from)."""
        import optuna.distributions as d

        if self.kind == "categorical":
            return d.CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return d.IntDistribution(int(self.low or 0), int(self.high or 0), log=self.log,
                                     step=int(self.step or 1))
        return d.FloatDistribution(float(self.low or 0.0), float(self.high or 0.0), log=self.log,
                                   step=None if self.step is None else float(self.step))

    def samples(self) -> list[Any]:
        """Values the config must accept: the range's ends, or every choice."""
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]


@dataclass(frozen=True)
class Objective:
    """What a trial is judged by: a field of the run's summary (trainer.summary), and which way is better."""

    metric: str
    direction: str


@dataclass(frozen=True)
class Space:
    params: tuple[Param, ...]
    objectives: tuple[Objective, ...]

    def distributions(self) -> dict[str, Any]:
        return {p.key: p.distribution() for p in self.params}


def summary_metrics() -> tuple[str, ...]:
    """The numbers a run's summary holds (trainer.summary.Summary), any of which a sweep can optimise."""
    import dataclasses

    from trainer.summary import Summary

    numeric = ("int", "float", "int | None", "float | None")
    return tuple(f.name for f in dataclasses.fields(Summary) if str(f.type) in numeric)


def load(path: str | Path, config: str | Path, *, metrics: Sequence[str] = (),
         directions: Sequence[str] = ()) -> Space:
    """Read and check a space file against `config`; `metrics`/`directions` (the command line's) win
    over the file's `objectives`. Every problem is a ConfigError naming the key and the fix."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise errors.ConfigError("--space", f"{path} is not a file; give a YAML search space ({EXAMPLE})")
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise errors.ConfigError("--space", f"{file} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("params"), Mapping) or not raw["params"]:
        raise errors.ConfigError("--space", f"{file} must hold `params:`, a mapping of config keys to "
                                 f"distributions ({EXAMPLE})")
    unknown = sorted(set(raw) - {"params", "objectives"})
    if unknown:
        raise errors.ConfigError(f"space {', '.join(unknown)}", "unknown key; a space holds `params:` and "
                                 "optionally `objectives:`")
    params = tuple(parse_param(str(key), spec) for key, spec in raw["params"].items())
    check_against_config(params, Path(config).expanduser())
    return Space(params, objectives(raw.get("objectives"), metrics, directions))


def parse_param(key: str, spec: Any) -> Param:
    """One `params:` entry as a Param, or a ConfigError naming `params.KEY` and what to write."""
    field = f"space params.{key}"
    if not isinstance(spec, Mapping):
        raise errors.ConfigError(field, f"must be a mapping with type and range ({EXAMPLE})")
    kind = spec.get("type")
    if kind not in KINDS:
        raise errors.ConfigError(field, f"type {kind!r} is not one of {', '.join(KINDS)} ({EXAMPLE})")
    allowed = {"type", "choices"} if kind == "categorical" else {"type", "low", "high", "log", "step"}
    extra = sorted(set(spec) - allowed)
    if extra:
        raise errors.ConfigError(field, f"{', '.join(extra)} is not for a {kind} (it takes "
                                 f"{', '.join(sorted(allowed - {'type'}))})")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise errors.ConfigError(field, "a categorical needs `choices:`, a list of values, e.g. "
                                     "choices: [AdamW, SGD]")
        odd = [c for c in choices if not isinstance(c, str | int | float | bool) and c is not None]
        if odd:
            raise errors.ConfigError(field, f"choice {odd[0]!r} is not a number, string, boolean or null")
        return Param(key, kind, choices=tuple(choices))
    low, high, log, step = spec.get("low"), spec.get("high"), spec.get("log", False), spec.get("step")
    for name, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise errors.ConfigError(field, f"{name} {value!r} must be a number (both low and high are "
                                     "needed)")
        if kind == "int" and not isinstance(value, int):
            raise errors.ConfigError(field, f"{name} {value!r} must be a whole number for an int (or use "
                                     "type: float)")
    if low >= high:
        raise errors.ConfigError(field, f"low {low} must be below high {high} (swap them, or fix the range)")
    if not isinstance(log, bool):
        raise errors.ConfigError(field, f"log {log!r} must be true or false")
    if log and low <= 0:
        raise errors.ConfigError(field, f"a log range must be above 0, and low is {low}: start it at a small "
                                 f"positive value (e.g. low: {high / 1000:g}) or drop log: true")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int | float) or step <= 0:
            raise errors.ConfigError(field, f"step {step!r} must be a number above 0")
        if log:
            raise errors.ConfigError(field, "step and log: true do not go together (Optuna refuses it); "
                                     "drop one")
    return Param(key, kind, low=low, high=high, log=log, step=step)


def check_against_config(params: Sequence[Param], config: Path) -> None:
    """Each key must be one the config takes, and each range's ends values it accepts: the trainer's
    own loader judges the config with them set (`--set KEY=VALUE`), as the VM will."""
    from trainer.config import ConfigError, load

    for param in params:
        for value in param.samples():
            try:
                load(config, [f"{param.key}={json.dumps(value)}"])  # JSON is YAML: the value as is
            except ConfigError as exc:
                problems = "; ".join(exc.problems)
                raise errors.ConfigError(
                    f"space params.{param.key}",
                    f"the config {config.name} refuses {param.key}={value!r}: {problems}",
                ) from None


def objectives(raw: Any, metrics: Sequence[str], directions: Sequence[str]) -> tuple[Objective, ...]:
    """The objectives: the command line's --metric/--direction, else the file's, else eval_loss minimized.
    One direction for several metrics applies to each; otherwise they pair up in order."""
    if metrics or directions:
        names = list(metrics) or [DEFAULT_METRIC]
        ways = list(directions) or [DEFAULT_DIRECTION]
        field = "--metric/--direction"
    elif raw is not None:
        if not isinstance(raw, list) or not raw or not all(isinstance(o, Mapping) for o in raw):
            raise errors.ConfigError("space objectives", "must be a list of {metric: NAME, direction: "
                                     "minimize|maximize}")
        names = [str(o.get("metric", DEFAULT_METRIC)) for o in raw]
        ways = [str(o.get("direction", DEFAULT_DIRECTION)) for o in raw]
        field = "space objectives"
    else:
        return (Objective(DEFAULT_METRIC, DEFAULT_DIRECTION),)
    if len(ways) == 1:
        ways *= len(names)
    if len(names) == 1 and len(ways) > 1:
        raise errors.ConfigError(field, f"{len(ways)} directions for one metric; give a --metric for each")
    if len(ways) != len(names):
        raise errors.ConfigError(field, f"{len(names)} metrics and {len(ways)} directions; give one "
                                 "direction for all, or one per metric")
    known = summary_metrics()
    for name, way in zip(names, ways, strict=True):
        if way not in DIRECTIONS:
            raise errors.ConfigError(field, f"direction {way!r} is not minimize or maximize")
        if name not in known:
            raise errors.ConfigError(field, f"metric {name!r} is not a number of the run's summary; one of "
                                     f"{', '.join(known)}")
    if len(set(names)) != len(names):
        raise errors.ConfigError(field, "a metric is named twice")
    return tuple(Objective(n, w) for n, w in zip(names, ways, strict=True))


def trial_config(config: Path, params: Mapping[str, Any], dest: Path) -> Path:
    """Write the config with the trial's values set (dotted keys into nested mappings) to `dest`.

    Written from the user's YAML, not the resolved config, so what the trainer defaults stays its
    default; checked by the trainer's own loader before it is written."""
    from trainer.config import ConfigError, load

    raw = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    for key, value in params.items():
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(f"# {dest.stem}: {config} with {dict(params)}\n" + yaml.safe_dump(raw, sort_keys=False))
    try:
        load(tmp)
    except ConfigError as exc:  # a combination of values the config refuses (e.g. warmup >= steps)
        tmp.unlink()
        raise errors.ConfigError("space", f"the trial's values {dict(params)} make {config.name} invalid: "
                                 f"{'; '.join(exc.problems)}") from None
    tmp.replace(dest)
    return dest
