"""What a run will cost, said before it is sent: steps x seconds per step x the VM's rate, plus the disk.

Why measured first: a throughput from a model of the hardware is off by integer factors (data
loading, small batches, Python overhead); the run this config had last time is not. So the seconds
per step come from the newest finished run of the same config in the history (the same bytes: its
config hash), then from one of the same model, batch and precision (another length); its setup and
evaluation time come along, since a run pays for them too (forja.cost.run). With no such run the
time is the one `forja plan` predicts (a traced training step against the GPU's measured rates),
labelled "predicted" with how sure it is; the run it is about to send becomes the measurement for
the next one, and the next estimate of the same config shows how far off the prediction was.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from forja import format as fmt
from forja.cost.run import RunFiles, split, windows
from forja.history import History, RunRecord
from forja.runs import config_hash
from trainer.gpus import ran_on

#: Config keys that, equal, make another run's seconds per step a fair measure for this one.
SAME_SHAPE = ("model", "model_args", "data", "data_args", "batch_size", "effective_batch_size", "precision",
              "device")


@dataclasses.dataclass(frozen=True)
class Measured:
    """What an earlier run measured: seconds per step over its loop, its setup and its evaluation."""

    run_id: str
    how: str
    seconds_per_step: float
    setup_s: float
    evaluation_s: float
    steps: int
    #: What the run trained on: its GPU's name (summary.json's gpu_name, "NVIDIA L4"), or "cpu".
    device: str | None = None


@dataclasses.dataclass(frozen=True)
class Predicted:
    """What `forja plan` predicted for the config on the machine: seconds per optimizer step (how sure:
    a relative bound), the steps, and the micro-batch plan and peak memory behind it."""

    seconds_per_step: float
    sure: float
    how: str
    steps: int
    micro_batch: int
    accum_steps: int
    peak_mib: float
    #: The device the plan was for: the catalog's GPU name (nvidia-l4), or "cpu".
    gpu: str | None = None

    @classmethod
    def from_plan(cls, plan: Mapping[str, Any]) -> Predicted:
        step = plan["step_s"]
        return cls(float(step["value"]), float(step["sure"]), str(step["how"]), int(plan["steps"]),
                   int(plan["plan"]["micro_batch"]), int(plan["plan"]["accum_steps"]),
                   float(plan["peak_mib"]["value"]), (plan.get("gpu") or {}).get("name"))


@dataclasses.dataclass(frozen=True)
class RunEstimate:
    """The estimate `forja train` shows before sending: every figure None that cannot be known yet."""

    steps: int | None
    usd_per_hour: float
    rate_what: str
    disk_usd_per_month: float | None
    measured: Measured | None
    seconds: float | None
    vm_usd: float | None
    disk_usd: float | None
    total_usd: float | None
    #: `forja plan`'s prediction: the time when no earlier run measured it, else what it is checked against.
    predicted: Predicted | None = None

    @property
    def not_comparable(self) -> str | None:
        """Why the plan's step time cannot be checked against the measured one, or None when it can.

        A plan is for one device; a run measured on another (the sandbox's "L4" VM trains on its CPU)
        would report the devices' difference as the plan's error, so only like is compared with like.
        """
        p, m = self.predicted, self.measured
        if p is None or m is None:
            return None
        if not p.gpu:
            return "the kept plan does not say which device it was for"
        if not m.device:
            return f"{m.run_id} did not record which device it trained on"
        if not ran_on(p.gpu, m.device):
            on = "the CPU" if m.device.lower() == "cpu" else m.device
            return f"the plan was for {p.gpu} and {m.run_id} trained on {on}"
        return None

    @property
    def prediction_error(self) -> float | None:
        """How far the plan's seconds per step were from the earlier run's measured ones (+: too slow);
        None when there is nothing to compare or the two were for different devices (not_comparable)."""
        if self.predicted is None or self.measured is None or not self.measured.seconds_per_step:
            return None
        if self.not_comparable is not None:
            return None
        return self.predicted.seconds_per_step / self.measured.seconds_per_step - 1

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line for people: steps at the measured speed + setup + evaluation, at the rate, + the disk."""
        month = ""
        if self.disk_usd_per_month is not None:
            month = f", its disk {fmt.money(self.disk_usd_per_month)}/month"
        m, p = self.measured, self.predicted
        if m is None and p is not None and self.total_usd is not None and self.seconds is not None:
            speed = fmt.per_second(1 / p.seconds_per_step, "steps")
            return (f"cost estimate (predicted): no earlier run of this config, so forja plan predicted it: "
                    f"{fmt.count(self.steps)} steps at {speed} ({p.how}, ±{p.sure:.0%}; micro-batch "
                    f"{p.micro_batch} x {p.accum_steps}, peak {fmt.count(round(p.peak_mib))} MiB)"
                    f" = {fmt.duration(self.seconds)} at {fmt.hourly(self.usd_per_hour)} ({self.rate_what})"
                    f" = about {fmt.money(self.total_usd)}{month}, setup and evaluation not included. "
                    "This run is the measurement for the next.")
        if self.total_usd is None or self.seconds is None or m is None:
            why = ("no earlier run of this config (or of its model, batch and precision) to measure its speed"
                   if m is None else "its number of steps is not known before it runs")
            return (f"cost estimate: {why}; the VM costs {fmt.hourly(self.usd_per_hour)} ({self.rate_what})"
                    f"{month}. This run is the measurement for the next.")
        disk = "" if self.disk_usd is None else f" + disk {fmt.money(self.disk_usd)}"
        speed = fmt.per_second(1 / m.seconds_per_step, "steps")
        error, unlike = self.prediction_error, self.not_comparable
        checked = ""
        if p is not None and error is not None:
            checked = (f" (forja plan had predicted {fmt.per_second(1 / p.seconds_per_step, 'steps')}: "
                       f"{error:+.0%} off the measured step time)")
        elif p is not None and unlike is not None:
            checked = f" (forja plan's prediction not compared: {unlike})"
        return (f"cost estimate: {fmt.count(self.steps)} steps at {speed} (measured by {m.run_id}, {m.how})"
                f" + setup {fmt.duration(m.setup_s)} + evaluation {fmt.duration(m.evaluation_s)}"
                f" = {fmt.duration(self.seconds)} at {fmt.hourly(self.usd_per_hour)} ({self.rate_what})"
                f" = {fmt.money(self.vm_usd)}{disk}: about {fmt.money(self.total_usd)}{checked}")


def _config(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) or {}
    return data if isinstance(data, dict) else {}


def _measure(record: RunRecord, how: str) -> Measured | None:
    """Seconds per step, setup and evaluation of one finished run, from its fetched files."""
    files = RunFiles.read(record.artifact_dir)
    steps = int(files.metrics[-1].get("step") or 0) if files.metrics else 0
    loop, _ = windows(files.metrics)
    if steps <= 0 or not loop:
        return None
    parts = split(record, [], files, 0.0)
    device = files.summary.get("gpu_name") or files.summary.get("device") or files.config.get("device")
    return Measured(record.run_id, how, loop / steps, parts["setup"] or 0.0, parts["evaluation"] or 0.0,
                    steps, str(device) if device else None)


def measured_for(
    history: History, path: Path, config: Mapping[str, Any], limit: int = 200
) -> Measured | None:
    """The newest completed run of this config (same hash), else of the same shape (SAME_SHAPE)."""
    digest = config_hash(path)
    done = [r for r in history.list(limit=limit, status="completed") if r.artifact_dir]
    for record in done:
        if record.config_hash == digest:
            found = _measure(record, "the same config")
            if found is not None:
                return found
    # What this config states (an unset or "auto" key is whatever the earlier run resolved it to).
    shape = {k: config[k] for k in SAME_SHAPE if config.get(k) not in (None, "auto")}
    if "model" not in shape:
        return None
    for record in done:
        theirs = RunFiles.read(record.artifact_dir).config  # the resolved config the run saved
        if theirs and {k: theirs.get(k) for k in shape} == shape:
            found = _measure(record, "the same model, data, batch and precision")
            if found is not None:
                return found
    return None


def estimate(
    path: Path,
    history: History,
    usd_per_hour: float,
    rate_what: str,
    disk_usd_per_month: float | None,
    hours_per_month: float = 730,
    predict: Callable[[bool], Mapping[str, Any] | None] | None = None,
) -> RunEstimate:
    """The estimate of sending `path` (a trainer config) to a VM at `usd_per_hour` with its disks.

    Steps come from the config (`steps`), or from the measured run when the config counts epochs
    (from the plan when there is none). `predict(make)` gives `forja plan`'s plan of the config on
    the VM: a new one only when `make` (no earlier run measured it), else the kept one, if any.
    """
    config = _config(path)
    measured = measured_for(history, path, config)
    found = predict(measured is None) if predict is not None else None
    predicted = Predicted.from_plan(found) if found else None
    steps = config.get("steps") if not config.get("epochs") else None
    if steps is None and measured is not None and measured.how == "the same config":
        steps = measured.steps
    if steps is None and measured is None and predicted is not None:
        steps = predicted.steps
    seconds = vm_usd = disk_usd = total = None
    if measured is None and predicted is not None and isinstance(steps, int):
        seconds = steps * predicted.seconds_per_step
    if measured is not None and isinstance(steps, int):
        seconds = measured.setup_s + steps * measured.seconds_per_step + measured.evaluation_s
    if seconds is not None:
        vm_usd = usd_per_hour * seconds / 3600.0
        if disk_usd_per_month is not None:
            disk_usd = disk_usd_per_month * seconds / 3600.0 / hours_per_month
        total = vm_usd + (disk_usd or 0.0)
    return RunEstimate(steps if isinstance(steps, int) else None, usd_per_hour, rate_what, disk_usd_per_month,
                       measured, seconds, vm_usd, disk_usd, total, predicted)
