"""The plan (trainer/plan.py) for people: one table, each figure with how it was found and how sure.

Standard library only: ``forja plan`` prints the same table from the trainer's JSON without torch
(forja imports the trainer's standard-library modules, as it does trainer.summary and figures).
"""

from __future__ import annotations

from typing import Any

from trainer.figures import duration


def format_plan(r: dict[str, Any]) -> str:
    """The plan for a person: the peak per micro-batch, the plan, the time; how sure each is."""

    def sure(f: dict[str, Any]) -> str:
        return f"{f['how']}, ±{f['sure']:.0%}"

    gpu = r["gpu"]
    plan_ = r["plan"]
    rate = (f"each op timed on the {gpu['ops_timed_on']} at its shapes" if gpu.get("ops_timed_on") else
            f"at {gpu['tflops_measured']['value']:.3g} TFLOPS ({gpu['tflops_measured']['how']})")
    lines = [
        f"plan for {gpu['count']} x {gpu['name']} ({r['config']['precision']}, {r['config']['optimizer']}, "
        f"{r['params']:,} parameters), made in {r['plan_seconds']:.1f} s from {r['traces']} traced steps",
        f"  usable {gpu['usable_mib']['value']:,.0f} MiB ({gpu['usable_mib']['how']}), "
        f"CUDA context {gpu['context_mib']['value']:.0f} MiB ({gpu['context_mib']['how']}), "
        f"allocator overhead {gpu['allocator_overhead']['value']:.0%} ({gpu['allocator_overhead']['how']})",
        "micro-batch   peak on the GPU",
    ]
    for row in r["peak_per_micro_batch"]:
        lines.append(f"  {row['micro_batch']:>10}   {row['peak_mib']:>9,.0f} MiB  ({row['how']})")
    margin = f", {r['margin']:.0%} margin" if r["margin"] else ""
    lines += [
        f"largest micro-batch that fits   {r['largest_micro_batch']['value']} "
        f"(limited by {r['limited_by']}{'' if r['limited_by'] == 'memory' else ' ' + str(r['cap'])}{margin})",
        f"plan              micro-batch {plan_['micro_batch']} x accumulation {plan_['accum_steps']} "
        f"x {plan_['world_size']} GPU(s) = global batch {plan_['global_batch']}",
        f"peak at the plan  {r['peak_mib']['value']:,.0f} MiB ({sure(r['peak_mib'])})",
        f"step time         {r['step_s']['value'] * 1e3:,.1f} ms ({sure(r['step_s'])}; "
        f"{r['flops_per_step']['value'] / 1e9:,.2f} GFLOP {rate}, data loading measured on this CPU)",
        f"training          {r['steps']:,} steps: {duration(r['train_s']['value'])}"
        " (the loop only: setup and evaluation come on top)",
        f"throughput        {r['samples_per_s']['value']:,.1f} samples/s"
        + (f", {r['tokens_per_s']['value']:,.0f} tokens/s" if "tokens_per_s" in r else ""),
    ]
    if r.get("mfu_datasheet") is not None:
        lines.append(
            f"MFU               {r['mfu_datasheet']:.0%} of the {gpu['tflops_datasheet']:g} TFLOPS datasheet"
        )
    if r.get("calibration"):
        cal = r["calibration"]
        lines.append(f"calibrated by     {cal['source']} (memory x{cal['memory_ratio']:.3f}, "
                     f"time x{cal['time_ratio']:.3f})")
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)
