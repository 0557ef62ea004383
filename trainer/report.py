"""``report``: PNG plots and a summary of a run folder, readable without the trainer running.

Why from files: the run may have died (preempted, killed); everything needed is in metrics.jsonl
and events.jsonl, so a person can render the pictures of any run, finished or not, on any machine.
Preemptions are drawn as vertical lines so lost work is visible on every plot.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer import finite, metrics
from trainer.metrics import numbered_jsonl
from trainer.run_folder import (
    EVENTS,
    METRICS,
    PLOT_COST,
    PLOT_FILES,
    PLOT_LOSS,
    PLOT_THROUGHPUT,
    PLOT_UTILISATION,
    PLOTS_DIR,
    SUMMARY,
    write_atomic,
)
from trainer.summary import Summary

#: The metrics fields report draws or adds up: each a number, or null (not measured, or not finite).
DRAWN = ("loss", "lr", "samples_per_s", "step_time_s", "data_wait_s", "gpu_util", "cpu_util", "cost_usd",
         "wall_s")  # fmt: skip


class RunFolderError(ValueError):
    """--run is not a run folder report can read: names the file (and line) and what is wrong there.

    Why its own error: a path that is a file, or a metrics line written by hand or by another tool,
    is the user's to fix (exit 2, one line), not a crash with a traceback (exit 1, "restart").
    """


def _number(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """trainer.metrics.numbered_jsonl, with a file that is not UTF-8 named as such."""
    try:
        yield from numbered_jsonl(path)
    except UnicodeDecodeError as exc:
        raise RunFolderError(f"{path} is not UTF-8 text (byte {exc.start}): not a trainer's log") from None


def _metrics(path: Path) -> list[dict[str, Any]]:
    """The metrics lines, each checked for what report reads: a whole-number step, numbers or nulls."""
    rows = []
    for number, row in _records(path):
        step = row.get("step")
        if "step" not in row:
            raise RunFolderError(f"{path}, line {number}: no 'step' (every metrics line has one)")
        if not isinstance(step, int) or isinstance(step, bool):
            raise RunFolderError(f"{path}, line {number}: 'step' must be a whole number, got {step!r}")
        bad = next((key for key in DRAWN if not _number(row.get(key))), None)
        if bad is not None:
            raise RunFolderError(f"{path}, line {number}: {bad!r} must be a number or null, got {row[bad]!r}")
        rows.append(row)
    return rows


def _events(path: Path) -> tuple[list[int], list[dict[str, Any]]]:
    """The resumes' steps and the evaluations (with an eval_loss) of events.jsonl, checked."""
    resumes, evals = [], []
    for number, event in _records(path):
        kind = event.get("event")
        if kind == "resume":
            step = event.get("step", 0)
            if not isinstance(step, int) or isinstance(step, bool):
                raise RunFolderError(f"{path}, line {number}: a resume's 'step' must be a whole number, "
                                     f"got {step!r}")
            resumes.append(step)
        elif kind in ("eval", "finish") and event.get("eval_loss") is not None:
            if not _number(event["eval_loss"]):
                raise RunFolderError(f"{path}, line {number}: 'eval_loss' must be a number or null, "
                                     f"got {event['eval_loss']!r}")
            evals.append(event)
    return resumes, evals


def _written_summary(path: Path) -> dict[str, Any]:
    """summary.json as the run wrote it ({} when there is none yet)."""
    if not path.is_file():
        return {}
    try:
        written = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # not JSON, or not UTF-8
        raise RunFolderError(f"{path} is not a JSON summary ({exc})") from None
    if not isinstance(written, dict):
        raise RunFolderError(f"{path} must hold a JSON object, got {type(written).__name__}")
    return written


def write_summary(run: Path, summary: dict[str, Any]) -> Path:
    """summary.json, replaced atomically (a reader never sees half a file)."""
    return write_atomic(run / SUMMARY, finite.dumps(summary, indent=2, sort_keys=True) + "\n")


