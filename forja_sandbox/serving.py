"""How the sandbox's local services run: started, stopped, and used in a ``with`` block between.

Every stand-in here (the emulators, the guests' metadata server, the IAP stand-in, the address echo,
the storage relay, the Hub stand-in) is a `Service`; those that are a socket server of this process
serve it on a daemon thread of their own (`ServedOnThread`), and two of them relay bytes between
sockets (`relay`). A process started for a while (the storage emulator, an ssh tunnel) ends as
`end_process` ends it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import subprocess
import threading
import time
from typing import Any, TypeVar

S = TypeVar("S", bound="Service")
T = TypeVar("T", bound="ServedOnThread")
#: How long stop() waits for a server's loop, then for its thread, to end.
STOP_TIMEOUT_S = 5.0
#: One read of a relay.
CHUNK = 65536


class Service:
    """Something started and stopped; ``with service:`` starts it and stops it at the block's end."""

    def start(self: S) -> S:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: S) -> S:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServedOnThread(Service, socketserver.BaseServer):
    """A socket server that serves on a daemon thread of its own from start() until stop().

    stop() also closes the server (its port is free again), and does not wait for the loop's next
    poll: it connects to the server's own address until the loop has noticed (so a service's stop,
    hence every test's teardown, takes milliseconds instead of up to a poll interval).
    """

    #: The serving thread's name (what a thread dump shows).
    thread_name = "server"
    #: How often the loop looks for a stop request when nothing wakes it (socketserver's default).
    poll_interval = 0.5
    _thread: threading.Thread | None = None

    @property
    def serving(self) -> bool:
        return self._thread is not None

    def start(self: T) -> T:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.serve_forever,
                name=self.thread_name,
                kwargs={"poll_interval": self.poll_interval},
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            stopper = threading.Thread(target=self.shutdown, name=f"{self.thread_name}-stop", daemon=True)
            stopper.start()
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while stopper.is_alive() and time.monotonic() < deadline:
                self._poke()  # wake the accept loop now instead of at its next poll
                stopper.join(0.02)
            self._thread.join(timeout=STOP_TIMEOUT_S)
            self._thread = None
        self.server_close()

    def _poke(self) -> None:
        host, port = self.server_address[:2]
        host = "127.0.0.1" if host in ("0.0.0.0", "") else str(host)
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=0.5):
            pass


def pump(src: socket.socket | int, dst: socket.socket | int) -> None:
    """Copy bytes one way until EOF, then half-close the other side (ssh needs the EOF to pass)."""
    try:
        while True:
            data = src.recv(CHUNK) if isinstance(src, socket.socket) else os.read(src, CHUNK)
            if not data:
                break
            if isinstance(dst, socket.socket):
                dst.sendall(data)
            else:
                view = memoryview(data)
                while view:
                    view = view[os.write(dst, view):]
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            if isinstance(dst, socket.socket):
                dst.shutdown(socket.SHUT_WR)
            else:
                os.close(dst)


def relay(here: socket.socket | int, there: socket.socket | int) -> None:
    """Copy bytes both ways (`there` to `here` on a thread of its own) until both directions ended."""
    back = threading.Thread(target=pump, args=(there, here), daemon=True)
    back.start()
    pump(here, there)
    back.join()


def end_process(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within `grace_s`; returns once it has."""
    if proc.poll() is not None:
        return
    proc.terminate()  # Popen's signals do nothing to a process that has already exited
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
