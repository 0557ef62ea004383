"""`forja plan CONFIG`: memory, batch, step time and cost of a run, predicted on this machine's CPU.

For people: the trainer's table (trainer/plan_format.py, each figure with how it was found and how
sure it is), then the run's time and cost on the machine. `forja --json plan` prints every figure at
full precision, the trainer's plan whole under `trainer`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from forja import format as fmt
from forja.cli.common import Help, emit_json, forja_for, global_options, out, verb
from forja.defaults import DEFAULT_MACHINE
from forja.init import DEFAULT_ZONE
from trainer.plan_format import format_plan

if TYPE_CHECKING:
    from forja.plan import PlanReport

#: No name: `forja plan` is a root verb, registered in forja/cli/__init__.py.
commands = typer.Typer()


def describe(found: PlanReport) -> str:
    """The run's time and cost on the machine, on demand and Spot, after the trainer's table."""
    r = found.trainer
    sure = f"{r['train_s']['how']}, ±{r['train_s']['sure']:.0%}"
    calibrated = f"; calibrated by {found.calibrated_from}" if found.calibrated_from else ""
    return (
        f"on {found.machine} in {found.zone}: {fmt.duration(found.seconds)} of training "
        f"({sure}{calibrated}), "
        f"{fmt.money(found.usd)} on demand at {fmt.hourly(found.usd_per_hour)}, "
        f"{fmt.money(found.spot_usd)} on Spot at {fmt.hourly(found.spot_usd_per_hour)} "
        "(the loop only: setup and evaluation come on top)"
    )


PLAN = Help(
    "Predict a run's GPU memory, batch size, step time and cost on a machine, before renting it.",
    """Runs on this machine's CPU, in seconds: one training step of CONFIG is traced with fake tensors
    (no memory is used) at the run's precision and optimizer, then the GPU's own figures (usable
    memory, CUDA overhead, measured matmul speed) are added. It prints the peak GPU memory per
    micro-batch, the largest micro-batch that fits and the gradient accumulation that keeps the
    global batch, the step time and throughput, and the run's time and cost on --machine (default one
    L4), on demand and on Spot. Every figure says whether it was traced, measured or modelled, and how
    sure it is. --calibrate scales it by what the newest fetched run of the same model on the same GPU
    measured. Needs PyTorch on this machine (forja's trainer extra).""",
    examples=(
        "forja plan trainer/configs/gpt.yaml",
        "forja plan trainer/configs/gpt.yaml --machine g2-standard-24 --gpus 2",
        "forja plan trainer/configs/digits.yaml --calibrate --json",
    ),
    see_also=("forja train", "forja cost rate", "forja zones"),
)


@verb(PLAN, "plan", register=commands.command)
def plan(
    ctx: typer.Context,
    config: Annotated[Path, typer.Argument(help="The trainer config YAML, e.g. trainer/configs/gpt.yaml.")],
    machine: Annotated[
        str, typer.Option("--machine", help="Machine type from forja's catalog.")
    ] = DEFAULT_MACHINE,
    gpus: Annotated[
        int | None, typer.Option("--gpus", help="GPUs to plan for (default: all the machine has).")
    ] = None,
    zone: Annotated[str, typer.Option("--zone", help="Zone whose prices to use.")] = DEFAULT_ZONE,
    calibrate: Annotated[
        bool, typer.Option("--calibrate", help="Scale by what the newest fetched run of this model measured.")
    ] = False,
    prices: Annotated[
        Path | None,
        typer.Option("--prices", help="YAML merged over the built-in price table (or $FORJA_PRICES)."),
    ] = None,
) -> None:
    found = forja_for(ctx).plan(config, machine=machine, gpus=gpus, zone=zone, calibrate=calibrate,
                                prices=prices)
    if global_options(ctx).json:
        emit_json(found.as_dict())
        return
    out.print(format_plan(found.trainer), markup=False, highlight=False)
    out.print(describe(found), markup=False, highlight=False)
