"""How fast the gcp_gpu inventory lists a big fleet, side by side with google.cloud's gcp_compute.

Run on demand: `python bench/inventory_bench.py [--instances 5000] [--zones 20] [--no-gcp-compute]`.
It starts the local Compute emulator, seeds N VMs spread over Z zones, and measures end to end
(`ansible-inventory --list`, a fresh process each time):
- gcp_gpu straight to the emulator (http), without a cache, then on a cache miss and a cache hit;
- gcp_gpu and gcp_compute through the same local TLS proxy, as both reach Google: HTTPS to
  compute.googleapis.com / www.googleapis.com and oauth2.googleapis.com. gcp_compute has no endpoint
  option, so the proxy (HTTPS_PROXY, a throwaway CA in REQUESTS_CA_BUNDLE) terminates TLS for those
  names and forwards to the emulator; it counts TLS handshakes and requests per name;
- the inventory load alone (Ansible's InventoryManager in this process, no JSON dump) and the
  client's listing alone.
gcp_compute is google.cloud 1.10.2 from the `ansible` 12.3.0 wheel (`pip download ansible==12.3.0
--no-deps`, cached with its extracted collection under ~/.cache/forja).
Goals (issue 14): one token request per run, ⌈n/500⌉ list requests per project, a cache hit under
1 s end to end, listing ≥ 5× faster than gcp_compute. Prints one table; nothing here is a test.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import math
import os
import resource
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
sys.path.insert(0, str(ROOT))

PROJECT = "forja-sandbox"
ANSIBLE_WHEEL = "ansible-12.3.0-py3-none-any.whl"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "forja"
#: Google's names that the proxy answers for the emulator: the Compute API (both spellings the two
#: plugins use) and the token endpoint google-auth posts to. Anything else gets a 404 (and is counted).
COMPUTE_HOSTS = ("compute.googleapis.com", "www.googleapis.com")
TOKEN_HOST = "oauth2.googleapis.com"


# -- google.cloud from the ansible wheel ---------------------------------------------------------
def google_cloud_collections() -> Path:
    """A collections path holding google.cloud as the `ansible` 12.3.0 wheel ships it (extracted once)."""
    target = CACHE / "google.cloud-from-ansible-12.3.0"
    if (target / "ansible_collections/google/cloud/plugins/inventory/gcp_compute.py").is_file():
        return target
    wheel = CACHE / "wheels" / ANSIBLE_WHEEL
    if not wheel.is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "ansible==12.3.0",
                "--no-deps",
                "-d",
                str(wheel.parent),
            ],
            check=True,
        )
    prefix = "ansible_collections/google/cloud/"
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith(prefix) and not name.endswith("/"):
                archive.extract(name, target)
    return target


# -- a throwaway CA and a TLS-terminating proxy ---------------------------------------------------
class ThrowawayCA:
    """A CA made for this run (never trusted outside it) and one server certificate per name."""

    def __init__(self, folder: Path) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._x509, self._hashes, self._serialization, self._ec, self._oid = (
            x509, hashes, serialization, ec, NameOID,
        )  # fmt: skip
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "forja inventory bench throwaway CA")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.bundle = folder / "ca.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    def context(self, host: str) -> ssl.SSLContext:
        """The server-side TLS context for `host`, its certificate signed by this CA."""
        with self._lock:
            if host not in self._contexts:
                self._contexts[host] = self._make_context(host)
            return self._contexts[host]

    def _make_context(self, host: str) -> ssl.SSLContext:
        x509, serialization, ec = self._x509, self._serialization, self._ec
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(self._oid.COMMON_NAME, host)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, self._hashes.SHA256())
        )
        pem = self.folder / f"{host}.pem"
        pem.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            + cert.public_bytes(serialization.Encoding.PEM)
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pem)
        return context


class InterceptingProxy(socketserver.ThreadingTCPServer):
    """An HTTPS proxy on loopback that answers CONNECT to Google's API names itself.

    Each tunnel is a TLS session with a certificate from the throwaway CA; the HTTP requests inside
    are forwarded to the emulator (plain HTTP, kept alive). Counts handshakes and requests per name.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, ca: ThrowawayCA, emulator_url: str) -> None:
        super().__init__(("127.0.0.1", 0), _ConnectHandler)
        self.ca = ca
        self.upstream = urlsplit(emulator_url)
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, name="bench-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()

    def __enter__(self) -> InterceptingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


