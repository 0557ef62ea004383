"""`forja plan`: the largest batch, the step time and the bill of a run, predicted on this machine's CPU.

Why the trainer does the tracing and forja the pricing: the trainer knows the model (it traces one
training step under fake tensors and adds the GPU's constants, trainer/plan.py), forja knows the
machine catalog and the prices. forja checks the machine and the GPU count against the catalog
before anything runs, then runs ``python -m trainer plan`` here (PyTorch from the ``trainer``
extra; no GPU, no VM) and prices its time at the machine's on-demand and Spot rates. The GPU
constants live in one table, ``trainer/gpus.yaml``, keyed by the catalog's GPU names: the trainer
reads it standalone, and forja reads it through the same reader (trainer/gpus.py, no torch) to
check a machine has constants before it starts.

With ``calibrate`` the newest fetched run of the same model on the same GPU model that recorded its
measured peak and step time (trainer/train.py writes them into summary.json) scales the plan:
measured over predicted at that run's own micro-batch, so the next plan starts from the truth.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from forja import defaults, errors, machines
from forja.init import DEFAULT_ZONE
from forja.session import Session
from trainer.gpus import gpu_table, ran_on

#: The machine a plan targets unless told: the project's VM (one L4).
DEFAULT_MACHINE = defaults.DEFAULT_MACHINE
#: How long the trainer's plan may take (the 124M GPT takes about 20 s on a 2-core machine).
PLAN_TIMEOUT_S = 600.0
#: Set to 0, the estimate before `forja train` makes no new plan (it still uses a kept one).
ESTIMATE_PLAN_ENV = "FORJA_ESTIMATE_PLAN"
#: The trainer's exit code for a config or argument it refuses (trainer/exit_codes.py BAD_CONFIG).
BAD_CONFIG = 2


@dataclasses.dataclass(frozen=True)
class PlanReport:
    """The trainer's plan (``trainer``: memory, batch, time, each with how it was found and how sure
    it is) and what the run costs on ``machine`` in ``zone``, on demand and Spot."""

    machine: str
    zone: str
    gpu: str
    gpus: int
    trainer: dict[str, Any]
    usd_per_hour: float
    spot_usd_per_hour: float
    rate_basis: str
    seconds: float
    usd: float
    spot_usd: float
    calibrated_from: str | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_machine(machine: str, gpus: int | None) -> tuple[Any, int]:
    """The catalog's entry for ``machine`` and the GPU count to plan for; ConfigError naming the fix."""
    known = machines.machine_types()
    found = known.get(machine)
    with_gpus = sorted(name for name, m in known.items() if m.gpu_count)
    if found is None:
        close = difflib.get_close_matches(machine, with_gpus, n=3, cutoff=0.6) or [DEFAULT_MACHINE]
        raise errors.ConfigError(
            "machine", f"'{machine}' is not in forja's machine catalog; use one with GPUs, e.g. "
            f"{', '.join(close)} (all {len(with_gpus)}: plugins/module_utils/forja_gcp_machines.py)")
    if not found.gpu_count:
        raise errors.ConfigError(
            "machine",
            f"{machine} comes with no GPU of its own; plan for a G2/A2/A3 type, e.g. {DEFAULT_MACHINE}")
    count = found.gpu_count if gpus is None else gpus
    if not 1 <= count <= found.gpu_count:
        same = sorted((m.gpu_count, name) for name, m in known.items()
                      if m.gpu_type == found.gpu_type and m.gpu_count >= max(count, 1))
        better = f", or a machine type with enough: {same[0][1]} ({same[0][0]})" if same and count > 1 else ""
        allowed = "1" if found.gpu_count == 1 else f"1 to {found.gpu_count}"
        raise errors.ConfigError(
            "gpus", f"{machine} has {found.gpu_count} x {found.gpu_type}, not {count}; "
            f"give --gpus {allowed}{better}")
    if found.gpu_type not in gpu_table():
        raise errors.ConfigError(
            "machine", f"no plan constants for {found.gpu_type} ({machine}); add it to trainer/gpus.yaml "
            "or plan for a machine whose GPU is there")
    return found, count


def measured_run(
    session: Session, config: dict[str, Any], gpu: str, limit: int = 200
) -> dict[str, Any] | None:
    """What the newest fetched run of the same model (model, model_args, precision) measured on the
    same GPU model: its micro-batch, accumulation, peak reserved memory and seconds per step."""
    from forja.cost.run import RunFiles

    for record in session.history.list(limit=limit):
        if not record.artifact_dir:
            continue
        files = RunFiles.read(record.artifact_dir)
        summary, theirs = files.summary, files.config
        if not (summary.get("peak_reserved_mib") and summary.get("step_s") and summary.get("micro_batch")):
            continue
        if theirs.get("model") != config.get("model") or (theirs.get("model_args") or {}) != (
                config.get("model_args") or {}):
            continue
        if config.get("precision") not in (None, "auto") and summary.get("precision") != config["precision"]:
            continue
        if not ran_on(gpu, summary.get("gpu_name")):
            continue
        return {"micro_batch": summary["micro_batch"], "accum_steps": summary.get("accum_steps") or 1,
                "peak_reserved_mib": summary["peak_reserved_mib"], "step_s": summary["step_s"],
                "source": f"run {record.run_id}"}
    return None


