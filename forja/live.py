"""A running training run's live metrics, read from its Prometheus endpoint: the controller's one reader.

Every run the trainer starts serves Prometheus text on ``127.0.0.1:<port>/metrics`` on its host
(``trainer/live.py``; the port is the host contract's ``metrics_port``, or the next free one of
``metrics_ports``, and the run writes it to ``<run dir>/<run>/live.json``). The tunnel the
jupyter_colab role publishes forwards all those ports, each to the same port on the controller, so
a run on the far side of the tunnel is ``live_url(port)``. `forja top`, `forja ui` and the tests
read the endpoint through `scrape`, which parses with prometheus_client's own text parser (never a
hand-written one) and turns the families into one typed `LiveSample`.

The metric names are the interface between the trainer and its readers (common16, interface 2);
they are listed once here (`METRICS`) and the trainer's own module names the same strings.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from forja import format as fmt
from forja import host_contract
from forja.errors import ExitCode, ForjaError

#: Run-level gauges (each labelled run="<run name>") and the `LiveSample` field each fills.
RUN_GAUGES: dict[str, str] = {
    "forja_train_step": "step",
    "forja_train_total_steps": "total_steps",
    "forja_train_loss": "loss",
    "forja_train_samples_per_second": "samples_per_second",
    "forja_train_eta_seconds": "eta_seconds",
    "forja_train_cost_usd": "cost_usd",
    "forja_train_last_progress_timestamp_seconds": "last_progress_timestamp",
    "forja_data_wait_seconds_total": "data_wait_seconds",
    "forja_cpu_utilization_ratio": "cpu_utilization",
    "forja_memory_used_bytes": "memory_used_bytes",
}
#: Run-level gauges served only once the run knows them (a token model's tokens/s; MFU where its FLOPs
#: are known, against the datasheet peak and the measured ceiling: trainer.mfu), absent before.
LATER_GAUGES: dict[str, str] = {
    "forja_train_tokens_per_second": "tokens_per_second",
    "forja_train_mfu_ratio": "mfu",
    "forja_train_mfu_ceiling_ratio": "mfu_ceiling",
}
#: The phase gauge: forja_train_phase{phase="train"} = 1 for the phase the run is in.
PHASE_GAUGE = "forja_train_phase"
#: Per-GPU gauges (labelled gpu="<index>") and the `GpuSample` field each fills.
GPU_GAUGES: dict[str, str] = {
    "forja_gpu_utilization_ratio": "utilization",
    "forja_gpu_memory_used_bytes": "memory_used_bytes",
    "forja_gpu_temperature_celsius": "temperature_celsius",
    "forja_gpu_power_watts": "power_watts",
}
#: Every metric name of the interface (Grafana's dashboard and the tests check against it).
METRICS: tuple[str, ...] = (*RUN_GAUGES, *LATER_GAUGES, PHASE_GAUGE, *GPU_GAUGES)


class LiveError(ForjaError):
    """The run's metrics endpoint cannot be read (not serving yet, the tunnel is down, not Prometheus)."""

    exit_code = ExitCode.UNREACHABLE

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"{url}: the run's live metrics cannot be read: {detail}")
        self.url = url


@dataclasses.dataclass(frozen=True)
class GpuSample:
    """One GPU as NVML saw it at the scrape (a value NVML could not give is None)."""

    gpu: str
    utilization: float | None = None
    memory_used_bytes: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None


@dataclasses.dataclass(frozen=True)
class LiveSample:
    """One scrape of one run: what the trainer reported, None where it has not reported it (yet).

    ``scraped_at`` is this machine's clock; ``last_progress_timestamp`` is the host's (Unix seconds).
    ``gpus`` is empty on a host without a GPU or where NVML failed.
    """

    url: str
    scraped_at: float
    run: str = ""
    phase: str = ""
    step: float | None = None
    total_steps: float | None = None
    loss: float | None = None
    samples_per_second: float | None = None
    #: A token model's tokens/s; MFU against the datasheet peak and the measured ceiling (trainer.mfu).
    tokens_per_second: float | None = None
    mfu: float | None = None
    mfu_ceiling: float | None = None
    eta_seconds: float | None = None
    cost_usd: float | None = None
    last_progress_timestamp: float | None = None
    data_wait_seconds: float | None = None
    cpu_utilization: float | None = None
    memory_used_bytes: float | None = None
    gpus: tuple[GpuSample, ...] = ()

    @property
    def fraction_done(self) -> float | None:
        """Step / total steps (0..1), or None before both are known."""
        if self.step is None or not self.total_steps:
            return None
        return max(0.0, min(1.0, self.step / self.total_steps))

    def progress_age(self, now: float | None = None) -> float | None:
        """Seconds since the run last made progress (a step or an evaluation batch), by `now`'s clock."""
        if self.last_progress_timestamp is None:
            return None
        return max(0.0, (time.time() if now is None else now) - self.last_progress_timestamp)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (for `forja top --json` and `forja ui`)."""
        return dataclasses.asdict(self)


def throughput_words(samples_per_second: float | None, tokens_per_second: float | None) -> str:
    """``1,234 samples/s``, with ``(81,000 tokens/s)`` for a token model (`forja top`, `forja ui`)."""
    shown = fmt.per_second(samples_per_second, "samples")
    return shown + (f"  ({fmt.per_second(tokens_per_second, 'tokens')})" if tokens_per_second else "")


def mfu_words(of_peak: float | None, of_ceiling: float | None) -> str:
    """Model FLOPs utilisation against the datasheet peak and the ceiling measured at the run's start
    (trainer.mfu); a CPU run has only the second, a model whose FLOPs are unknown neither."""
    parts = [f"{fmt.percent(of_peak)} of datasheet peak" if of_peak is not None else "",
             f"{fmt.percent(of_ceiling)} of measured ceiling" if of_ceiling is not None else ""]  # fmt: skip
    return ", ".join(p for p in parts if p) or fmt.MISSING


def _number(value: float) -> float | None:
    """A GPU gauge's value; NaN (the exporter had no reading) is None."""
    return None if math.isnan(value) else float(value)


