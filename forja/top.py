"""`forja top`: the runs' live metrics in the terminal, refreshed in place, following the run.

Why a verb of its own and not `forja status --watch`: status runs a playbook (SSH, Ansible, a
few seconds) and reports what the host's run folder says; top reads each run's Prometheus endpoint
through the tunnel (`forja.live`, no Ansible) every couple of seconds, as `top` or `nvtop` do.
It only reads: Ctrl-C leaves the run alone (exit 0), and a run that restarts (a preemption, a
resume on another port of the range) is picked up again at the next refresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from rich.console import Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from forja import format as fmt
from forja import live
from forja.live import LiveSample

#: How old the last progress may be before top shows it in red (a stall is autostop's to judge).
STALE_S = 120.0


def _bytes(value: float | None) -> str:
    return fmt.MISSING if value is None else f"{value / 2**30:.1f} GiB"


def _bar(fraction: float | None, width: int = 20) -> str:
    if fraction is None:
        return ""
    done = round(fraction * width)
    return "█" * done + "░" * (width - done)


def run_table(sample: LiveSample, now: float) -> Table:
    """One run: progress, the numbers the trainer reports, and the host it runs on."""
    fraction = sample.fraction_done
    title = escape(f"{sample.run or '?'}  [{sample.phase or '?'}]")
    table = Table(title=title, show_header=False, title_justify="left", box=None, padding=(0, 2))
    table.add_column("what", style="bold")
    table.add_column("value")
    steps = f"{fmt.count(sample.step)} / {fmt.count(sample.total_steps)}"
    if fraction is not None:
        steps += f"  {_bar(fraction)} {fmt.percent(fraction)}"
    table.add_row("step", steps)
    table.add_row("loss", fmt.loss(sample.loss))
    table.add_row("throughput", live.throughput_words(sample.samples_per_second, sample.tokens_per_second))
    table.add_row("MFU", live.mfu_words(sample.mfu, sample.mfu_ceiling))
    table.add_row("eta", fmt.duration(sample.eta_seconds))
    table.add_row("cost so far", fmt.money(sample.cost_usd))
    age = sample.progress_age(now)
    progress = Text(fmt.MISSING if age is None else f"{fmt.duration(age)} ago")
    if age is not None and age > STALE_S:
        progress.stylize("bold red")
    table.add_row("last progress", progress)
    table.add_row("data wait", fmt.duration(sample.data_wait_seconds) + " in all")
    table.add_row("cpu", fmt.percent(sample.cpu_utilization))
    table.add_row("ram", _bytes(sample.memory_used_bytes))
    for gpu in sample.gpus:
        watts = fmt.MISSING if gpu.power_watts is None else f"{gpu.power_watts:.0f} W"
        hot = fmt.MISSING if gpu.temperature_celsius is None else f"{gpu.temperature_celsius:.0f} °C"
        table.add_row(f"gpu {gpu.gpu}", f"{fmt.percent(gpu.utilization)}  {_bytes(gpu.memory_used_bytes)}  "
                      f"{hot}  {watts}")  # fmt: skip
    if not sample.gpus:
        table.add_row("gpu", "none reported (no GPU, or NVML unavailable)")
    table.caption = sample.url
    return table


def render(samples: Sequence[LiveSample], urls: Sequence[str], now: float | None = None) -> RenderableType:
    """What one refresh shows: a table per run, or where nothing answered and what to do."""
    now = time.time() if now is None else now
    if not samples:
        where = urls[0] if len(urls) == 1 else f"{urls[0]} .. {urls[-1]}"
        return Text(f"no run serves live metrics at {where} (yet); open the tunnel with `forja tunnel`, "
                    "or wait for the run to start (Ctrl-C leaves the run alone)", style="yellow")  # fmt: skip
    return Group(*(run_table(sample, now) for sample in samples))


def watch(read: Callable[[], list[LiveSample]], urls: Sequence[str], interval_s: float) -> None:
    """Refresh in place every `interval_s` until Ctrl-C (which returns; the run goes on)."""
    try:
        with Live(render(read(), urls), refresh_per_second=4, screen=False) as view:
            while True:
                time.sleep(interval_s)
                view.update(render(read(), urls))
    except KeyboardInterrupt:
        return
