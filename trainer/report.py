"""``report``: PNG plots and a summary of a run folder, readable without the trainer running.

Why from files: the run may have died (preempted, killed); everything needed is in metrics.jsonl
and events.jsonl, so a person can render the pictures of any run, finished or not, on any machine.
Preemptions are drawn as vertical lines so lost work is visible on every plot.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from trainer import finite
from trainer.metrics import read_jsonl
from trainer.summary import Summary

PLOTS = ("loss.png", "throughput.png", "utilisation.png", "cost.png")


def write_summary(run: Path, summary: dict[str, Any]) -> Path:
    """summary.json, replaced atomically (a reader never sees half a file)."""
    path = run / "summary.json"
    tmp = path.with_name(f"summary.json.tmp.{os.getpid()}")
    tmp.write_text(finite.dumps(summary, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def _interruptions(run: Path) -> list[int]:
    return [int(e.get("step", 0)) for e in read_jsonl(run / "events.jsonl") if e.get("event") == "resume"]


def render(run: str | os.PathLike[str]) -> dict[str, Any]:
    """Draw plots/*.png from metrics.jsonl, refresh summary.json's derived numbers, return the summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(run)
    rows = list(read_jsonl(folder / "metrics.jsonl"))
    if not rows:
        raise FileNotFoundError(f"{folder / 'metrics.jsonl'} has no metrics: is --run a trainer run folder?")
    plots = folder / "plots"
    plots.mkdir(exist_ok=True)
    steps = [r["step"] for r in rows]
    resumes = _interruptions(folder)

    evals = [e for e in read_jsonl(folder / "events.jsonl") if e.get("event") in ("eval", "finish")]
    evals = [e for e in evals if e.get("eval_loss") is not None]

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
        "loss.png",
        "Loss",
        [("training loss", losses)],
        "loss (log scale)",
        extra=[("eval loss", [e["step"] for e in evals], [e["eval_loss"] for e in evals])],
        log_y=all(v is not None and v > 0 for v in losses) and all(e["eval_loss"] > 0 for e in evals),
    )
    figure(
        "throughput.png", "Throughput", [("samples/s", [r.get("samples_per_s") for r in rows])], "samples/s"
    )
    figure(
        "utilisation.png",
        "Utilisation",
        [("GPU %", [r.get("gpu_util") for r in rows]), ("CPU %", [r.get("cpu_util") for r in rows])],
        "percent",
        ylim=(0, 105),
    )
    figure("cost.png", "Cumulative cost", [("USD", [r.get("cost_usd") for r in rows])], "USD")

    summary_path = folder / "summary.json"
    written: dict[str, Any] = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    written.setdefault("status", "unknown (no summary: the run may still be going or was killed)")
    summary = Summary.from_dict(written).to_dict()
    speeds = [r["samples_per_s"] for r in rows if r.get("samples_per_s")]
    from_metrics = {"steps": steps[-1], "final_loss": rows[-1].get("loss"),
                    "cost_usd": rows[-1].get("cost_usd"), "wall_s": rows[-1].get("wall_s")}  # fmt: skip
    for key, value in from_metrics.items():  # what the summary does not know yet, from the newest line
        if summary[key] is None:
            summary[key] = value
    summary["median_samples_per_s"] = statistics.median(speeds) if speeds else None
    summary["median_data_wait_fraction"] = (
        statistics.median(r["data_wait_s"] / r["step_time_s"] for r in rows if r.get("step_time_s"))
        if any(r.get("step_time_s") for r in rows)
        else None
    )
    summary["plots"] = [f"plots/{name}" for name in PLOTS]
    write_summary(folder, summary)
    return summary
