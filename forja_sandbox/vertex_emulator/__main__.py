"""Run the emulator as a process: `python -m forja_sandbox.vertex_emulator --port P --work-dir D`.

Prints its URL (the client's ``api_endpoint``) and serves until SIGINT/SIGTERM, which cancel every
job still going first.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import threading
from pathlib import Path

from .emulator import VertexEmulator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m forja_sandbox.vertex_emulator", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default: any free port)")
    parser.add_argument("--work-dir", type=Path, help="where replica logs go (default: a temporary folder)")
    parser.add_argument("--test-host", type=int, action="append", default=[], metavar="N",
                        help="run replicas on test host thN (booted with the Deep Learning VM image; repeat "
                             "it for more hosts; default: local processes)")  # fmt: skip
    parser.add_argument("--image", action="append", default=[], metavar="URI=COMMAND",
                        help="the entrypoint a container of image URI runs when the job gives no command "
                             "(the emulator pulls no image), e.g. "
                             "--image us-docker.pkg.dev/p/r/train:1='python3 /app/train.py'; repeat it per "
                             "image",
                        )  # fmt: skip
    args = parser.parse_args(argv)
    images = {}
    for given in args.image:
        uri, sep, command = given.partition("=")
        if not sep or not uri or not command.strip():
            parser.error(f"--image {given!r}: give URI=COMMAND")
        images[uri] = shlex.split(command)
    hosts: tuple = ()
    if args.test_host:
        from forja_sandbox import testhosts

        hosts = tuple(testhosts.up(n, image="dlvm") for n in args.test_host)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with VertexEmulator(args.host, args.port, args.work_dir, hosts, images) as emulator:
        print(emulator.url, flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
