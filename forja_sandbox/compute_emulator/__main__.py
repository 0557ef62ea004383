"""Run the emulator as a process: `python -m forja_sandbox.compute_emulator --port P --state FILE`.

Prints the API base URL (first line) and the token URI, then serves until SIGINT/SIGTERM; the
state file keeps instances, firewalls, keys and tokens across restarts.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from ..emulator_http import LISTEN_BACKLOG
from .emulator import DEFAULT_PROJECT, ComputeEmulator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m forja_sandbox.compute_emulator", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default: any free port)")
    parser.add_argument("--state", type=Path, help="JSON file that keeps the state across restarts")
    parser.add_argument("--key-out", type=Path, help="write a service-account key (0600) for this emulator")
    parser.add_argument(
        "--project", action="append", help=f"project to serve (repeatable; default {DEFAULT_PROJECT})"
    )
    parser.add_argument("--operation-delay", type=float, default=0.0, help="seconds per operation step")
    parser.add_argument(
        "--listen-backlog",
        type=int,
        default=LISTEN_BACKLOG,
        help=f"connections queued before accept (default {LISTEN_BACKLOG}; Python's own is 5)",
    )
    args = parser.parse_args(argv)

    emulator = ComputeEmulator(
        host=args.host,
        port=args.port,
        projects=tuple(args.project or (DEFAULT_PROJECT,)),
        state_file=args.state,
        operation_delay_s=args.operation_delay,
        listen_backlog=args.listen_backlog,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    emulator.start()
    if args.key_out:
        emulator.write_service_account_key(args.key_out)
    print(emulator.base_url, flush=True)
    print(f"token_uri {emulator.token_uri}", flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
