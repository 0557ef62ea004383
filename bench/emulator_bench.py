"""Latency of the Compute emulator under concurrent clients: Python's old listen backlog (5) vs today's.

Run on demand (not a test): ``python bench/emulator_bench.py [--requests 640] [--clients 8 64]
[--backlogs 5 1024]``.
For each backlog it starts the emulator as its own process (``python -m forja_sandbox.compute_emulator
--listen-backlog N``, so clients and server do not share a GIL), takes one OAuth token through the
token endpoint with the service-account key the emulator wrote, and then, for each number of
clients, starts that many threads at once, each calling ``instances.list`` on one zone until the
round's requests are spent. Two ways of connecting:

- ``new``: a new TCP connection per call, as google.cloud's gcp_compute does (a new session per
  call): the listen backlog decides whether a burst of connections is queued or dropped (a dropped
  SYN is retried after 1 s, then 3 s);
- ``keep``: one keep-alive connection per client, as google-cloud-compute and forja's client do.

It prints p50, p99 and max latency in milliseconds and the throughput. Issue 14 measured a p99 of
about 1 s with 8 clients and 4.3 s with 64 at the old backlog of 5.

Measured on the 2-core development machine (shared with other work, so the numbers vary between
runs), ``--requests 1280``, two runs:

- backlog 5: 8 clients, new connections, p99 11 ms but a max of 1.03 s (dropped SYNs); 64
  clients, new connections, p99 2.7-7.7 s (max 7.8-27.6 s) and 46-163 calls/s; 64 keep-alive
  clients, p99 1.2-1.5 s;
- backlog 1024: 8 clients p99 9-14 ms (max 18 ms); 64 clients, new connections, p99 39-114 ms
  and 1,650-2,190 calls/s; 64 keep-alive clients, p99 177-207 ms at about 4,500 calls/s (the
  tail is 64 threads sharing one GIL on each side).

Before this change, a call on a keep-alive connection also took 44 ms at p50 whatever the load:
the headers and the body went out in two writes, and with Nagle's algorithm on, the body waited
for the client's delayed ACK. The server now sets ``TCP_NODELAY`` (p50 about 1 ms).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
PROJECT = "forja-sandbox"
ZONE = "us-east1-d"


def start_emulator(backlog: int, folder: Path) -> tuple[subprocess.Popen[str], str, Path]:
    """The emulator in its own process; (process, base URL, key file)."""
    key = folder / f"sa-{backlog}.json"
    command = [sys.executable, "-m", "forja_sandbox.compute_emulator"]
    proc = subprocess.Popen(
        [*command, "--listen-backlog", str(backlog), "--key-out", str(key)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    base_url = proc.stdout.readline().strip()
    proc.stdout.readline()  # token_uri line
    return proc, base_url, key


def access_token(key: Path) -> str:
    """One OAuth token through the emulator's token endpoint, as any service-account client gets."""
    from google.auth.transport.requests import Request
    from google.oauth2 import service_account

    creds = service_account.Credentials.from_service_account_file(
        str(key), scopes=["https://www.googleapis.com/auth/compute"]
    )
    creds.refresh(Request())
    return str(creds.token)


def one_round(base_url: str, token: str, clients: int, total: int, keep_alive: bool) -> list[float]:
    """`clients` threads released together, `total` calls in all; each call's latency in seconds."""
    url = urlsplit(base_url)
    path = f"{url.path}projects/{PROJECT}/zones/{ZONE}/instances"
    headers = {"Authorization": f"Bearer {token}"}
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)
    per_client = max(1, total // clients)

    def client() -> None:
        mine: list[float] = []
        conn: http.client.HTTPConnection | None = None
        barrier.wait()
        for _ in range(per_client):
            started = time.perf_counter()
            if conn is None:
                conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
            if not keep_alive:
                conn.close()
                conn = None
            mine.append(time.perf_counter() - started)
        if conn is not None:
            conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=640, help="calls per round (default 640)")
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--backlogs", type=int, nargs="+", default=[5, 1024], help="5 was Python's default")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="emulator-bench-") as tmp:
        for backlog in args.backlogs:
            proc, base_url, key = start_emulator(backlog, Path(tmp))
            try:
                token = access_token(key)
                one_round(base_url, token, 4, 40, True)  # warm up: imports, routing table, threads
                for clients in args.clients:
                    for mode in ("new", "keep"):
                        started = time.perf_counter()
                        lat = one_round(base_url, token, clients, args.requests, mode == "keep")
                        wall = time.perf_counter() - started
                        rows.append((backlog, clients, mode, lat, wall))
                        print(f"  backlog {backlog}, {clients} clients, {mode}: done", file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(timeout=30)

    heads = ("backlog", "clients", "conn", "calls", "p50 ms", "p99 ms", "max ms", "call/s")
    print("".join(f"{h:>{w}}" for h, w in zip(heads, (8, 8, 6, 7, 9, 9, 9, 8), strict=True)))
    for backlog, clients, mode, lat, wall in rows:
        print(
            f"{backlog:>8}{clients:>8}{mode:>6}{len(lat):>7}"
            f"{statistics.median(lat) * 1000:>9.1f}{percentile(lat, 0.99) * 1000:>9.1f}"
            f"{max(lat) * 1000:>9.1f}{len(lat) / wall:>8.0f}"
        )
    print(json.dumps({"note": "one emulator process per backlog; new = a TCP connection per call"}))


if __name__ == "__main__":
    main()