def run_trainer_plan(
    path: Path, gpu: str, gpus: int, vcpus: int, measured: dict[str, Any] | None
) -> dict[str, Any]:
    """``python -m trainer plan`` in a child process (the user's model code runs there, not in forja)."""
    argv = [sys.executable, "-m", "trainer", "plan", str(path), "--gpu", gpu, "--gpus", str(gpus),
            "--vcpus", str(vcpus), "--json"]
    if measured is not None:
        argv += ["--measured", json.dumps(measured)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PLAN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise errors.ForjaError(f"the trainer's plan took over {PLAN_TIMEOUT_S:.0f} s") from None
    said = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("[exit ")).strip()
    if done.returncode == BAD_CONFIG:
        raise errors.ConfigError("config", said.removeprefix("error: ").strip() or "refused by the trainer")
    if done.returncode != 0:
        raise errors.ForjaError(f"the trainer's plan failed (exit {done.returncode}): {said[-2000:]}")
    return dict(json.loads(done.stdout))


def plan_file(path: Path, machine: str, gpus: int) -> Path:
    """Where the newest plan of this config (its bytes) on this machine is kept: the estimate before
    `forja train` reads it, and after the run compares it with what the run measured."""
    from forja.paths import forja_home
    from forja.runs import config_hash

    return forja_home() / "plans" / f"{config_hash(path)}-{machine}-{gpus}.json"


def prediction(session: Session, path: Path, machine: str, *, make: bool = True) -> dict[str, Any] | None:
    """The trainer's plan of ``path`` on ``machine`` (all its GPUs): the kept one, else (``make``) a new
    one; None where no plan can be made (no torch here, a machine without GPU constants, a config the
    trainer refuses: the estimate then says what it said before). ``FORJA_ESTIMATE_PLAN=0`` makes no
    new one (a plan costs seconds of CPU before each `forja train` of a config never run)."""
    found = machines.machine_type(machine)
    if found is None or not found.gpu_count:
        return None
    kept = plan_file(path, machine, found.gpu_count)
    try:
        return dict(json.loads(kept.read_text()))
    except (OSError, ValueError):
        pass
    if not make or os.environ.get(ESTIMATE_PLAN_ENV, "1") == "0":
        return None
    try:
        return plan(session, path, machine=machine).trainer
    except errors.ForjaError:
        return None


def plan(
    session: Session,
    config: str | Path,
    *,
    machine: str = DEFAULT_MACHINE,
    gpus: int | None = None,
    zone: str = DEFAULT_ZONE,
    calibrate: bool = False,
    prices: str | Path | None = None,
) -> PlanReport:
    """Predict, on this machine's CPU and before renting anything, what training `config` needs on
    `machine` (default g2-standard-8, one L4): the peak GPU memory per micro-batch, the largest
    micro-batch that fits and the accumulation that keeps the global batch, the step time and
    throughput, and the run's time and cost there, on demand and Spot, in `zone`. One training step
    is traced under fake tensors (no memory is allocated) with the run's precision and optimizer,
    then the GPU's constants (trainer/gpus.yaml: usable memory, CUDA context, measured matmul rate,
    each with its source) are added; every figure says whether it was traced, measured or
    modelled, and how sure it is. `gpus` defaults to all the machine has. `calibrate` scales the
    plan by what the newest fetched run of the same model on the same GPU measured. Needs PyTorch
    here: forja's `trainer` extra.

    Example: forja plan trainer/configs/gpt.yaml --machine g2-standard-8
    """
    from forja.cost.prices import PriceError, load_prices
    from forja.cost.spend import rate_of

    path = Path(config).expanduser()
    if not path.is_file():
        raise errors.ConfigError("config", f"{config} is not a file; give a trainer config YAML")
    found, count = check_machine(machine, gpus)
    try:
        table = load_prices(Path(prices) if prices else None)
        on_demand = rate_of(machine, zone, table, spot=False)
        spot = rate_of(machine, zone, table, spot=True)
    except (PriceError, ValueError) as exc:
        raise errors.ConfigError("zone/prices", str(exc)) from exc
    if importlib.util.find_spec("torch") is None:
        raise errors.ConfigError(
            "torch", "forja plan traces the model with PyTorch on this machine, and it is not installed: "
            "pip install 'forja[trainer]' (CPU wheels are enough)")
    loaded = yaml.safe_load(path.read_text()) or {}
    stated = loaded if isinstance(loaded, dict) else {}
    measured = measured_run(session, stated, found.gpu_type) if calibrate else None
    report = run_trainer_plan(path, found.gpu_type, count, found.vcpus, measured)
    kept = plan_file(path, machine, count)
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(report))
    except OSError:  # a read-only home: the plan is still shown, only not kept for the estimate
        pass
    seconds = float(report["train_s"]["value"])
    return PlanReport(
        machine=machine, zone=zone, gpu=found.gpu_type, gpus=count, trainer=report,
        usd_per_hour=on_demand.usd_per_hour, spot_usd_per_hour=spot.usd_per_hour,
        rate_basis=f"{on_demand.what}; {spot.what} ({on_demand.basis})", seconds=seconds,
        usd=on_demand.usd_per_hour * seconds / 3600.0, spot_usd=spot.usd_per_hour * seconds / 3600.0,
        calibrated_from=measured["source"] if measured else None,
    )
