"""Real local hosts for tests and the sandbox: systemd-nspawn containers with systemd as PID 1.

The shell scripts beside this module do the privileged work (debootstrap, overlay mounts,
network namespaces, nftables); this module decides where things live, caches the golden
image outside the checkout so later runs reuse it, and gives Python callers (the sandbox,
pytest fixtures, molecule's create/destroy) one place to bring hosts up and down.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).with_name("scripts")
DEFAULT_NET = "10.213.0"
RELEASES = ("jammy", "bookworm")


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


def _run(args: list[str], what: str) -> str:
    proc = subprocess.run(args, env=_env(), capture_output=True, text=True, check=False)
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


def up(index: int, release: str | None = None) -> Host:
    """Boot host `th<index>` (idempotent) and return how to reach it."""
    golden = ensure_golden(release)
    _run([str(SCRIPTS / "th-up.sh"), str(index), str(golden)], f"booting th{index}")
    return Host(index, f"th{index}", address(index), "ansible", key_path())


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
    parser = argparse.ArgumentParser(prog="python -m forja.sandbox.testhosts", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("golden", help="build or extract the golden image")
    p_up = sub.add_parser("up", help="boot hosts")
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
        elif args.cmd == "up":
            for i in args.index:
                h = up(i)
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
