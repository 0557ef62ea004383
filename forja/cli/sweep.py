"""`forja sweep CONFIG --space SPACE --trials N`, `forja sweep status [NAME]`, `forja sweep resume NAME`.

A group whose first word is either a sub-command (status, resume) or the config of a new sweep: the
group's click class sends `forja sweep CONFIG ...` to its `start` command, so the common case reads
as one verb. Each command is one `Forja` method (forja/sweep.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from typer.core import TyperGroup

from forja import format as fmt
from forja.cli.common import Help, console, emit_json, forja_for, global_options, group, out, verb
from forja.cli.train import FallbackZones, MaxDown, MaxDownUsd, MaxRecoveries
from forja.defaults import MAX_DOWN, MAX_RECOVERIES, SWEEP_POLL_S

if TYPE_CHECKING:
    from forja.sweep import SweepReport


class _ConfigFirst(TyperGroup):
    """`forja sweep CONFIG ...` is `forja sweep start CONFIG ...`; `status` and `resume` are themselves."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["start", *args]
        return super().parse_args(ctx, args)


commands = group("sweep", Help(
    "Hyperparameter sweeps with Optuna, each trial a forja run: start one, see them, resume one.",
    "forja sweep CONFIG --space SPACE --trials N starts a sweep (the same as forja sweep start ...).",
    examples=(
        "forja sweep trainer/configs/digits.yaml --space examples/sweep/space.yaml --trials 8",
        "forja sweep status",
        "forja sweep resume digits-sweep-1130-1244",
    ),
    see_also=("forja train", "forja runs"),
), cls=_ConfigFirst, no_args_is_help=True)


def _say(line: str) -> None:
    console.print(line, highlight=False, markup=False, soft_wrap=True)


def _value(values: list[float] | None) -> str:
    return ", ".join(f"{v:.5g}" for v in values) if values else "-"


def _table(report: SweepReport) -> Table:
    from forja.sweep import FLOOR_NOTE, cost_words

    objectives = ", ".join(f"{m} ({d})" for m, d in zip(report.metrics, report.directions, strict=True))
    notes = [report.stopped or "", f"plots in {Path(report.folder) / 'plots'}" if report.plots else "",
             FLOOR_NOTE if report.unsettled else ""]
    table = Table(title=f"sweep {report.name}: {objectives}; spent {fmt.money(report.spent_usd)}; "
                        f"driven {fmt.duration(report.driven_s)}",
                  caption="; ".join(n for n in notes if n))
    for column in ("trial", "run", "parameters", "value", "state", "cost", "time", "note"):
        table.add_column(column, justify="right" if column in ("trial", "value", "cost", "time") else "left")
    for row in report.trials:
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.params.items())
        table.add_row(str(row.number), row.run, params, _value(row.values), row.state,
                      cost_words(row),
                      fmt.duration(row.seconds) if row.seconds is not None else "-",
                      "best" if row.best else row.reason,
                      style="bold" if row.best else None)
    return table


def _show(ctx: typer.Context, reports: list[SweepReport], *, one: bool = True) -> None:
    """The sweeps as tables, or under --json one document: the sweep (`one`), else the list of them."""
    if global_options(ctx).json:
        emit_json(reports[0] if one else reports)
        return
    if not reports:
        out.print("no sweeps yet; start one: forja sweep CONFIG --space space.yaml --trials 8")
    for report in reports:
        out.print(_table(report))


PollOption = Annotated[float, typer.Option("--poll", min=1.0,
                                           help="Seconds between two looks at the trials.")]


START = Help(
    "Search hyperparameters with Optuna: --trials runs of CONFIG, each with values from --space.",
    """--space is a YAML file of the config's keys (dotted for nested ones) and their ranges, e.g.
    lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}, or type: int (with step), or type:
    categorical with choices; its objectives (or --metric and --direction) say what a trial is judged
    by: fields of the run's summary (default eval_loss, minimized). Each trial is an ordinary run named
    NAME-tNNN, with its own checkpoints, live metrics and cost.

    --parallel trials run at once: one per GPU, through the VM's run queue, else one per VM. A trial
    falling behind the others at the same step is pruned (stopped early), unless --no-prune. A
    preempted one resumes from its checkpoint as a forja train --managed run does (a VM that is gone
    is made again in a --fallback-zone). --max-usd and --max-hours stop new trials when reached:
    --max-usd adds up the trials' costs, each its run's cost as forja runs shows it, settled as the
    trial ends; a trial not ended yet counts at the trainer's own count so far, a floor of its cost.
    --local runs the trials on this machine's CPU instead.

    The study is kept in forja's home (sweeps/NAME/) and copied to the bucket after each trial, so
    forja sweep resume picks it up after a laptop slept or died. At the end: plots in
    sweeps/NAME/plots/ and the best trial marked. Ctrl-C leaves the trials already sent going.""",
    examples=(
        "forja sweep trainer/configs/digits.yaml --space examples/sweep/space.yaml --trials 8",
        "forja sweep trainer/configs/digits.yaml --space examples/sweep/space.yaml --trials 16 --parallel 2 "
        "--max-usd 2 --fallback-zone us-east1-b",
        "forja sweep start trainer/configs/digits.yaml --space examples/sweep/space.yaml --trials 4 --local",
    ),
    see_also=("forja sweep status", "forja sweep resume", "forja queue"),
)


