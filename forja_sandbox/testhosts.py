"""Real local hosts for tests and the sandbox: systemd-nspawn containers with systemd as PID 1.

The shell scripts beside this module do the privileged work (debootstrap, overlay mounts,
network namespaces, nftables); this module decides where things live, caches the golden
image outside the checkout so later runs reuse it, and gives Python callers (the sandbox,
pytest fixtures, molecule's create/destroy) one place to bring hosts up and down.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from forja_sandbox.files import write_atomically

SCRIPTS = Path(__file__).with_name("scripts")
#: The guest-agent stand-in th-up.sh installs into hosts that take their SSH keys from metadata.
GUEST_AGENT = Path(__file__).with_name("guest_agent")
DEFAULT_NET = "10.213.0"
RELEASES = ("jammy", "bookworm")
#: What a host boots: the plain golden image, or the golden image with the Deep Learning VM layer.
IMAGES = ("golden", "dlvm")
#: What the Deep Learning VM family pytorch-2-7-cu128-ubuntu-2204-nvidia-570 ships where forja
#: depends on it: PyTorch 2.7.1 for its Python 3.10 (shared/notes/nvidia-gcp-facts.md), installed
#: by pip as root into that Python, with NumPy (which torch warns without) and the pip that did it
#: (see the sandbox README).
DLVM_REQUIREMENTS = ("torch==2.7.1", "numpy==2.2.6", "pip==25.3")
#: The wheels' target: the image's Python (jammy's 3.10) on x86-64 Linux.
WHEEL_PLATFORM_ARGS = (
    "--only-binary=:all:", "--python-version", "3.10", "--implementation", "cp",
    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
    "--platform", "manylinux2014_x86_64", "--platform", "any",
)


#: ssh options for a test host: its host key changes with each boot, so it is never recorded.
SSH_OPTIONS = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
               "-o", "BatchMode=yes")


class TestHostError(RuntimeError):
    """A test host could not be built, booted or removed."""


@dataclasses.dataclass(frozen=True)
class Host:
    """A booted host: its index, name, address and the key that logs in as `ansible`."""

    index: int
    name: str
    address: str
    user: str
    key: Path

    def ssh_argv(self, *command: str, options: tuple[str, ...] = ()) -> list[str]:
        """ssh to the host as its login user, with the options every caller needs (:data:`SSH_OPTIONS`)
        and ``options`` (e.g. a ConnectTimeout) before the destination."""
        return ["ssh", "-i", str(self.key), *SSH_OPTIONS, *options, f"{self.user}@{self.address}", *command]

    def run_as_root(self, script: str, timeout: float = 120) -> str:
        """Run a shell script as root on the host (given on stdin: no quoting games); its stdout.

        TestHostError with the script's stderr when it exits non-zero: what a test does to a host
        outside forja (drift, a pre-installed driver) must have happened before the test goes on.
        """
        proc = subprocess.run(self.ssh_argv("sudo sh -s"), input=script, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if proc.returncode != 0:
            raise TestHostError(f"{self.name}: script exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout


def refuse_in_check_tier(what: str) -> None:
    """`make check` (FORJA_TIER=check) runs no test host and no sandbox: a test that still reaches
    one is missing its `hosts` mark, and is named here rather than silently slowing the edit loop."""
    if os.environ.get("FORJA_TIER") == "check":
        raise TestHostError(f"a test in `make check` {what}: mark it `@pytest.mark.hosts` so it runs "
                            "in the host tier (`make hosts-tier`)")


def base_dir() -> Path:
    """Work folder for images, keys and host overlays; outside the clone so CI reuses it."""
    return Path(os.environ.get("TH_BASE") or Path.home() / ".cache" / "forja").resolve()


def net_prefix() -> str:
    return os.environ.get("TH_NET", DEFAULT_NET)


def address(index: int) -> str:
    return f"{net_prefix()}.{10 + index}"


def key_path() -> Path:
    return base_dir() / "ssh" / "id_ed25519"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["TH_BASE"] = str(base_dir())
    env["TH_NET"] = net_prefix()
    env["TH_KEY"] = str(key_path())
    return env


def _run(args: list[str], what: str, extra_env: dict[str, str] | None = None) -> str:
    env = {**_env(), **(extra_env or {})}
    proc = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise TestHostError(f"{what} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def ensure_key() -> Path:
    """A throwaway SSH key pair that only the test hosts trust."""
    key = key_path()
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], "ssh-keygen")
    return key


def golden_dir(release: str) -> Path:
    return base_dir() / "images" / f"golden-{release}"


def ensure_golden(release: str | None = None) -> Path:
    """Return an extracted golden root filesystem, building or extracting it when missing.

    Ubuntu jammy (the GCP image's release) is the default. If the Ubuntu archive cannot be
    reached the build falls back to Debian bookworm and says so loudly, because roles then
    run on a different distribution than in production.
    """
    wanted = release or os.environ.get("TH_RELEASE", "jammy")
    if wanted not in RELEASES:
        raise TestHostError(f"TH_RELEASE={wanted!r} is not one of {', '.join(RELEASES)}")
    ensure_key()
    order = [wanted] + [r for r in RELEASES if r != wanted]
    errors = []
    for rel in order:
        folder = golden_dir(rel)
        tarball = folder.with_name(f"{rel}.tar.zst")
        if (folder / "etc" / "os-release").exists():
            return folder
        try:
            if not tarball.exists():
                _run([str(SCRIPTS / "build-golden.sh"), rel, str(tarball)], f"building the {rel} image")
            partial = folder.with_name(folder.name + ".part")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            _run(["tar", "-C", str(partial), "--zstd", "-xf", str(tarball)], f"extracting {tarball}")
            partial.rename(folder)
        except TestHostError as exc:
            errors.append(str(exc))
            banner = "!" * 72
            print(f"{banner}\nWARNING: could not build the {rel} golden image; "
                  f"trying the next release.\n{exc}\n{banner}", file=sys.stderr)
            continue
        if rel != wanted:
            banner = "!" * 72
            print(f"{banner}\nWARNING: test hosts run Debian {rel}, NOT Ubuntu {wanted}: the "
                  f"Ubuntu archive could not be reached.\n{banner}", file=sys.stderr)
        return folder
    raise TestHostError("no golden image could be built:\n" + "\n".join(errors))


def wheelhouse_dir() -> Path:
    """The folder of wheels every host mounts read-only (inside: /var/cache/forja-pip/wheelhouse)."""
    return base_dir() / "pip-cache" / "wheelhouse"


def ensure_wheelhouse(requirements: tuple[str, ...]) -> Path:
    """Download ``requirements`` (and their dependencies) once, as Python 3.10 x86-64 wheels.

    PyPI's responses are not cacheable through this machine's egress, so a wheelhouse on disk is
    what makes the second and later installs local. A marker named by the list's hash records that
    this list is complete; other lists (the tests' own) share the folder and the files.
    """
    folder = wheelhouse_dir()
    marker = folder / f".complete-{hashlib.sha256(' '.join(sorted(requirements)).encode()).hexdigest()[:12]}"
    if marker.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    # Tests on two workers may ask for one list at once: one downloads, the other then finds it.
    with open(folder.parent / ".wheelhouse.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return folder
        cert = Path("/etc/ssl/certs/ca-certificates.crt")
        _run([sys.executable, "-m", "pip", "download", "--isolated", "--disable-pip-version-check",
              *(["--cert", str(cert)] if cert.exists() else []), *WHEEL_PLATFORM_ARGS,
              "--progress-bar", "off", "--resume-retries", "10", "-d", str(folder), *requirements],
             f"downloading {' '.join(requirements)} into {folder}")
        marker.touch()
    return folder


def dlvm_dir(release: str) -> Path:
    return base_dir() / "images" / f"dlvm-{release}"


def ensure_dlvm(release: str | None = None) -> Path:
    """Return the Deep Learning VM layer (built once over the golden image; ~5 GB, cached).

    Only for Ubuntu jammy: the real image is Ubuntu 22.04 with Python 3.10, and the wheels are
    built for that Python.
    """
    golden = ensure_golden(release)
    rel = golden.name.removeprefix("golden-")
    if rel != "jammy":
        raise TestHostError(f"the Deep Learning VM layer needs the jammy golden image (Python 3.10); "
                            f"this machine has {rel}")
    layer = dlvm_dir(rel)
    if (layer / "usr").is_dir():
        return layer
    wheels = ensure_wheelhouse(DLVM_REQUIREMENTS)
    pip_version = next(r.split("==")[1] for r in DLVM_REQUIREMENTS if r.startswith("pip=="))
    pip_wheel = f"pip-{pip_version}-py3-none-any.whl"
    _run([str(SCRIPTS / "build-dlvm.sh"), str(golden), str(layer), str(wheels), pip_wheel,
          *DLVM_REQUIREMENTS], "building the Deep Learning VM layer")
    return layer


def lowerdirs(image: str = "golden", release: str | None = None, over: Path | None = None) -> str:
    """The overlay lower layers a host of ``image`` boots from, top first, as overlayfs takes them;
    ``over`` (a layer from `ensure_layer`) goes on top."""
    if image not in IMAGES:
        raise TestHostError(f"image={image!r} is not one of {', '.join(IMAGES)}")
    golden = ensure_golden(release)
    lower = f"{ensure_dlvm(release)}:{golden}" if image == "dlvm" else str(golden)
    return f"{over}:{lower}" if over is not None else lower


def layer_key(inputs: list[Path], *extra: str) -> str:
    """A short hash of every file under ``inputs`` (names and contents) and of ``extra``: what a
    cached layer was built from, so a change to any of them names a new layer. Names are taken
    from each input's own name down, so two checkouts of one commit, in any folders, share a layer."""
    digest = hashlib.sha256("\0".join(extra).encode())
    for root in sorted(inputs):
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for path in files:
            if "__pycache__" in path.parts:
                continue
            digest.update(f"\0{path.relative_to(root.parent)}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


#: What a layer's build leaves that belongs to the builder host, not to the hosts that boot the
#: layer: th-up.sh writes each host's own at boot (name, keys, resolver, CA), systemd makes a
#: machine id, and the builder's journal and temporary files are its own.
LAYER_SCRUB = ("etc/machine-id", "etc/hostname", "etc/hosts", "root/.ssh", "home/ansible/.ssh",
               "var/log/journal", "var/tmp", "tmp", "etc/resolv.conf", "etc/systemd/resolved.conf.d")


def ensure_layer(name: str, key: str, build: Callable[[Host], None], builder: int,
                 image: str = "dlvm") -> Path:
    """Return the cached layer ``name-key`` over ``image``, building it when missing.

    The build boots host `th<builder>` from ``image``, runs ``build(host)`` (a converge), halts the
    host and keeps its disk, the overlay's upper layer, as the new layer: hosts booted with
    ``up(..., over=layer)`` start where the converge ended. ``key`` names what the layer was built
    from (`layer_key`), so a changed input builds a new layer and a stale one is never booted;
    older layers of the same name are removed. A lock makes concurrent callers build it once.
    """
    images = base_dir() / "images"
    layer = images / f"{name}-{key}"
    complete = images / f"{name}-{key}.complete"  # beside it: a marker inside would show in the hosts
    if complete.exists():
        return layer
    images.mkdir(parents=True, exist_ok=True)
    with open(images / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if complete.exists():
            return layer
        down(builder)
        host = up(builder, image=image)
        try:
            build(host)
        finally:
            stop(builder)
        upper = base_dir() / "hosts" / f"th{builder}" / "upper"
        for item in LAYER_SCRUB:
            target = upper / item
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        (upper / "usr").mkdir(exist_ok=True)  # th-up.sh checks that every layer has one
        partial = images / f"{name}-{key}.part"
        shutil.rmtree(partial, ignore_errors=True)
        upper.rename(partial)  # the same file system: whiteouts and overlay attributes are kept
        down(builder)
        shutil.rmtree(layer, ignore_errors=True)  # a layer whose marker was never written
        partial.rename(layer)
        complete.touch()
        for old in images.glob(f"{name}-*"):
            if old in (layer, complete):
                continue
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
    return layer


def up(index: int, release: str | None = None, image: str = "golden", firewall: str | None = None,
       metadata_url: str | None = None, over: Path | None = None) -> Host:
    """Boot host `th<index>` (idempotent) and return how to reach it.

    ``image="dlvm"`` adds the Deep Learning VM layer (the image's Python with PyTorch); ``over``, a
    cached layer on top of that (`ensure_layer`: a host where a converge has run). A host
    keeps the layers it was first booted with until it is removed, as a VM keeps its boot disk.
    ``firewall`` (an `nft -f` ruleset, see `forja_sandbox.firewall`) is loaded into the host's
    namespace before the host has an address; a host already up is left as it is (use
    `apply_firewall`).
    ``metadata_url`` installs the guest-agent stand-in (forja_sandbox/guest_agent), which takes the
    host's users and SSH keys from that metadata server, and bakes no fixture key in: only what
    metadata grants logs in, as on a GCE VM.
    """
    refuse_in_check_tier(f"booted test host th{index}")
    lower = lowerdirs(image, release, over)
    booted = base_dir() / "hosts" / f"th{index}" / "lowerdir"
    if over is not None and booted.exists() and booted.read_text().strip() != lower:
        # th-up.sh keeps the host's first layers: asking for a layer it lacks would silently
        # give a host without the converge the caller counts on
        raise TestHostError(f"th{index} was booted from {booted.read_text().strip()}, not from "
                            f"{lower}: remove it first (testhosts.down({index}))")
    env = None
    if firewall is not None:
        env = {"TH_NFT_FILE": str(_write_firewall(index, firewall))}
    if metadata_url is not None:
        env = {**(env or {}), "TH_GUEST_AGENT": str(GUEST_AGENT), "TH_METADATA_URL": metadata_url,
               "TH_NO_BAKED_KEY": "1"}
    _run([str(SCRIPTS / "th-up.sh"), str(index), lower], f"booting th{index}", env)
    return Host(index, f"th{index}", address(index), "ansible", key_path())


def _write_firewall(index: int, ruleset: str) -> Path:
    """Keep the host's ruleset in its folder: what th-up.sh loads, and a record of what is loaded."""
    # th-up.sh may be reading it: never half written
    return write_atomically(base_dir() / "hosts" / f"th{index}" / "firewall.nft", ruleset)


def apply_firewall(index: int, ruleset: str) -> bool:
    """Load ``ruleset`` into running host `th<index>`'s namespace (one `nft -f`, so atomic).

    False when the host has no namespace (it is down; its next boot loads its own rules).
    """
    netns = Path("/run/netns") / f"th{index}"
    if not netns.exists():
        return False
    proc = subprocess.run(["ip", "netns", "exec", f"th{index}", "nft", "-f", "-"], input=ruleset,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        if not netns.exists():
            return False  # the host went down meanwhile
        raise TestHostError(f"loading th{index}'s firewall failed (exit {proc.returncode}):\n{proc.stderr}")
    if (base_dir() / "hosts" / f"th{index}").is_dir():
        _write_firewall(index, ruleset)
    return True


def down(index: int) -> None:
    """Stop host `th<index>` and remove everything it made (idempotent)."""
    _run([str(SCRIPTS / "th-down.sh"), str(index)], f"removing th{index}")


def stop(index: int) -> None:
    """Halt host `th<index>` but keep its disk, as a stopped VM keeps its boot disk."""
    _run([str(SCRIPTS / "th-stop.sh"), str(index)], f"stopping th{index}")


def is_up(index: int) -> bool:
    """Whether host `th<index>` is booted (its nspawn process is alive)."""
    pid_file = base_dir() / "hosts" / f"th{index}" / "pid"
    try:
        os.kill(int(pid_file.read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


def running() -> list[int]:
    """Indices of the hosts this machine has up (by their network namespaces)."""
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    found = []
    for line in proc.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith("th") and name[2:].isdigit():
            found.append(int(name[2:]))
    hosts = base_dir() / "hosts"
    if hosts.is_dir():
        found += [int(p.name[2:]) for p in hosts.iterdir() if p.name[2:].isdigit()]
    return sorted(set(found))


def down_all() -> None:
    """Remove every host; what CI's trap calls so a killed run leaves nothing behind."""
    for index in running():
        down(index)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m forja_sandbox.testhosts", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("golden", help="build or extract the golden image")
    sub.add_parser("dlvm", help="build the Deep Learning VM layer over the golden image")
    p_wheels = sub.add_parser("wheelhouse", help="download Python 3.10 wheels once for the hosts")
    p_wheels.add_argument("requirement", nargs="+")
    p_up = sub.add_parser("up", help="boot hosts")
    p_up.add_argument("--image", choices=IMAGES, default="golden",
                      help="golden, or dlvm: the golden image plus the Deep Learning VM layer")
    p_up.add_argument("--over", type=Path, help="a cached layer on top of the image (python -m "
                      "forja_sandbox.hostlayers NAME prints one)")
    p_up.add_argument("index", type=int, nargs="+")
    p_stop = sub.add_parser("stop", help="halt hosts, keeping their disks")
    p_stop.add_argument("index", type=int, nargs="+")
    p_down = sub.add_parser("down", help="remove hosts")
    p_down.add_argument("index", type=int, nargs="+")
    sub.add_parser("down-all", help="remove every host")
    sub.add_parser("list", help="list running hosts")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "golden":
            print(ensure_golden())
        elif args.cmd == "dlvm":
            print(ensure_dlvm())
        elif args.cmd == "wheelhouse":
            print(ensure_wheelhouse(tuple(args.requirement)))
        elif args.cmd == "up":
            for i in args.index:
                h = up(i, image=args.image, over=args.over)
                print(f"{h.name} {h.address}")
        elif args.cmd == "stop":
            for i in args.index:
                stop(i)
        elif args.cmd == "down":
            for i in args.index:
                down(i)
        elif args.cmd == "down-all":
            down_all()
        else:
            for i in running():
                print(f"th{i} {address(i)}")
    except TestHostError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