class _ConnectHandler(socketserver.StreamRequestHandler):
    server: InterceptingProxy

    def handle(self) -> None:
        method, target, _version = self.rfile.readline(65537).decode("latin-1").split(" ", 2)
        while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
            pass
        if method != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        host = target.rsplit(":", 1)[0]
        self.server.count(f"CONNECT {host}")
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        try:
            tls = self.server.ca.context(host).wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError):
            self.server.count("handshake failed")
            return
        self.server.count("TLS handshakes")
        _Forward(tls, self.client_address, self.server, host)


class _Forward(BaseHTTPRequestHandler):
    """The HTTP requests inside one tunnel, each forwarded to the emulator."""

    protocol_version = "HTTP/1.1"
    server: InterceptingProxy

    def __init__(self, tls: ssl.SSLSocket, address: tuple[str, int], server: InterceptingProxy, host: str):
        self.host = host
        self.upstream: http.client.HTTPConnection | None = None
        super().__init__(tls, address, server)  # handles every request of the connection, then returns

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the counts are the report."""

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def _forward(self) -> None:
        self.server.count(f"{self.command} {self.host}")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.host not in (*COMPUTE_HOSTS, TOKEN_HOST):
            payload = json.dumps({"error": {"code": 404, "message": f"{self.host} is not emulated"}}).encode()
            self._answer(404, [("Content-Type", "application/json")], payload)
            return
        path = "/token" if self.host == TOKEN_HOST else self.path
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        if self.upstream is None:
            self.upstream = http.client.HTTPConnection(
                self.server.upstream.hostname, self.server.upstream.port
            )
        self.upstream.request(self.command, path, body=body or None, headers=headers)
        reply = self.upstream.getresponse()
        data = reply.read()
        drop = ("transfer-encoding", "connection", "content-length", "keep-alive")
        self._answer(reply.status, [(k, v) for k, v in reply.getheaders() if k.lower() not in drop], data)

    def _answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


# -- the fleet, the configs, the measurements -----------------------------------------------------
def seed(emulator, instances: int, zones: int) -> list[str]:
    """Spread the instances evenly over the first `zones` zones of the emulator's catalog."""
    from forja_sandbox.compute_emulator.catalog import ZONES

    chosen = sorted(ZONES)[:zones]
    per_zone = math.ceil(instances / len(chosen))
    left = instances
    for index, zone in enumerate(chosen):
        count = min(per_zone, left)
        if count <= 0:
            break
        emulator.seed_instances(PROJECT, zone, count, f"vm{index}", {"forja": "managed"})
        left -= count
    return chosen


def write_config(path: Path, cache_dir: Path | None = None, **options: object) -> Path:
    config: dict[str, object] = {"plugin": "forja.gpu.gcp_gpu", "projects": [PROJECT], **options}
    if cache_dir is not None:
        config |= {
            "cache": True,
            "cache_plugin": "ansible.builtin.jsonfile",
            "cache_connection": str(cache_dir),
            "cache_timeout": 3600,
        }
    path.write_text(json.dumps(config) + "\n")  # JSON is YAML
    return path


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def measure(
    emulator, proxy: InterceptingProxy, action: Callable[[], tuple[float, float] | None]
) -> dict[str, float]:
    """Wall time, the CPU time of the ansible process (or of this thread), and what was asked.

    CPU time is reported next to wall time because this machine is shared: the wall time grows
    with the load average, the CPU time much less. It excludes the emulator and the proxy. An
    action that times itself (the load-only runs) returns its own (wall, CPU).
    """
    emulator.stats_reset()
    proxy.reset()
    start = time.perf_counter()
    children, own = cpu_seconds(resource.RUSAGE_CHILDREN), time.thread_time()
    timed = action()
    wall = time.perf_counter() - start
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - children + time.thread_time() - own
    if timed is not None:
        wall, cpu = timed
    stats, counts = emulator.stats, proxy.counts
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "requests": stats["requests"],
        "list_requests": stats["by_method"].get("compute.instances.aggregatedList", 0),
        "token_requests": stats["token_requests"],
        "handshakes": counts["TLS handshakes"],
        "other": sum(
            n
            for k, n in counts.items()
            if k.startswith(("GET ", "POST ")) and not k.endswith((*COMPUTE_HOSTS, TOKEN_HOST))
        ),
    }


