"""The sandbox cloud as a background service: the Compute emulator bound to real local hosts.

`ensure_running()` starts it: `make sandbox`, `forja sandbox up`, `python -m forja_sandbox.service
ensure` and the tests' fixtures call it; no inventory does (an inventory lists hosts, it starts no
daemon). Its endpoint is fixed, so inventory/sandbox states it as plain variables (`endpoint()` is
what they must equal; a test checks it). The emulator keeps its instances in a state file and its
host bindings beside it, so stopping and starting the service keeps the "cloud" as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forja_sandbox import testhosts
from forja_sandbox.files import write_atomically
from forja_sandbox.ports import address_port, iap_port, metadata_port, port, storage_port

PROJECT = "forja-sandbox"
POLL_S = 2.0


class _UnderRoot:
    """An attribute of `SandboxPaths`: the file (or folder) `name` under its root."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, paths: SandboxPaths | None, owner: type | None = None) -> Path:
        if paths is None:
            raise AttributeError(f"{self.name} is a path under a SandboxPaths' root")
        return paths.root / self.name


@dataclass(frozen=True)
class SandboxPaths:
    """Where the sandbox keeps its state, outside the checkout: `root`, and each file under it."""

    root: Path
    state = _UnderRoot("compute-state.json")
    bindings = _UnderRoot("host-bindings.json")
    key = _UnderRoot("service-account.json")
    pid = _UnderRoot("emulator.pid")
    boot_over = _UnderRoot("boot-over.json")
    log = _UnderRoot("emulator.log")
    info = _UnderRoot("endpoint.json")
    #: The storage emulator's buckets and objects (they outlive a service restart).
    storage = _UnderRoot("storage")


def paths() -> SandboxPaths:
    root = Path(os.environ.get("FORJA_SANDBOX_DIR") or testhosts.base_dir() / "sandbox")
    return SandboxPaths(root)


def host_slots() -> tuple[int, int]:
    """The test hosts the sandbox's VMs may take, first and last: th10 … th19, or FORJA_SANDBOX_HOSTS
    ("50-59"), which keeps a second sandbox (the test suite's) off the hosts of the machine's own."""
    from forja_sandbox.backend import FIRST_INDEX, LAST_INDEX

    value = os.environ.get("FORJA_SANDBOX_HOSTS")
    if not value:
        return FIRST_INDEX, LAST_INDEX
    first, sep, last = value.partition("-")
    if not (sep and first.isdigit() and last.isdigit() and 1 <= int(first) <= int(last) <= 200):
        raise ValueError(f"FORJA_SANDBOX_HOSTS={value!r}: give the first and last host index, e.g. 50-59")
    return int(first), int(last)


def base_url(p: int | None = None) -> str:
    return f"http://127.0.0.1:{p or port()}/compute/v1/"


def oslogin_url(p: int | None = None) -> str:
    """The emulator's OS Login API (compute_emulator/oslogin.py), beside its Compute API."""
    return f"http://127.0.0.1:{p or port()}/oslogin/v1/"


def metadata_url(p: int | None = None) -> str:
    """What a sandbox VM uses for http://metadata.google.internal/computeMetadata/v1: the host's
    address on the hosts' bridge, which every sandbox VM routes to."""
    return f"http://{testhosts.net_prefix()}.1:{metadata_port(p)}/computeMetadata/v1"


def address_url(p: int | None = None) -> str:
    """Where the gcp_instance role detects the controller's address for direct SSH (forja_sandbox/
    address_echo.py: the address the sandbox's VMs see this machine at, the bridge's)."""
    return f"http://127.0.0.1:{address_port(p)}/"


def storage_url(p: int | None = None, bridge: bool = False) -> str:
    """STORAGE_EMULATOR_HOST for google-cloud-storage: on 127.0.0.1 for the controller, on the hosts'
    bridge (`bridge=True`) for the sandbox's VMs (a relay there, once a host has made the bridge)."""
    host = f"{testhosts.net_prefix()}.1" if bridge else "127.0.0.1"
    return f"http://{host}:{storage_port(p)}"


def _alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def answers(url: str) -> bool:
    """Whether a Compute emulator answers at `url` (any status below 500): the one that serves, not a
    port some other process holds."""
    try:
        with urllib.request.urlopen(url + "projects/" + PROJECT + "/zones", timeout=2) as resp:
            return resp.status < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500  # 401 without a token still means it is up
    except OSError:
        return False