@verb(START, "start", register=commands.command,
      on_interrupt="interrupted; the trials already sent go on; `forja sweep resume NAME` picks the sweep up")
def start(
    ctx: typer.Context,
    config: Annotated[Path, typer.Argument(help="The trainer config YAML every trial starts from.")],
    space: Annotated[Path, typer.Option("--space",
                                        help="The search space YAML (examples/sweep/space.yaml).")],
    trials: Annotated[int, typer.Option("--trials", help="How many trials in all.")],
    parallel: Annotated[int, typer.Option("--parallel", help="Trials at once, one per GPU.")] = 1,
    cluster: Annotated[str | None, typer.Option("--cluster", help="Spread the trials over this cluster's "
                                                "VMs, "
                                                "one trial per VM.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="The sweep's name (its trials are NAME-tNNN); "
                                             "default: the config's name and the time.")] = None,
    max_usd: Annotated[float | None, typer.Option("--max-usd", help="Send no new trial once the trials "
                                                  "cost this much in all (each its run's cost as forja runs "
                                                  "shows it; one not ended yet at the trainer's count so "
                                                  "far, a floor).")] = None,
    max_hours: Annotated[float | None, typer.Option("--max-hours", help="Send no new trial after this many "
                                                    "hours.")] = None,
    direction: Annotated[list[str] | None, typer.Option("--direction", help="minimize or maximize, once per "
                                                        "--metric (default: the space's objectives, else "
                                                        "minimize).")] = None,
    metric: Annotated[list[str] | None, typer.Option("--metric", help="A field of the run's summary to "
                                                     "optimise, repeatable (default eval_loss).")] = None,
    project: Annotated[Path | None, typer.Option("--project", help="Your project folder, sent with each "
                                                 "trial.")] = None,
    no_prune: Annotated[bool, typer.Option("--no-prune", help="Let every trial run to its end.")] = False,
    local: Annotated[bool, typer.Option("--local", help="Run the trials as trainer processes on this "
                                        "machine (a CPU-sized sweep), not on the VMs.")] = False,
    fallback_zone: FallbackZones = None,
    max_recoveries: MaxRecoveries = MAX_RECOVERIES,
    max_down: MaxDown = MAX_DOWN,
    max_down_usd: MaxDownUsd = None,
    poll: PollOption = SWEEP_POLL_S,
) -> None:
    from forja.managed import RecoveryBudget, seconds

    api = forja_for(ctx, cluster=cluster)
    budget = RecoveryBudget(max_recoveries, seconds(max_down, "--max-down"), max_down_usd)
    report = api.sweep(config, space=space, trials=trials, parallel=parallel, name=name,
                       metrics=metric or (), directions=direction or (), max_usd=max_usd,
                       max_hours=max_hours, project=project, prune=not no_prune, local=local,
                       fallback_zones=fallback_zone or (), budget=budget, poll_s=poll, say=_say)
    _show(ctx, [report])


STATUS = Help(
    "Show the sweeps kept here (newest first), or one: each trial's run, values, result, state, cost.",
    """The best trial is marked. A trial's cost is its run's, settled as it ended; ≥ marks one not
    settled yet, at the trainer's own count so far (a floor). It reads the studies on this machine
    only: no VM is asked.""",
    examples=("forja sweep status", "forja sweep status digits-sweep-1130-1244 --json"),
    see_also=("forja sweep resume", "forja runs"),
)


@verb(STATUS, "status", register=commands.command)
def status(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="One sweep (default: every sweep kept here).")] = None,
) -> None:
    _show(ctx, forja_for(ctx).sweep_status(name), one=name is not None)


RESUME = Help(
    "Go on with a sweep after this machine stopped driving it (a laptop that slept, died or was closed).",
    """Its trials still running are watched again, those that ended meanwhile are recorded, and new
    ones are sent until its trials or budget are used up. The study is read here, else from the bucket
    (gs://BUCKET/sweeps/NAME/), so another machine can take it over; --project says where the project
    is on this machine when it is not where the sweep started.""",
    examples=("forja sweep resume digits-sweep-1130-1244",
              "forja sweep resume digits-sweep-1130-1244 --project ~/my-project"),
    see_also=("forja sweep status", "forja sweep start"),
)


@verb(RESUME, "resume", register=commands.command,
      on_interrupt="interrupted; the trials already sent go on; `forja sweep resume NAME` picks the sweep up")
def resume(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The sweep to go on with (forja sweep status lists them).")],
    project: Annotated[Path | None, typer.Option("--project", help="Your project folder on this machine, "
                                                 "when not where the sweep started.")] = None,
    poll: PollOption = SWEEP_POLL_S,
) -> None:
    report: Any = forja_for(ctx).sweep_resume(name, project=project, poll_s=poll, say=_say)
    _show(ctx, [report])