def run_cli(config: Path, env: dict[str, str], hosts: int) -> None:
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-inventory"), "-i", str(config), "--list"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    found = len(json.loads(proc.stdout or "{}").get("_meta", {}).get("hostvars", {}))
    if proc.returncode != 0 or found != hosts:
        raise SystemExit(
            f"ansible-inventory found {found} hosts (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
        )


def floor_source(folder: Path, listing: str) -> Path:
    """A script inventory that prints `listing` (an `ansible-inventory --list` output): no plugin work."""
    data = folder / "listing.json"
    data.write_text(listing)
    script = folder / "floor.py"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(data)!r}).read())\n")
    script.chmod(0o700)
    return script


def listing_of(config: Path, env: dict[str, str]) -> str:
    """The plain values of a listing (without ansible-core's untrusted-value markers)."""
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-inventory"), "-i", str(config), "--list"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    from forja.inventory import plain

    return json.dumps(plain(json.loads(proc.stdout)))


#: Ansible's inventory load alone (the plugin's import and parse, no JSON dump), timed by the process.
LOAD_ONLY = """
import json, sys, time
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader()
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
wall, cpu = time.perf_counter(), time.process_time()
inventory = InventoryManager(loader=DataLoader(), sources=[sys.argv[1]])
print(json.dumps([time.perf_counter() - wall, time.process_time() - cpu, len(inventory.hosts)]))
"""