def render(run: str | os.PathLike[str]) -> dict[str, Any]:
    """Draw plots/*.png from metrics.jsonl, refresh summary.json's derived numbers, return the summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(run)
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(f"{folder} is a file, not a run folder (the trainer's out_dir)")
    rows = _metrics(folder / METRICS)
    if not rows:
        raise FileNotFoundError(f"{folder / METRICS} has no metrics: is --run a trainer run folder?")
    resumes, evals = _events(folder / EVENTS)
    written = _written_summary(folder / SUMMARY)
    plots = folder / PLOTS_DIR
    plots.mkdir(exist_ok=True)
    steps = [r["step"] for r in rows]

    def figure(
        name: str,
        title: str,
        series: list[tuple[str, list[Any]]],
        ylabel: str,
        extra: list[tuple[str, list[int], list[float]]] = (),  # type: ignore[assignment]
        log_y: bool = False,
        ylim: tuple[float, float] | None = None,
    ) -> None:
        fig, ax = plt.subplots(figsize=(7, 3.5), dpi=100)
        for label, values in series:
            pts = [(s, v) for s, v in zip(steps, values, strict=True) if v is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), label=label)
        for label, xs, ys in extra:
            if xs:
                ax.plot(xs, ys, "o-", label=label)
        if log_y:
            ax.set_yscale("log")
        if ylim:
            ax.set_ylim(*ylim)
        for at in resumes:
            ax.axvline(at, color="tab:red", linestyle="--", linewidth=0.8)
        ax.set_title(title + (f"  (red: {len(resumes)} resume(s))" if resumes else ""))
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if len(series) + sum(1 for _, xs, _ in extra if xs) > 1:
            ax.legend()
        fig.subplots_adjust(left=0.13, right=0.97, bottom=0.14, top=0.9)  # fixed: tight_layout is slow
        fig.savefig(plots / name)
        plt.close(fig)

    losses = [r.get("loss") for r in rows]
    figure(
        PLOT_LOSS,
        "Loss",
        [("training loss", losses)],
        "loss (log scale)",
        extra=[("eval loss", [e["step"] for e in evals], [e["eval_loss"] for e in evals])],
        log_y=all(v is not None and v > 0 for v in losses) and all(e["eval_loss"] > 0 for e in evals),
    )
    figure(
        PLOT_THROUGHPUT, "Throughput", [("samples/s", [r.get("samples_per_s") for r in rows])], "samples/s"
    )
    figure(
        PLOT_UTILISATION,
        "Utilisation",
        [("GPU %", [r.get("gpu_util") for r in rows]), ("CPU %", [r.get("cpu_util") for r in rows])],
        "percent",
        ylim=(0, 105),
    )
    figure(PLOT_COST, "Cost so far (the trainer's count: its wall time at the rate)",
           [("USD", [r.get("cost_usd") for r in rows])], "USD")

    written.setdefault("status", "unknown (no summary: the run may still be going or was killed)")
    summary = Summary.from_dict(written).to_dict()
    speeds = [r["samples_per_s"] for r in rows if r.get("samples_per_s")]
    from_metrics = {"steps": steps[-1], "final_loss": rows[-1].get("loss"),
                    "cost_usd": rows[-1].get("cost_usd"), "wall_s": rows[-1].get("wall_s")}  # fmt: skip
    for key, value in from_metrics.items():  # what the summary does not know yet, from the newest line
        if summary[key] is None:
            summary[key] = value
    summary["median_samples_per_s"] = statistics.median(speeds) if speeds else None
    timed = [r for r in rows if r.get("step_time_s") and r.get("data_wait_s") is not None]
    summary["median_data_wait_fraction"] = (
        statistics.median(r["data_wait_s"] / r["step_time_s"] for r in timed) if timed else None
    )
    summary["plots"] = [f"{PLOTS_DIR}/{name}" for name in PLOT_FILES]
    write_summary(folder, summary)
    return summary


def history(events_path: Path) -> dict[str, Any]:
    """Preemptions, stops, restarts and lost steps over all sessions of a run folder, from events.jsonl.

    A session's last word is finish, preempt or fail (the bucket mirror's report after it ends
    nothing). A session that ended with ``preempt`` (a SIGTERM with a clean save: a Spot preemption,
    a maintenance stop) counts as a preemption, unless `forja stop` asked for it (``requested_by``,
    trainer.preemption.STOP_REQUESTED): that is a stop. One that crashed (``fail``) or was killed
    with no last word (SIGKILL, the OOM killer, a power cut) is a restart.
    """
    sessions: list[list[dict[str, Any]]] = []
    for event in metrics.read_jsonl(events_path):
        if event.get("event") in ("start", "resume") or not sessions:
            sessions.append([])
        sessions[-1].append(event)
    said = [[e for e in s if e.get("event") != "mirror"] or s for s in sessions[:-1]]
    last = [s[-1] for s in said]
    lost = sum(int(e.get("lost_steps", 0)) for s in sessions for e in s if e.get("event") == "resume")
    saved = [e for e in last if e.get("event") == "preempt"]
    stops = sum(1 for e in saved if e.get("requested_by"))
    return {"preemptions": len(saved) - stops, "stops": stops,
            "restarts": sum(1 for e in last if e.get("event") not in ("finish", "preempt")),
            "lost_steps": lost}  # fmt: skip


def record_failure(out: Path, exc: BaseException) -> None:
    """summary.json says 'failed' with the error; events.jsonl closes the session with 'fail'."""
    from trainer.errors import exit_code_for

    earlier: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        earlier = json.loads((out / SUMMARY).read_text())
    summary = Summary.from_dict(earlier if isinstance(earlier, dict) else {})
    summary.status, summary.error = "failed", f"{type(exc).__name__}: {exc}"
    summary.exit_code, summary.time = exit_code_for(exc), time.time()
    write_summary(out, summary.to_dict())
    events = metrics.JsonLines(out / EVENTS)
    events.write({"event": "fail", "time": time.time(), "error": f"{type(exc).__name__}: {exc}"})
    events.close()
