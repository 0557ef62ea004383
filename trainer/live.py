"""The run's live metrics: Prometheus text on 127.0.0.1, for `forja top`, `forja ui`, Grafana and autostop.

Why an endpoint and not only metrics.jsonl: the file is written at log steps, read after the fact;
a person watching a run, a Prometheus server and the autostop stall detector all want "now", and
the same numbers. prometheus-client serves them from its own HTTP server thread (bound to the
loopback alone: the host's SSH tunnel reaches it, nothing else does) out of a private registry,
so only forja's metrics are exposed, every one labelled ``run="<run name>"``.

What the loop pays: a gauge set per step (a lock and a float) and the numbers it already computes
at log steps. CPU, RAM and the GPUs (NVML, when a driver is there) are read by the scrape itself, in
the server's thread, so they are as fresh as the scrape and the loop never samples them.

The port: ``FORJA_METRICS_PORT`` (the host contract's ``metrics_port``, which trainer_run puts in the
run's environment), or the next free one of ``FORJA_METRICS_PORTS`` ports when a concurrent run
holds it; the port taken goes to ``<run dir>/live.json`` (trainer.run_folder.LIVE, written whole) as
``{"port": N, "pid": P}`` (port 0: any free one). Without ``FORJA_METRICS_PORT`` (a run started by
hand) no port is opened. Rank 0 only.

The metric names are an interface (forja's `forja/live.py` reads them); keep them as they are.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from trainer.run_folder import LIVE, write_atomic

log = logging.getLogger(__name__)

#: Environment variables trainer_run sets (run.env): the first port and how many to try.
PORT_ENV, PORTS_ENV = "FORJA_METRICS_PORT", "FORJA_METRICS_PORTS"
#: The phases ``forja_train_phase{phase=...}`` reports (1 for the current one, 0 for the others).
PHASES = ("setup", "train", "eval")
#: Where the endpoint listens: the loopback alone (the tunnel forwards it; nothing else may reach it).
BIND = "127.0.0.1"


class SystemCollector(Collector):
    """CPU, RAM and GPU gauges read at each scrape (psutil; NVML when it initialises, else no GPU gauges)."""

    def __init__(self, run: str) -> None:
        self.run = run
        self._last_cpu = psutil.cpu_times()
        self._nvml: Any = None
        self._gpus: list[Any] = []
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self._gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception as exc:  # no library, no driver, no GPU: the GPU gauges are simply absent
            log.debug("live metrics without GPUs (NVML: %s)", exc)

    def cpu_ratio(self) -> float:
        """System-wide busy fraction since the previous scrape (its own baseline: the loop's
        psutil.cpu_percent calls keep theirs)."""
        now = psutil.cpu_times()
        before, self._last_cpu = self._last_cpu, now
        total = sum(now) - sum(before)
        idle = (now.idle + getattr(now, "iowait", 0.0)) - (before.idle + getattr(before, "iowait", 0.0))
        return max(0.0, min(1.0, 1.0 - idle / total)) if total > 0 else 0.0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        cpu = GaugeMetricFamily(
            "forja_cpu_utilization_ratio", "Host CPU busy fraction since the last scrape.", labels=["run"]
        )
        cpu.add_metric([self.run], self.cpu_ratio())
        yield cpu
        mem = GaugeMetricFamily("forja_memory_used_bytes", "Host RAM in use (total - free).", labels=["run"])
        vm = psutil.virtual_memory()
        mem.add_metric([self.run], float(vm.total - vm.available))
        yield mem
        if self._nvml is not None:
            yield from self.gpu_families()

    def gpu_families(self) -> Iterator[GaugeMetricFamily]:
        nv = self._nvml
        hot = nv.NVML_TEMPERATURE_GPU
        reads: dict[str, tuple[str, Callable[[Any], float]]] = {
            "forja_gpu_utilization_ratio": (
                "GPU busy fraction (NVML).", lambda h: nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
            "forja_gpu_memory_used_bytes": (
                "GPU memory in use (NVML).", lambda h: float(nv.nvmlDeviceGetMemoryInfo(h).used)),
            "forja_gpu_temperature_celsius": (
                "GPU temperature (NVML).", lambda h: float(nv.nvmlDeviceGetTemperature(h, hot))),
            "forja_gpu_power_watts": (
                "GPU power draw (NVML).", lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
        }  # fmt: skip
        for name, (doc, read) in reads.items():
            family = GaugeMetricFamily(name, doc, labels=["run", "gpu"])
            for index, handle in enumerate(self._gpus):
                with contextlib.suppress(Exception):  # a value this GPU does not report is left out
                    family.add_metric([self.run, str(index)], read(handle))
            yield family


class LiveMetrics:
    """Rank 0's endpoint for one run: the loop sets gauges, the server thread answers scrapes."""

    def __init__(self, run: str, out: Path) -> None:
        self.run, self.out = run, out
        self.registry = CollectorRegistry()
        gauge = self._gauge
        self.step = gauge("forja_train_step", "Optimizer steps done.")
        self.total_steps = gauge("forja_train_total_steps", "Steps the run will take.")
        self.loss = gauge("forja_train_loss", "Training loss at the last log step (mean over ranks).")
        self.samples_per_second = gauge("forja_train_samples_per_second", "Samples/s, last log window.")
        # set at the first log step that knows them (a CNN has no tokens; a CPU no datasheet MFU):
        # a reader sees them absent, not 0
        self.tokens_per_second = self._later("forja_train_tokens_per_second", "Tokens/s, last log window.")
        self.mfu = self._later("forja_train_mfu_ratio", "Model FLOPs utilisation against the datasheet peak.")
        self.mfu_ceiling = self._later(
            "forja_train_mfu_ceiling_ratio", "Model FLOPs utilisation against the measured matmul ceiling."
        )
        self.eta = gauge("forja_train_eta_seconds", "Seconds left at this session's mean rate.")
        self.cost = gauge("forja_train_cost_usd", "Cost so far, USD: hourly rate x wall time (all sessions); "
                          "the run's final cost adds setup and disk (metrics.cost_usd).")
        self.last_progress = gauge("forja_train_last_progress_timestamp_seconds",
                                   "Unix time of the last training step or evaluation batch.")  # fmt: skip
        self.data_wait = Counter("forja_data_wait_seconds", "Seconds the loop waited for its next batch.",
                                 ["run"], registry=self.registry).labels(run=run)  # fmt: skip
        self._phase = Gauge("forja_train_phase", "1 for the phase the run is in.", ["run", "phase"],
                            registry=self.registry)  # fmt: skip
        self.registry.register(SystemCollector(run))
        self.set_phase("setup")
        self.progress()
        self.server: Any = None
        self.port: int | None = None

    def _gauge(self, name: str, doc: str) -> Any:
        return Gauge(name, doc, ["run"], registry=self.registry).labels(run=self.run)

    def _later(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, ["run"], registry=self.registry)

    def serve(self, first_port: int, ports: int) -> int | None:
        """Listen on the first free port of ``first_port`` .. +ports-1, write live.json; None: all taken."""
        for port in range(first_port, first_port + max(1, ports)):
            try:
                self.server, _thread = start_http_server(port, addr=BIND, registry=self.registry)
            except OSError:
                continue
            port = self.port = int(self.server.server_port)  # port 0 asks the system for any free one
            write_atomic(self.out / LIVE, json.dumps({"port": port, "pid": os.getpid()}))
            log.info("live metrics on http://%s:%d/metrics", BIND, port)
            return port
        log.warning("live metrics off: ports %d-%d are all taken", first_port, first_port + ports - 1)
        return None

    def track(self, total_steps: int, cost_so_far: Callable[[], float]) -> None:
        """What the setup decided: the steps to take, and how to price the time spent (read per scrape)."""
        self.total_steps.set(total_steps)
        self.cost.set_function(cost_so_far)

    def set_phase(self, phase: str) -> None:
        for name in PHASES:
            self._phase.labels(run=self.run, phase=name).set(1.0 if name == phase else 0.0)

    def progress(self, step: int | None = None) -> None:
        """The run moved (a step, or an evaluation batch): what the stall detector watches."""
        if step is not None:
            self.step.set(step)
        self.last_progress.set(time.time())

    def logged(
        self,
        loss: float,
        samples_per_second: float,
        eta_s: float | None,
        data_wait_s: float,
        utilisation: dict[str, float | None] | None = None,
    ) -> None:
        """The numbers a log step computed (``data_wait_s``: the window's total wait; ``utilisation``:
        trainer.mfu.Utilisation.figures, whose known values become gauges)."""
        self.loss.set(loss)
        self.samples_per_second.set(samples_per_second)
        figures = utilisation or {}
        for gauge, key in ((self.tokens_per_second, "tokens_per_s"), (self.mfu, "mfu"),
                           (self.mfu_ceiling, "mfu_ceiling")):  # fmt: skip
            if figures.get(key) is not None:
                gauge.labels(run=self.run).set(figures[key])
        if eta_s is not None:
            self.eta.set(eta_s)
        self.data_wait.inc(max(0.0, data_wait_s))

    def close(self) -> None:
        """Stop serving and remove live.json (a reader then knows nothing serves for this run)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
            with contextlib.suppress(OSError):
                (self.out / LIVE).unlink()


def start(out: Path, run: str, is_main: bool) -> LiveMetrics | None:
    """Rank 0's endpoint when the environment names a port (trainer_run's run.env), else None."""
    first = os.environ.get(PORT_ENV, "").strip()
    if not is_main or not first:
        return None
    try:
        port, ports = int(first), int(os.environ.get(PORTS_ENV, "1") or 1)
    except ValueError:
        log.warning("live metrics off: %s=%r / %s is not a port number", PORT_ENV, first, PORTS_ENV)
        return None
    out.mkdir(parents=True, exist_ok=True)
    live = LiveMetrics(run, out)
    live.serve(port, ports)
    return live