def load_only(config: Path, env: dict[str, str], hosts: int) -> tuple[float, float]:
    """(wall, CPU) of loading the inventory in a fresh process, without ansible-inventory's dump."""
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-c", LOAD_ONLY, str(config)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    wall, cpu, found = (
        json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else (0, 0, -1)
    )
    if found != hosts:
        raise SystemExit(
            f"loading {config} found {found} hosts (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=5000)
    parser.add_argument("--zones", type=int, default=20)
    parser.add_argument("--no-gcp-compute", action="store_true", help="skip google.cloud's gcp_compute")
    args = parser.parse_args()

    from ansible.plugins.loader import init_plugin_loader

    # What the ansible CLIs do first (and what loads cache plugins by their FQCN), with forja.gpu
    # found in the clone as ansible.cfg finds it.
    init_plugin_loader([str(ROOT / "collections")])
    from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import GcpClient, GcpConfig

    from forja_sandbox.compute_emulator import ComputeEmulator

    google_cloud = None if args.no_gcp_compute else google_cloud_collections()
    with (
        tempfile.TemporaryDirectory(prefix="forja-inv-bench-") as tmp,
        ComputeEmulator() as emulator,
        InterceptingProxy(ThrowawayCA(Path(tmp)), emulator.url) as proxy,
    ):
        tmpdir = Path(tmp)
        key = emulator.write_service_account_key(tmpdir / "key.json")
        # The same service account, its token_uri Google's: through the proxy, as on GCP.
        google_key = tmpdir / "google-key.json"
        google_key.write_text(
            json.dumps({**json.loads(key.read_text()), "token_uri": f"https://{TOKEN_HOST}/token"})
        )
        google_key.chmod(0o600)
        zones = seed(emulator, args.instances, args.zones)
        base = {k: v for k, v in os.environ.items() if not k.upper().endswith("_PROXY")}
        env = {
            **base,
            "FORJA_GCP_API_URL": emulator.base_url,
            "FORJA_GCP_CREDENTIALS_FILE": str(key),
            "NO_PROXY": "127.0.0.1,localhost",
        }
        os.environ.update(
            {k: env[k] for k in ("FORJA_GCP_API_URL", "FORJA_GCP_CREDENTIALS_FILE", "NO_PROXY")}
        )
        proxied = {
            **base,
            "HTTPS_PROXY": proxy.url,
            "https_proxy": proxy.url,
            "REQUESTS_CA_BUNDLE": str(proxy.ca.bundle),
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "GCE_METADATA_HOST": "127.0.0.1:9",  # never ask a metadata server
        }
        plain = write_config(tmpdir / "plain.gcp_gpu.yml")
        cached = write_config(tmpdir / "cached.gcp_gpu.yml", tmpdir / "cache")
        via_proxy = write_config(
            tmpdir / "proxied.gcp_gpu.yml",
            api_url=f"https://{COMPUTE_HOSTS[0]}/compute/v1/",
            credentials_file=str(google_key),
        )
        n = args.instances

        def client_listing() -> None:
            client = GcpClient(GcpConfig(project=PROJECT))
            assert len(client.aggregated_instances(PROJECT)) == n

        floor = floor_source(tmpdir, listing_of(plain, env))
        floor_env = {**env, "ANSIBLE_INVENTORY_ENABLED": "script"}
        rows = [
            ("client listing only (GcpClient)", measure(emulator, proxy, client_listing)),
            ("gcp_gpu, no cache", measure(emulator, proxy, lambda: run_cli(plain, env, n))),
            ("gcp_gpu, cache miss", measure(emulator, proxy, lambda: run_cli(cached, env, n))),
            ("gcp_gpu, cache hit", measure(emulator, proxy, lambda: run_cli(cached, env, n))),
            (
                "floor: the same hosts from a script",
                measure(emulator, proxy, lambda: run_cli(floor, floor_env, n)),
            ),
            ("gcp_gpu load only, no cache", measure(emulator, proxy, lambda: load_only(plain, env, n))),
            ("gcp_gpu load only, cache hit", measure(emulator, proxy, lambda: load_only(cached, env, n))),
            (
                "gcp_gpu via TLS proxy, no cache",
                measure(emulator, proxy, lambda: run_cli(via_proxy, proxied, n)),
            ),
            (
                "gcp_gpu load only via TLS proxy",
                measure(emulator, proxy, lambda: load_only(via_proxy, proxied, n)),
            ),
        ]
        if google_cloud is not None:
            compute = tmpdir / "anchor.gcp_compute.yml"
            compute.write_text(
                json.dumps(
                    {
                        "plugin": "google.cloud.gcp_compute",
                        "projects": [PROJECT],
                        "auth_kind": "serviceaccount",
                        "service_account_file": str(google_key),
                        "hostnames": ["name"],
                    }
                )
            )
            anchor_env = {
                **proxied,
                "ANSIBLE_COLLECTIONS_PATH": f"{ROOT / 'collections'}:{google_cloud}",
                "ANSIBLE_INVENTORY_ENABLED": "google.cloud.gcp_compute",
            }
            rows.append(
                (
                    "gcp_compute via TLS proxy, no cache",
                    measure(emulator, proxy, lambda: run_cli(compute, anchor_env, n)),
                )
            )
            rows.append(
                (
                    "gcp_compute load only via TLS proxy",
                    measure(emulator, proxy, lambda: load_only(compute, anchor_env, n)),
                )
            )

    goal_lists = math.ceil(n / 500)
    print(
        f"\nInventory of {n} instances in {len(zones)} zones, 1 project, `ansible-inventory --list` unless "
        f"'load only'\n(goals: 1 token and {goal_lists} list requests per run; cache hit < 1 s; "
        "≥ 5× faster than gcp_compute)\n"
    )
    header = (
        f"{'case':<38} {'wall s':>7} {'CPU s':>6} {'API req':>8} {'list req':>8} {'token req':>9} "
        f"{'TLS hs':>7} {'other':>6}"
    )
    print(header)
    print("-" * len(header))
    for name, row in rows:
        print(
            f"{name:<38} {row['wall_s']:>7.2f} {row['cpu_s']:>6.2f} {row['requests']:>8} "
            f"{row['list_requests']:>8} {row['token_requests']:>9} {row['handshakes']:>7} {row['other']:>6}"
        )
    table = dict(rows)
    if "gcp_compute via TLS proxy, no cache" in table:
        print()
        for what, ours, theirs in (
            (
                "ansible-inventory --list",
                "gcp_gpu via TLS proxy, no cache",
                "gcp_compute via TLS proxy, no cache",
            ),
            ("load only", "gcp_gpu load only via TLS proxy", "gcp_compute load only via TLS proxy"),
        ):
            a, b = table[ours], table[theirs]
            print(
                f"gcp_compute / gcp_gpu through the proxy, {what}: {b['wall_s'] / a['wall_s']:.1f}× wall, "
                f"{b['cpu_s'] / a['cpu_s']:.1f}× CPU"
            )
    print(
        "load only: the inventory load in a fresh process (plugin import and parse), without "
        "ansible-inventory's per-host variable resolution and JSON dump.\n"
        "CPU s: the ansible process (or this process's thread), not the emulator or "
        "proxy.\nTLS hs: handshakes the proxy answered; other: requests to names it does not emulate.\n"
        "floor: ansible-inventory --list over a script source that prints the same hosts and variables (what "
        "any inventory plugin pays for resolving and dumping them)."
    )
    print(f"load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
