"""Stand-in apt repositories for the nvidia_stack scenario, built and served from the controller.

Why: the test hosts cannot reach NVIDIA's CUDA repository (and have no GPU), yet the role's
pinning must be proven against real apt behaviour. So this script builds small .deb packages
with the REAL package names and versions (driver 570 plus newer 575/580, "570" packages that
pull 580 the two ways the real ones did, CUDA 12.8 plus 12.9, stand-in GCP kernels), lays them out
like NVIDIA's flat repository, signs it with a throwaway GnuPG key and serves it over HTTP on
the test bridge. The packages only carry marker files: nothing here touches a kernel.

    python standin_repo.py build DIR          # build both repositories under DIR
    python standin_repo.py start DIR --bind 10.213.0.1   # serve DIR in the background
    python standin_repo.py stop DIR           # stop that server

Layout under DIR (served as the web root):
    compute/cuda/repos/ubuntu2204/x86_64/   NVIDIA-like flat repo (InRelease, Release.gpg,
                                            Packages, *.deb, forja-standin.asc: the public key)
    ubuntu/                                 a flat repo standing in for the Ubuntu archive:
                                            kernel packages, Canonical's 580-server branch and
                                            its "570" stubs that pull it (Origin: Ubuntu,
                                            signed by the same key)
    .key-fingerprint                        the key's fingerprint, for the role's check
    .port, .pid, .server.log                the running server
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gzip
import hashlib
import http.server
import os
import signal
import subprocess
import sys
import tempfile
import time
from email.utils import formatdate
from pathlib import Path

NVIDIA_PATH = "compute/cuda/repos/ubuntu2204/x86_64"
UBUNTU_PATH = "ubuntu"
KEY_NAME = "forja-standin.asc"
KERNEL_OLD = "5.15.0-9080-gcp"
KERNEL_NEW = "5.15.0-9090-gcp"


@dataclasses.dataclass(frozen=True)
class Pkg:
    """One stand-in package: control fields plus the marker files it installs."""

    name: str
    version: str
    depends: str = ""
    files: tuple[tuple[str, str], ...] = ()
    links: tuple[tuple[str, str], ...] = ()
    arch: str = "amd64"
    section: str = "multiverse/libs"
    # One branch's package excludes the others' (they ship the same nvidia-smi / libnvidia-ml.so.1):
    # Provides, Conflicts and Replaces the same unversioned name, the Debian idiom.
    exclusive: str = ""


NO_DRIVER_SMI = """#!/bin/sh
# Stand-in nvidia-smi (forja test repository): behaves like the real one on a host whose
# kernel module is not loaded, which is every test host.
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. \
Make sure that the latest NVIDIA driver is installed and running." >&2
exit 9
"""

PINNING_570 = """\
# Stand-in for NVIDIA's nvidia-driver-pinning-570 preferences file (forja test repository).
Package: nvidia-* libnvidia-* cuda-drivers*
Pin: version 570.*
Pin-Priority: 1000
"""


def driver_branch(version: str) -> list[Pkg]:
    """The packages of one driver release, named like NVIDIA's CUDA repo for that branch.

    Every name the role's pin has to cover is here (nvidia-driver-, libnvidia-, nvidia-dkms-,
    nvidia-utils-, nvidia-compute-utils-, xserver-xorg-video-nvidia-, nvidia-fabricmanager-,
    cuda-drivers-), so a pattern that misses one lets that package drift in the tests too.
    """
    branch = version.split(".")[0]
    deb = f"{version}-0ubuntu1"
    lib = "/usr/lib/x86_64-linux-gnu"
    parts = ("libnvidia-compute", "nvidia-utils", "nvidia-compute-utils", "nvidia-dkms",
             "xserver-xorg-video-nvidia")
    return [
        Pkg(f"libnvidia-compute-{branch}", deb, exclusive="libnvidia-compute",
            files=((f"{lib}/libnvidia-ml.so.{version}", f"stand-in NVML {version}\n"),),
            links=((f"{lib}/libnvidia-ml.so.1", f"libnvidia-ml.so.{version}"),)),
        Pkg(f"nvidia-utils-{branch}", deb, exclusive="nvidia-utils",
            files=(("/usr/bin/nvidia-smi", NO_DRIVER_SMI),)),
        Pkg(f"nvidia-compute-utils-{branch}", deb, depends=f"libnvidia-compute-{branch} (= {deb})"),
        Pkg(f"nvidia-dkms-{branch}", deb, files=((f"/usr/src/nvidia-{version}/dkms.conf",
                                                  f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{version}"\n'),)),
        Pkg(f"xserver-xorg-video-nvidia-{branch}", deb, section="multiverse/x11"),
        Pkg(f"nvidia-driver-{branch}", deb, depends=", ".join(f"{p}-{branch} (= {deb})" for p in parts)),
        Pkg(f"nvidia-fabricmanager-{branch}", f"{version}-1"),
        Pkg(f"cuda-drivers-{branch}", f"{version}-1", depends=f"nvidia-driver-{branch} (>= {version})"),
    ]


def transitional_570_to_580(version: str) -> list[Pkg]:
    """570 *names* at a 580 *version* that depend on 580, with the open-ended ">=" NVIDIA's metas use.

    `cuda-drivers-570` asks for `nvidia-driver-570 (>= 570.172.08)` with no upper bound (as NVIDIA's
    `cuda-drivers-580` asks for `nvidia-driver (>= 580.65.06)` on Debian and pulled 590), so this
    580.95.05 "nvidia-driver-570" satisfies it. Pinning by name alone misses it; by version not.
    """
    deb = f"{version}-0ubuntu1"
    return [
        Pkg("libnvidia-compute-570", deb, depends=f"libnvidia-compute-580 (>= {version})"),
        Pkg("nvidia-utils-570", deb, depends=f"nvidia-utils-580 (>= {version})"),
        Pkg("nvidia-driver-570", deb, depends=f"nvidia-driver-580 (>= {version})"),
    ]


def cuda_toolkit(full: str) -> list[Pkg]:
    major_minor = ".".join(full.split(".")[:2])
    dashed = major_minor.replace(".", "-")
    version_json = f'{{\n  "cuda": {{"name": "CUDA SDK", "version": "{full}"}}\n}}\n'
    return [
        Pkg(f"cuda-toolkit-{dashed}", f"{full}-1",
            files=((f"/usr/local/cuda-{major_minor}/version.json", version_json),)),
        Pkg("cuda-toolkit", f"{full}-1", depends=f"cuda-toolkit-{dashed} (>= {full})"),
    ]


def nvidia_packages() -> list[Pkg]:
    pkgs: list[Pkg] = []
    for version in ("570.133.20", "570.172.08", "575.64.05", "580.95.05"):
        pkgs += driver_branch(version)
    pkgs += transitional_570_to_580("580.95.05")
    pkgs += [
        Pkg("cuda-drivers", "570.172.08-1", depends="cuda-drivers-570 (>= 570.172.08)"),
        Pkg("cuda-drivers", "580.95.05-1", depends="cuda-drivers-580 (>= 580.95.05)"),
        Pkg("nvidia-driver-pinning-570", "570.172.08-1", arch="all",
            files=(("/etc/apt/preferences.d/nvidia-driver-pinning-570", PINNING_570),)),
    ]
    pkgs += cuda_toolkit("12.8.1") + cuda_toolkit("12.9.1")
    return pkgs


def canonical_packages() -> list[Pkg]:
    """What Ubuntu's archive did to its 570 branch: stubs at a *570* version that depend on 580.

    Seen in jammy-updates (`nvidia-driver-570` 570.211.01 -> `nvidia-driver-580`) and in dstack PR
    #3967 / xnvme/aisio#67 (noble): `nvidia-driver-570-server-open` 570.211.01-0ubuntu1.24.04.1
    Depends `nvidia-driver-580-server-open`, and every package of the set (`nvidia-dkms-570-server-open`,
    ...) depends on its 580 twin. A "570.*" version pin *prefers* these stubs (the newest 570), so
    only refusing the 580 names (and the archive's numbered packages) keeps 580 out.
    """
    stub = "570.211.01-0ubuntu1.22.04.1"
    real = "580.95.05-0ubuntu0.22.04.1"
    server = ("nvidia-driver-{}-server-open", "nvidia-dkms-{}-server-open", "nvidia-utils-{}-server",
              "libnvidia-compute-{}-server")
    pkgs = [Pkg("nvidia-driver-570", stub, depends="nvidia-driver-580 (>= 580.95.05)",
                section="restricted/libs")]
    pkgs += [Pkg(name.format(570), stub, depends=name.format(580), section="restricted/libs")
             for name in server]
    driver, dkms, utils, compute = (name.format(580) for name in server)
    pkgs += [
        Pkg(driver, real, depends=f"{dkms} (= {real}), {utils} (= {real}), {compute} (= {real})",
            section="restricted/libs"),
        Pkg(dkms, real, section="restricted/libs"),
        Pkg(utils, real, section="restricted/libs"),
        Pkg(compute, real, section="restricted/libs"),
    ]
    return pkgs


def kernel_packages() -> list[Pkg]:
    """GCP kernel stand-ins: the flavour packages of two ABIs and the metas that follow the newest.

    The ABI numbers (9080, 9090) exist in no Ubuntu release, so the real archive, which the
    test host also uses, can neither shadow these packages nor pull a real kernel in.
    """
    pkgs: list[Pkg] = []
    for abi, meta in ((KERNEL_OLD, "5.15.0.9080.1"), (KERNEL_NEW, "5.15.0.9090.1")):
        upload = abi.split("-")[1] + "." + meta.split(".")[-1]
        version = f"5.15.0-{upload}"
        for kind in ("image", "modules", "headers"):
            pkgs.append(Pkg(f"linux-{kind}-{abi}", version, section="main/kernel"))
        pkgs += [
            Pkg("linux-image-gcp", meta, depends=f"linux-image-{abi}, linux-modules-{abi}",
                section="main/kernel"),
            Pkg("linux-headers-gcp", meta, depends=f"linux-headers-{abi}", section="main/kernel"),
            Pkg("linux-gcp", meta, depends=f"linux-image-gcp (= {meta}), linux-headers-gcp (= {meta})",
                section="main/kernel"),
        ]
    return pkgs


def build_deb(pkg: Pkg, out_dir: Path, work: Path) -> Path:
    root = work / f"{pkg.name}_{pkg.version}"
    (root / "DEBIAN").mkdir(parents=True)
    doc = root / "usr/share/doc" / pkg.name
    doc.mkdir(parents=True)
    (doc / "README.forja-standin").write_text(f"{pkg.name} {pkg.version}: a forja test stand-in.\n")
    for path, content in pkg.files:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(0o755 if "/bin/" in path else 0o644)
    for path, dest in pkg.links:
        (root / path.lstrip("/")).symlink_to(dest)
    control = [
        f"Package: {pkg.name}", f"Version: {pkg.version}", f"Architecture: {pkg.arch}",
        "Maintainer: forja tests <tests@forja.invalid>", f"Section: {pkg.section}", "Priority: optional",
    ]
    if pkg.depends:
        control.append(f"Depends: {pkg.depends}")
    if pkg.exclusive:
        control += [f"Provides: {pkg.exclusive}", f"Conflicts: {pkg.exclusive}", f"Replaces: {pkg.exclusive}"]
    control.append(f"Description: stand-in for {pkg.name} (forja nvidia_stack tests)")
    (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
    deb = out_dir / f"{pkg.name}_{pkg.version}_{pkg.arch}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root), str(deb)],
                   check=True, capture_output=True)
    return deb


def packages_index(debs: list[Path]) -> str:
    """The Packages file, written here so the controller needs only dpkg-deb (no dpkg-dev)."""
    stanzas = []
    for deb in sorted(debs):
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True,
                                 text=True).stdout.strip()
        data = deb.read_bytes()
        stanzas.append(f"{control}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
                       f"MD5sum: {hashlib.md5(data).hexdigest()}\n"
                       f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
    return "\n".join(stanzas)


def release_file(repo: Path, origin: str, label: str) -> str:
    lines = [f"Origin: {origin}", f"Label: {label}", "Architectures: amd64 all",
             f"Date: {formatdate(usegmt=True)}", "SHA256:"]
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    return "\n".join(lines) + "\n"


def gpg(home: Path, *args: str) -> None:
    subprocess.run(["gpg", "--batch", "--quiet", "--homedir", str(home), *args],
                   check=True, capture_output=True)


def build(root: Path) -> None:
    """Build, index and sign both repositories under `root` (replacing what was there)."""
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="forja-standin-") as tmp:
        home = Path(tmp) / "gnupg"
        home.mkdir(mode=0o700)
        gpg(home, "--passphrase", "", "--quick-gen-key", "forja stand-in repository <tests@forja.invalid>",
            "ed25519", "sign", "1d")
        try:
            for rel, pkgs, origin, label in (
                (NVIDIA_PATH, nvidia_packages(), "NVIDIA", "NVIDIA CUDA"),
                (UBUNTU_PATH, kernel_packages() + canonical_packages(), "Ubuntu", "Ubuntu"),
            ):
                repo = root / rel
                repo.mkdir(parents=True, exist_ok=True)
                for old in repo.iterdir():
                    old.unlink()
                work = Path(tmp) / rel.replace("/", "_")
                debs = [build_deb(p, repo, work) for p in pkgs]
                index = packages_index(debs)
                (repo / "Packages").write_text(index)
                (repo / "Packages.gz").write_bytes(gzip.compress(index.encode(), mtime=0))
                (repo / "Release").write_text(release_file(repo, origin, label))
                gpg(home, "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release"))
                gpg(home, "--detach-sign", "--armor", "-o", str(repo / "Release.gpg"), str(repo / "Release"))
                with open(repo / KEY_NAME, "wb") as key:
                    subprocess.run(["gpg", "--batch", "--homedir", str(home), "--export", "--armor"],
                                   check=True, stdout=key)
                listing = subprocess.run(["gpg", "--batch", "--homedir", str(home), "--with-colons",
                                          "--list-keys"], check=True, capture_output=True, text=True).stdout
                fingerprint = next(line.split(":")[9] for line in listing.splitlines()
                                   if line.startswith("fpr:"))
                (root / ".key-fingerprint").write_text(fingerprint + "\n")
        finally:
            subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"],
                           check=False, capture_output=True)


def serve(root: Path, bind: str, port_file: Path) -> None:
    """Serve `root` until killed; the kernel picks the port, written to `port_file` once bound."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    with http.server.ThreadingHTTPServer((bind, 0), handler) as server:
        port_file.write_text(str(server.server_address[1]))
        server.serve_forever()


def start(root: Path, bind: str) -> str:
    """Start `serve` in its own session (it outlives this call) and return the base URL."""
    port_file, pid_file = root / ".port", root / ".pid"
    stop(root)
    port_file.unlink(missing_ok=True)
    with open(root / ".server.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, __file__, "_serve", str(root), "--bind", bind],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    pid_file.write_text(str(proc.pid))
    for _ in range(100):
        if port_file.exists() and port_file.read_text():
            return f"http://{bind}:{port_file.read_text()}"
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise SystemExit(f"the stand-in repository server did not start; see {root / '.server.log'}")


def stop(root: Path) -> None:
    pid_file = root / ".pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    pid_file.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["build", "start", "stop", "_serve"])
    parser.add_argument("root", type=Path)
    parser.add_argument("--bind", default="10.213.0.1")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.action == "build":
        build(root)
    elif args.action == "start":
        print(start(root, args.bind))
    elif args.action == "stop":
        stop(root)
    else:
        serve(root, args.bind, root / ".port")
    return 0


if __name__ == "__main__":
    sys.exit(main())
