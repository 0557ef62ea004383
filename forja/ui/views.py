"""What the dashboard shows for people, formatted here by forja.format (the one home of those rules),
so the page prints the same `0.2¢`, `$0.85/h`, `2h 05m` and `0.3120` as the `forja` command."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forja import format as fmt
from forja.live import mfu_words, throughput_words


def _gib(value: float | None) -> str:
    return fmt.MISSING if value is None else f"{value / 2**30:.1f} GiB"


def live(sample: Mapping[str, Any], now: float) -> dict[str, Any]:
    """A live sample's figures (`forja.live.LiveSample.to_dict()`), as `forja top` shows them."""
    step, total = sample.get("step"), sample.get("total_steps")
    fraction = step / total if step is not None and total else None
    last = sample.get("last_progress_timestamp")
    figures = [
        ("loss", fmt.loss(sample.get("loss"))),
        ("throughput", throughput_words(sample.get("samples_per_second"), sample.get("tokens_per_second"))),
        ("MFU", mfu_words(sample.get("mfu"), sample.get("mfu_ceiling"))),
        ("eta", fmt.duration(sample.get("eta_seconds"))),
        ("cost so far", fmt.money(sample.get("cost_usd"))),
        ("last progress", "" if last is None else f"{fmt.duration(max(0.0, now - last))} ago"),
        ("data wait", fmt.duration(sample.get("data_wait_seconds"))),
        ("CPU", fmt.percent(sample.get("cpu_utilization"))),
        ("memory", _gib(sample.get("memory_used_bytes"))),
    ]
    for gpu in sample.get("gpus") or []:
        watts = gpu.get("power_watts")
        temp = gpu.get("temperature_celsius")
        parts = (fmt.percent(gpu.get("utilization")), _gib(gpu.get("memory_used_bytes")),
                 "" if temp is None else f"{temp:.0f} °C", "" if watts is None else f"{watts:.0f} W")
        figures.append((f"GPU {gpu['gpu']}", " ".join(x for x in parts if x)))
    return {
        "step": fmt.count(step) + (f" / {fmt.count(total)}" if total else ""),
        "fraction": fmt.percent(fraction),
        "loss": fmt.loss(sample.get("loss")) if sample.get("samples_per_second") else "",  # 0 before a log
        "phase": sample.get("phase") or "",
        "figures": figures,
    }


def run_row(record: Any, cost_usd: float | None) -> dict[str, str]:
    return {"started": fmt.timestamp(record.started_at), "steps": fmt.count(record.steps),
            "loss": fmt.loss(record.last_loss), "cost": fmt.money(cost_usd)}  # fmt: skip


def cost(found: Any) -> dict[str, Any]:
    """A run's cost (forja.cost.run.RunCost) as the rows of `forja cost --run` and its note."""
    rows = []
    for part in (p for p in found.parts if p.seconds is not None):  # the split needs the fetched results
        share = part.seconds / found.up_s if part.seconds is not None and found.up_s else None
        rows.append([part.name.replace("_", " "), fmt.duration(part.seconds), fmt.money(part.usd),
                     fmt.percent(share)])  # fmt: skip
    rows += [
        ["VM up for the run", fmt.duration(found.up_s), fmt.money(found.vm_usd), ""],
        [f"down ({found.preemptions} preempted, {found.zone_moves} zone moves)", fmt.duration(found.down_s),
         "", ""],
        ["disk, the whole time", fmt.duration(found.span_s), fmt.money(found.disk_usd) or "?", ""],
        ["total", "", fmt.money(found.cost_usd), ""],
    ]
    note = f"rate {fmt.hourly(found.usd_per_hour)}: {found.rate_source}"
    if all(part.seconds is None for part in found.parts):
        note += "; the split into setup, compute, data wait and evaluation comes with the fetched results"
    if found.disk_usd is None:
        note += "; the disk is not counted (no record of the run's VM)"
    if found.training_usd is not None:
        note += f"; {training_words(found.training_usd)}"
    return {"rows": rows, "note": note}


def training_words(usd: float | None) -> str:
    """The trainer's own count, labelled as the part of the cost it is (forja/cost/run.py), everywhere."""
    from forja.cost.run import TRAINING_LABEL

    return f"{TRAINING_LABEL}: {fmt.money(usd)}"


def event(found: Any) -> dict[str, str]:
    """A history event: its time to the second and its data as `key value` pairs."""
    text = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in found.data.items() if v not in (None, ""))
    return {"time": fmt.timestamp(found.time), "text": text}


def vm(line: Mapping[str, Any]) -> list[tuple[str, str]]:
    """One VM of `forja cost`: its type, zone, rate, time up and spend."""
    kind = line["machine_type"] + (" spot" if line.get("spot") else "")
    return [
        ("type", kind),
        ("zone", line["zone"]),
        ("rate", fmt.hourly(line["usd_per_hour"])),
        ("up", fmt.duration(line["uptime_s"]) if line.get("uptime_s") else "-"),
        ("spent since start", fmt.money(line["session_usd"])),
        ("month if left running", fmt.money(line["monthly_if_running_usd"])),
        ("disk per month", fmt.money(line.get("disk_usd_per_month")) or "-"),
    ]


def sweep_rows(report: Any) -> list[dict[str, str]]:
    """A sweep's trials as the dashboard's table shows them (forja.sweep.SweepReport); a trial's cost as
    `forja sweep status` shows it (forja.sweep.cost_words: the settled cost, else ≥ the trainer's count)."""
    from forja.sweep import cost_words

    return [{
        "trial": str(row.number), "run": row.run, "state": row.state, "best": "best" if row.best else "",
        "params": ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in row.params.items()),
        "value": ", ".join(f"{v:.5g}" for v in row.values) if row.values else "",
        "cost": cost_words(row), "why": row.reason,
    } for row in report.trials]