def parse(text: str, url: str = "", scraped_at: float | None = None) -> LiveSample:
    """A `LiveSample` from Prometheus text exposition (prometheus_client's parser; ValueError if not)."""
    run_values: dict[str, float | None] = {}
    gpus: dict[str, dict[str, float | None]] = {}
    run = phase = ""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            run = run or labels.get("run", "")
            if sample.name in RUN_GAUGES or sample.name in LATER_GAUGES:
                field = RUN_GAUGES.get(sample.name) or LATER_GAUGES[sample.name]
                run_values[field] = float(sample.value)  # a NaN loss is the run's, said
            elif sample.name == PHASE_GAUGE and sample.value == 1:
                phase = labels.get("phase", "")
            elif sample.name in GPU_GAUGES and "gpu" in labels:
                gpus.setdefault(labels["gpu"], {})[GPU_GAUGES[sample.name]] = _number(sample.value)
    ordered = sorted(gpus.items(), key=lambda item: (len(item[0]), item[0]))
    return LiveSample(
        url=url,
        scraped_at=time.time() if scraped_at is None else scraped_at,
        run=run,
        phase=phase,
        gpus=tuple(GpuSample(gpu=index, **values) for index, values in ordered),
        **run_values,  # type: ignore[arg-type]
    )


def scrape(url: str, timeout: float = 5) -> LiveSample:
    """Read a run's metrics endpoint once (``http://127.0.0.1:8890/metrics``); `LiveError` if it can't."""
    try:
        response = requests.get(url, timeout=timeout, headers={"Accept": "text/plain"})
        response.raise_for_status()
    except requests.RequestException as exc:
        raise LiveError(url, f"{type(exc).__name__}: {exc}") from exc
    try:
        return parse(response.text, url=url)
    except ValueError as exc:
        raise LiveError(url, f"not Prometheus text exposition: {exc}") from exc


def metrics_ports(base: int | None = None, count: int | None = None) -> range:
    """The ports runs on one host may serve on: the contract's ``metrics_port`` and the next ones."""
    base = int(host_contract.value("metrics_port")) if base is None else base
    count = int(host_contract.value("metrics_ports")) if count is None else count
    return range(base, base + count)


def live_url(
    port: int | None = None, forwards: Mapping[int, int] | None = None, host: str = "127.0.0.1"
) -> str:
    """The URL of a run's endpoint from the controller, for a run reached through the tunnel.

    ``port`` is the port the run took on its host (its live.json; the contract's first port when
    None). The published tunnel forwards every metrics port to the same local port; ``forwards``
    ({remote: local}) names other local ports, as `forja_sandbox`'s tunnels may.
    """
    remote = int(host_contract.value("metrics_port")) if port is None else int(port)
    local = (forwards or {}).get(remote, remote)
    return f"http://{host}:{local}/metrics"


def scrape_any(urls: Iterable[str], timeout: float = 2) -> list[LiveSample]:
    """Every run serving at one of `urls` (the forwarded ports of a host); the silent ones are left out."""
    found = []
    for url in urls:
        try:
            found.append(scrape(url, timeout))
        except LiveError:
            continue
    return found


def samples(
    run: str | None = None, urls: Sequence[str] | None = None, timeout: float = 2.0
) -> list[LiveSample]:
    """The live metrics of the runs that serve them: step, loss, throughput, ETA, cost, GPU, CPU.

    Reads each run's Prometheus endpoint once, at `urls` (default: 127.0.0.1 at each of the host
    contract's metrics ports, where the tunnel of `forja tunnel` forwards them); `run` keeps that
    run only. No playbook runs: the numbers come straight from the runs (`forja.live`), so it can
    be called every second. Nothing serving is an empty list.
    """
    chosen = list(urls) if urls else [live_url(port) for port in metrics_ports()]
    return [sample for sample in scrape_any(chosen, timeout) if run is None or sample.run == run]
