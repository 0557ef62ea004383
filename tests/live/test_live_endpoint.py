"""A real training run on CPU serves its live metrics; forja reads them (`forja.live`, `forja top`).

One run (`python -m trainer train`, as trainer_run starts it, with FORJA_METRICS_PORT in its
environment) serves for the whole module; the tests read it in file order and the last one stops it.
The first port of its range is held by this test, so the run must take the next one.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from trainer_helpers import subprocess_env, tiny_digits, until
from typer.testing import CliRunner

from forja import live
from forja.cli import app
from trainer import exit_codes, run_folder

RUN = "live-test"
runner = CliRunner()


@dataclass(frozen=True)
class Serving:
    proc: subprocess.Popen[str]
    first_port: int
    out: Path

    @property
    def live_json(self) -> dict:
        return json.loads((self.out / run_folder.LIVE).read_text())

    @property
    def url(self) -> str:
        return live.live_url(self.live_json["port"])


def _held_port_block(count: int) -> tuple[socket.socket, int]:
    """A listening socket on the first of `count` free consecutive ports (the others left free)."""
    for _ in range(50):
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        base = holder.getsockname()[1]
        if base + count > 65535:
            holder.close()
            continue
        free = []
        for port in range(base + 1, base + count):
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                    free.append(port)
                except OSError:
                    break
        if len(free) == count - 1:
            holder.listen()
            return holder, base
        holder.close()
    raise AssertionError("no block of free ports")


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    tmp = tmp_path_factory.mktemp("live")
    raw = tiny_digits(tmp, steps=10**7, log_every_steps=20)
    config = tmp / "run.yaml"
    config.write_text(json.dumps(raw))
    holder, first = _held_port_block(3)
    env = subprocess_env(FORJA_RUN=RUN, FORJA_METRICS_PORT=str(first), FORJA_METRICS_PORTS="3")
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "train", "--config", str(config)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    out = Path(raw["out_dir"])
    try:
        until(lambda: (out / run_folder.LIVE).is_file() or proc.poll() is not None, 120, "live.json")
        assert proc.poll() is None, proc.communicate()[0]
        yield Serving(proc, first, out)
    finally:
        holder.close()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_the_run_takes_the_next_free_port_and_says_which_in_live_json(serving: Serving) -> None:
    assert serving.live_json == {"port": serving.first_port + 1, "pid": serving.proc.pid}


def test_the_endpoint_listens_on_the_loopback_only(serving: Serving) -> None:
    port = serving.live_json["port"]
    listening = [c.laddr for c in psutil.Process(serving.proc.pid).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]  # fmt: skip
    assert [addr.ip for addr in listening] == ["127.0.0.1"]


def test_every_run_metric_is_served_labelled_with_the_run(serving: Serving) -> None:
    until(lambda: (live.scrape(serving.url).step or 0) > 0, 60, "a first step")
    text = requests.get(serving.url, timeout=5).text
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    names = {s.name for s in samples}
    assert set(live.RUN_GAUGES) | {live.PHASE_GAUGE} <= names
    assert {s.labels.get("run") for s in samples} == {RUN}
    gpu_names = names & set(live.GPU_GAUGES)
    assert gpu_names in (set(), set(live.GPU_GAUGES))  # NVML answers for all four, or is absent
    assert not [n for n in names if n.startswith(("process_", "python_"))], "only forja's metrics"


def test_scrape_reads_the_run_and_its_step_rises(serving: Serving) -> None:
    first = live.scrape(serving.url)
    time.sleep(1.0)
    second = live.scrape(serving.url)
    assert first.run == second.run == RUN and first.phase == "train"
    assert first.step is not None and second.step is not None and second.step > first.step
    assert second.total_steps == 10**7 and 0 < (second.fraction_done or 0) < 1
    assert second.loss is not None and second.samples_per_second and second.samples_per_second > 0
    assert second.eta_seconds is not None and second.eta_seconds > 0
    assert second.cost_usd == 0.0  # no hourly rate given to a local run
    assert second.progress_age() is not None and second.progress_age() < 30
    assert second.data_wait_seconds is not None and second.data_wait_seconds >= 0
    assert second.cpu_utilization is not None and 0 <= second.cpu_utilization <= 1
    assert second.memory_used_bytes and second.memory_used_bytes > 0


def test_forja_top_once_shows_the_run(serving: Serving) -> None:
    result = runner.invoke(app, ["top", "--once", "--url", serving.url], terminal_width=120)
    assert result.exit_code == 0, result.output
    assert f"{RUN}  [train]" in result.output
    for label in ("step", "loss", "throughput", "eta", "cost so far", "last progress", "cpu", "ram", "gpu"):
        assert f"  {label} " in result.output, label
    shown = runner.invoke(app, ["--json", "top", RUN, "--url", serving.url])
    assert shown.exit_code == 0, shown.output
    [sample] = json.loads(shown.output)
    assert sample["run"] == RUN and sample["step"] > 0 and sample["url"] == serving.url
    other = runner.invoke(app, ["--json", "top", "another-run", "--url", serving.url])
    assert other.exit_code == 3 and json.loads(other.output) == []


def test_forja_top_says_where_nothing_answers(serving: Serving) -> None:
    silent = f"http://127.0.0.1:{serving.first_port + 2}/metrics"
    result = runner.invoke(app, ["top", "--once", "--url", silent], terminal_width=200)
    assert result.exit_code == 3
    assert "no run serves live metrics" in result.output and "forja tunnel" in result.output
    with pytest.raises(live.LiveError, match="cannot be read"):
        live.scrape(silent, timeout=2)


def test_a_stopped_run_stops_serving_and_removes_live_json(serving: Serving) -> None:
    url = serving.url
    serving.proc.send_signal(signal.SIGTERM)
    out, _ = serving.proc.communicate(timeout=120)
    assert serving.proc.returncode == exit_codes.PREEMPTED, out
    assert not (serving.out / run_folder.LIVE).exists()
    with pytest.raises(live.LiveError):
        live.scrape(url, timeout=2)