def ensure_running(timeout_s: float = 60.0, faults: list[dict[str, Any]] | None = None) -> dict[str, str]:
    """Start the sandbox service unless it runs; return its endpoint (URL, key file, project).

    A lock makes concurrent callers (several ansible-playbook runs, pytest workers) start one
    service, and only the process that bound the port writes the pid file (see `serve`), so
    `stop_service` always stops the emulator that answers, never a loser of the race. `faults`
    (`Faults.add` keyword sets, as FORJA_SANDBOX_FAULTS) are injected into a service started here,
    for failure drills; a service that already runs keeps its own.
    """
    testhosts.refuse_in_check_tier("started the sandbox service")
    sp = paths()
    sp.root.mkdir(parents=True, exist_ok=True)
    os.chmod(sp.root, 0o700)
    url = base_url()
    with open(sp.root / "service.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not answers(url):
            testhosts.ensure_golden()
            env = dict(os.environ)
            if faults is not None:
                env["FORJA_SANDBOX_FAULTS"] = json.dumps(faults)
            with open(sp.log, "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "forja_sandbox.service", "serve", "--port", str(port())],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True, env=env,
                )
            deadline = time.monotonic() + timeout_s
            while not answers(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the sandbox emulator did not start; see {sp.log}")
                time.sleep(0.1)
    info = endpoint()
    sp.info.write_text(json.dumps(info))
    return info


def endpoint() -> dict[str, str]:
    """How to reach the sandbox: the Compute API, its key, the project, and the guests' metadata server."""
    return {"api_url": base_url(), "credentials_file": str(paths().key), "project": PROJECT,
            "metadata_url": metadata_url(), "storage_url": storage_url()}


def inject_fault(**rule: Any) -> None:
    """Add a fault to the running service's emulator (`Faults.add`'s keywords), e.g. a zone's stock-out
    for a drill: `inject_fault(method="instances.start", error="ZONE_RESOURCE_POOL_EXHAUSTED", zone=z)`."""
    from forja_sandbox.compute_emulator.server import FAULTS_PATH

    request = urllib.request.Request(f"http://127.0.0.1:{port()}{FAULTS_PATH}", method="POST",
                                     data=json.dumps(rule).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        resp.read()


def _control(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One call of the running service's emulator control paths (not a Google API; loopback)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port()}{path}", method=method, data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read() or b"{}")


def clear_faults() -> None:
    """Forget every fault rule of the running service's emulator."""
    from forja_sandbox.compute_emulator.server import FAULTS_PATH

    _control("DELETE", FAULTS_PATH)


def set_advice(**keywords: Any) -> dict[str, Any]:
    """Set what the running service's capacity advisor answers (`ComputeEmulator.set_advice`'s
    keywords, the project by default the sandbox's), e.g. `set_advice(zone="us-east1-b",
    machine_type="g2-standard-8", obtainability=0.1, estimated_uptime="60s")`; no keywords but
    `clear=True` forgets every score."""
    from forja_sandbox.compute_emulator.server import ADVICE_PATH

    if keywords.pop("clear", False):
        return dict(_control("DELETE", ADVICE_PATH))
    return dict(_control("PUT", ADVICE_PATH, {"project": PROJECT, **keywords}))


def boot_over(layers: dict[str, Path] | None) -> None:
    """Boot the sandbox's new VMs of an image (`dlvm`, `golden`) over a cached layer from now on
    (forja_sandbox/hostlayers.py), or, with None, over none again (the default). For tests whose VMs'
    install is not what they test; the running service reads it at each create (a started VM keeps
    its own disk's layers)."""
    sp = paths()
    if not layers:
        sp.boot_over.unlink(missing_ok=True)
        return
    missing = [f"{image}: {layer}" for image, layer in layers.items() if not Path(layer).is_dir()]
    if missing:
        raise FileNotFoundError(f"no such layer to boot over: {', '.join(missing)}")
    write_atomically(sp.boot_over, json.dumps({image: str(layer) for image, layer in layers.items()}))


def stop_service() -> None:
    """Stop the emulator process; instances and hosts stay as they are."""
    sp = paths()
    pid = _alive(sp.pid)
    if pid:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            if _alive(sp.pid) is None:
                break
            time.sleep(0.1)
    sp.pid.unlink(missing_ok=True)


def destroy() -> None:
    """Remove the whole sandbox: the emulator, every instance's host, the saved state and the buckets."""
    from forja_sandbox.backend import TestHostBackend

    stop_service()
    sp = paths()
    TestHostBackend(sp.bindings).remove_all()
    for f in (sp.state, sp.bindings, sp.info, sp.boot_over):
        f.unlink(missing_ok=True)
    shutil.rmtree(sp.storage, ignore_errors=True)


def describe() -> dict[str, object]:
    """Whether the service runs, and each instance's host (for `forja sandbox status`)."""
    from forja_sandbox.backend import TestHostBackend

    sp = paths()
    running = bool(_alive(sp.pid) and answers(base_url()))
    rows = [
        {"instance": key, "host": f"th{index}", "address": testhosts.address(index),
         "up": testhosts.is_up(index)}
        for key, index in sorted(TestHostBackend(sp.bindings).bindings().items())
    ]
    return {"running": running, "api_url": base_url(), "instances": rows}


def _watch_guest_poweroff(emulator, backend, stop: threading.Event) -> None:  # type: ignore[no-untyped-def]
    """A guest that powers itself off ends its host; mark the instance TERMINATED, as GCE does."""
    while not stop.wait(POLL_S):
        with contextlib.suppress(Exception):
            for inst in emulator.instances_with_status("RUNNING"):
                if backend.index_of(inst) is not None and not backend.is_running(inst):
                    emulator.guest_powered_off(inst)


def _serve_metadata(emulator, p: int, stop: threading.Event) -> None:  # type: ignore[no-untyped-def]
    """Serve the guests' metadata server on the hosts' bridge once it exists (the first host makes it).

    Bound to the bridge address only, never to every interface: only sandbox VMs reach it, and it
    answers only a RUNNING instance calling from its own address.
    """
    from forja_sandbox.compute_emulator.metadata_server import MetadataServer

    server = None
    while server is None and not stop.is_set():
        try:
            server = MetadataServer(emulator.api, f"{testhosts.net_prefix()}.1", metadata_port(p)).start()
        except OSError:  # no bridge yet (no host booted), or the port is taken: try again later
            stop.wait(POLL_S)
    stop.wait()
    if server is not None:
        server.stop()


def _serve_storage_on_bridge(p: int, stop: threading.Event) -> None:
    """Relay the storage emulator to the hosts' bridge once it exists, as _serve_metadata does: the
    sandbox's VMs reach it there, and nothing else but 127.0.0.1 does."""
    from forja_sandbox.storage_emulator import BridgeRelay

    relay = None
    while relay is None and not stop.is_set():
        try:
            relay = BridgeRelay(f"{testhosts.net_prefix()}.1", storage_port(p),
                                ("127.0.0.1", storage_port(p))).start()
        except OSError:  # no bridge yet (no host booted), or the port is taken: try again later
            stop.wait(POLL_S)
    stop.wait()
    if relay is not None:
        relay.stop()


def serve(p: int) -> None:
    """Run the emulator bound to test hosts until SIGTERM.

    FORJA_SANDBOX_FAULTS (a JSON list of `Faults.add` keyword sets) injects failures for drills.
    """
    from forja_sandbox.address_echo import AddressEcho
    from forja_sandbox.backend import TestHostBackend
    from forja_sandbox.compute_emulator import ComputeEmulator
    from forja_sandbox.iap import IapStandIn
    from forja_sandbox.storage_emulator import StorageEmulator

    sp = paths()
    # As on GCE: the hosts enforce the project's firewall rules (forja_sandbox/firewall.py), and SSH
    # keys reach them only through metadata, read by the guest-agent stand-in (guest_agent/).
    first, last = host_slots()
    backend = TestHostBackend(sp.bindings, first=first, last=last, enforce_firewall=True,
                              metadata_url=metadata_url(p), boot_over_file=sp.boot_over)
    emulator = ComputeEmulator(host="127.0.0.1", port=p, backend=backend, projects=(PROJECT,),
                               state_file=sp.state)
    sp.pid.write_text(str(os.getpid()))  # only once the port is ours: a loser of a race exits above
    # Cloud Storage answers before the Compute API does, so whoever ensure_running() lets go finds both.
    storage = StorageEmulator(port=storage_port(p), data_dir=sp.storage).start()
    for fault in json.loads(os.environ.get("FORJA_SANDBOX_FAULTS") or "[]"):
        emulator.faults.add(**fault)  # failure drills, e.g. a stock-out on the first insert
    emulator.start()
    if not sp.key.exists():
        emulator.write_service_account_key(sp.key)
    else:
        emulator.load_service_account_key(sp.key)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    watcher = threading.Thread(target=_watch_guest_poweroff, args=(emulator, backend, done), daemon=True)
    watcher.start()
    threading.Thread(target=_serve_metadata, args=(emulator, p, done), daemon=True).start()
    threading.Thread(target=_serve_storage_on_bridge, args=(p, done), daemon=True).start()
    iap = IapStandIn(emulator.instance, port=iap_port(p)).start()
    echo = AddressEcho(f"{testhosts.net_prefix()}.1", port=address_port(p)).start()
    print(f"forja sandbox: Compute emulator at {emulator.base_url}", flush=True)
    done.wait()
    iap.stop()
    echo.stop()
    storage.stop()
    emulator.stop()
    with contextlib.suppress(OSError):
        if sp.pid.read_text().strip() == str(os.getpid()):
            sp.pid.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m forja_sandbox.service")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, default=port())
    sub.add_parser("ensure")
    sub.add_parser("check")
    sub.add_parser("stop")
    sub.add_parser("destroy")
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        serve(args.port)
    elif args.cmd == "ensure":
        print(json.dumps(ensure_running()))
    elif args.cmd == "check":
        url = base_url()
        if not (_alive(paths().pid) and answers(url)):
            print("the sandbox is not running; start it with `forja sandbox up`", file=sys.stderr)
            return 1
        print(json.dumps(endpoint()))
    elif args.cmd == "stop":
        stop_service()
    else:
        destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
