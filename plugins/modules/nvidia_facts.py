#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""Read-only detection of the NVIDIA stack on a host, for the nvidia_stack role.

Why a module and not a chain of shell tasks: the role has to compare several machine-readable
sources (PCI, nvidia-smi's CSV and XML, /proc/driver/nvidia/version, the NVML library file,
dpkg) and decide what is there before it changes anything. Doing that in one Python module
keeps each parser a small pure function that unit tests feed with captured real output.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_facts
short_description: Detect the NVIDIA GPU, driver, CUDA and kernel state of a host (read-only)
description:
  - Finds NVIDIA GPUs on the PCI bus (sysfs, no C(lspci) needed), queries C(nvidia-smi) in its
    machine-readable forms (C(--query-gpu ... --format=csv,noheader,nounits) and C(-q -x)),
    reads the loaded kernel module version from C(/proc/driver/nvidia/version) and the
    user-space NVML library version from the C(libnvidia-ml.so) file name.
  - Reports the installed NVIDIA, CUDA and kernel packages (dpkg), which package owns the
    driver's user-space library (to tell an apt-installed driver from one the image installed
    outside apt), the CUDA toolkits under C(/usr/local/cuda-*) and whether the host is a
    Deep Learning VM image.
  - Optionally simulates C(apt-get dist-upgrade) and lists every package apt would move, so a
    caller can prove its pins hold.
  - Never changes the host; C(changed) is always false.
version_added: "0.1.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  nvidia_smi:
    description: The nvidia-smi program, as a path or a name looked up in PATH.
    type: str
    default: nvidia-smi
  dlvm_markers:
    description: Paths whose presence marks a Google Deep Learning VM image.
    type: list
    elements: str
    default: ["/opt/deeplearning"]
  package_pattern:
    description: Regular expression (matched at the start) of the package names to report.
    type: str
    default: "(nvidia-|libnvidia-|cuda-|linux-)"
  simulate_upgrade:
    description: Also run C(apt-get -s dist-upgrade) and return the packages it would move.
    type: bool
    default: false
  pinned_branch:
    description:
      - With I(simulate_upgrade), the driver branch the pins must hold (for example C(570)).
      - Any driver package apt would move to a version outside it is a C(pin_violations) entry.
    type: str
  pinned_cuda:
    description:
      - With I(simulate_upgrade), the CUDA X.Y the pins must hold (for example C(12.8)).
      - Any CUDA meta package moved outside it, or any other versioned toolkit installed, is a violation.
    type: str
  simulation_cache:
    description:
      - With I(simulate_upgrade), a host file keeping the last simulation with a digest of everything
        apt's answer depends on - the dpkg status, the package lists and C(/etc/apt) (each file's path,
        size, change time and inode). The simulation runs again whenever any of them differs, so drift
        is still seen; an unchanged host skips the 0.5-1 s simulation. Empty disables the cache.
    type: str
    default: /var/cache/forja/apt-simulation.json
  held_kernel:
    description:
      - With I(simulate_upgrade), also count any kernel image, module or header move as a violation.
      - With I(state), only when a package of its C(holds) is installed (nothing else can be held).
    type: bool
    default: false
  state:
    description:
      - The options of M(forja.gpu.host_state) (C(packages), C(holds), C(files), ...), compared in this
        same call and returned as RV(state), so a role that detects the stack and checks what it
        manages makes one remote call, not two. The comparison runs before the detection.
    type: dict
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - On a host without GPU or without a loaded driver, C(nvidia-smi) fails; that is reported in
    C(smi.error), not raised.
"""

EXAMPLES = r"""
- name: Detect the NVIDIA stack
  forja.gpu.nvidia_facts:
  register: nvidia_detected

- name: Show what apt would upgrade despite the pins
  forja.gpu.nvidia_facts:
    simulate_upgrade: true
  register: nvidia_after_pinning

- name: Detect the stack and check the pins file in the same call
  forja.gpu.nvidia_facts:
    simulate_upgrade: true
    pinned_branch: "570"
    held_kernel: true
    state:
      holds: [linux-gcp]
      files:
        - {path: /etc/apt/preferences.d/forja-nvidia-stack.pref, owner: root, group: root, mode: "0644"}
  register: nvidia_detected

- name: Fail when the loaded module does not match the user-space library
  ansible.builtin.assert:
    that: nvidia_detected.kernel_module_version == nvidia_detected.nvml_library_version
"""

RETURN = r"""
gpu_present:
  description: True when an NVIDIA GPU is on the PCI bus or nvidia-smi lists one.
  returned: always
  type: bool
pci_gpus:
  description: NVIDIA display/3D controllers found in sysfs.
  returned: always
  type: list
  elements: dict
  sample: [{"address": "0000:00:03.0", "device_id": "0x27b8", "class": "0x030200"}]
smi:
  description: What nvidia-smi said, parsed from its CSV and XML output.
  returned: always
  type: dict
  contains:
    path: {description: "The nvidia-smi found, or null.", type: str}
    ok: {description: True when the query succeeded., type: bool}
    rc: {description: Exit status of the query (null when not run)., type: int}
    error: {description: Why the query failed (stderr or a reason)., type: str}
    gpus: {description: "One dict per GPU: index, name, driver_version, persistence_mode,
      memory_total_mib, pci_bus_id, uuid.", type: list, elements: dict}
    driver_version: {description: Driver version reported by nvidia-smi., type: str}
    cuda_version: {description: Highest CUDA version the driver supports (from C(-q -x))., type: str}
  sample: {"path": "/usr/bin/nvidia-smi", "ok": true, "rc": 0, "error": "",
           "gpus": [{"index": 0, "name": "NVIDIA L4", "driver_version": "570.133.20",
                     "persistence_mode": "Enabled", "memory_total_mib": 23034,
                     "pci_bus_id": "00000000:00:03.0", "uuid": "GPU-5b1b..."}],
           "driver_version": "570.133.20", "cuda_version": "12.8"}
kernel_module_version:
  description: Version of the loaded nvidia kernel module, or null when none is loaded.
  returned: always
  type: str
  sample: "570.133.20"
nvml_library_version:
  description: Version of the installed libnvidia-ml.so (user space), or null.
  returned: always
  type: str
  sample: "570.133.20"
nvml_library_path:
  description: The real file behind libnvidia-ml.so.1, or null.
  returned: always
  type: str
driver_package:
  description: The dpkg package that owns the NVML library, or null (no driver, or installed outside apt).
  returned: always
  type: str
  sample: libnvidia-compute-570
driver_version:
  description: Best known driver version - nvidia-smi, else the kernel module, else the NVML library file.
  returned: always
  type: str
source:
  description: C(dlvm) (Deep Learning VM image, or a driver outside apt), C(apt) or C(none).
  returned: always
  type: str
dlvm:
  description: True when a Deep Learning VM marker path exists.
  returned: always
  type: bool
packages:
  description: Installed packages matching I(package_pattern), name to version.
  returned: always
  type: dict
  sample: {"nvidia-driver-570": "570.172.08-0ubuntu1", "cuda-toolkit-12-8": "12.8.1-1"}
cuda_toolkits:
  description: CUDA toolkits found as C(/usr/local/cuda-X.Y/version.json), X.Y to full version.
  returned: always
  type: dict
  sample: {"12.8": "12.8.1"}
kernel:
  description: The running kernel release (uname -r).
  returned: always
  type: str
upgrade_moves:
  description: Packages C(apt-get -s dist-upgrade) would install, upgrade or remove.
  returned: when simulate_upgrade
  type: list
  elements: dict
  sample: [{"action": "Inst", "name": "nvidia-driver-570", "from": "570.172.08-0ubuntu1",
            "to": "580.95.05-0ubuntu1"}]
upgrade_simulation_cached:
  description: Whether I(upgrade_moves) came from O(simulation_cache) (apt's inputs unchanged since).
  returned: when simulate_upgrade
  type: bool
pin_violations:
  description: The I(upgrade_moves) that would leave the pinned branch, CUDA release or held kernel.
  returned: when simulate_upgrade
  type: list
  elements: dict
state:
  description:
    - M(forja.gpu.host_state)'s result for I(state) (C(ok), C(differences), C(packages_missing), ...).
  returned: when state is given
  type: dict
"""

import glob
import hashlib
import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.forja.gpu.plugins.module_utils.forja_host_state import state_option
from ansible_collections.forja.gpu.plugins.module_utils.forja_nvidia import pci_gpus, run_smi

NVML_NAME = re.compile(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")
PROC_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")
APT_ACTION = re.compile(r"^(Inst|Remv|Purg) (\S+)(?: \[([^\]]+)\])?(?: \((\S+))?")
#: What `apt-get -s dist-upgrade` reads: its answer is a function of these files (and apt's own version,
#: which is in the dpkg status).
APT_INPUTS = ("/var/lib/dpkg/status", "/var/lib/apt/extended_states", "/var/lib/apt/lists", "/etc/apt")
SIMULATION_CACHE_VERSION = 1
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")


def parse_proc_version(text: str) -> str | None:
    """Version of the loaded module from /proc/driver/nvidia/version (proprietary or open flavour)."""
    match = PROC_VERSION.search(text or "")
    return match.group(1) if match else None


def nvml_version_from_name(path: str) -> str | None:
    """`.../libnvidia-ml.so.570.133.20` -> `570.133.20`: the library carries its version in its name."""
    match = NVML_NAME.search(os.path.basename(path or ""))
    return match.group(1) if match else None


def upstream_version(deb_version: str) -> str:
    """`1:570.172.08-0ubuntu1` -> `570.172.08`: drop the epoch and the Debian revision."""
    version = deb_version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def major_minor(version: str) -> str:
    """`12.8.1` -> `12.8`."""
    return ".".join(version.split(".")[:2])


def parse_apt_simulation(text: str) -> list[dict]:
    """Packages `apt-get -s dist-upgrade` would install, upgrade or remove.

    Lines look like `Inst nvidia-driver-570 [570.172.08-0ubuntu1] (580.95.05-0ubuntu1 repo [amd64])`;
    a new install has no `[old]` part, a removal no `(new)` part.
    """
    moves = []
    for line in text.splitlines():
        match = APT_ACTION.match(line)
        if match:
            action, name, old, new = match.groups()
            moves.append({"action": action, "name": name, "from": old, "to": new})
    return moves


DRIVER_FAMILY = re.compile(r"^(nvidia-|libnvidia-|xserver-xorg-video-nvidia-|cuda-drivers)")
CUDA_META = re.compile(r"^cuda(-toolkit|-runtime|-libraries|-libraries-dev|-compiler|-tools)?(-\d+)?$")
CUDA_VERSIONED = re.compile(r"^cuda-.*-(\d+)-(\d+)$")
KERNEL_FAMILY = re.compile(r"^linux-(image|modules|headers|gcp|image-gcp|headers-gcp)(-|$)")


def pin_violations(moves: list[dict], branch: str | None, cuda: str | None, held_kernel: bool) -> list[dict]:
    """The simulated moves that would take the host off the pinned stack.

    Driver packages must land on `branch.*` (a version pin, because a "570" *name* can carry
    a 580 *version*); CUDA metas on `cuda.*`; no toolkit of another X-Y may come in; with a
    held kernel, no kernel package may move at all. Removals of stack packages always count.
    """
    bad = []
    for move in moves:
        name, target = move["name"], upstream_version(move["to"]) if move["to"] else None
        if branch and DRIVER_FAMILY.match(name) and "pinning" not in name:
            if target is None or not target.startswith(branch + "."):
                bad.append(move)
        elif cuda and CUDA_META.match(name):
            if target is None or not target.startswith(cuda + "."):
                bad.append(move)
        elif cuda and CUDA_VERSIONED.match(name):
            major, minor = CUDA_VERSIONED.match(name).groups()
            if f"{major}.{minor}" != cuda or target is None:
                bad.append(move)
        elif held_kernel and KERNEL_FAMILY.match(name):
            bad.append(move)
    return bad


def apt_inputs_digest(paths: tuple[str, ...] = APT_INPUTS) -> str:
    """A digest of every file apt's simulation reads: path, size, change time (ns) and inode.

    Why ctime and the inode: a file rewritten in place or replaced by rename changes one of them even
    when a tool restores its modification time. Stat-ing the few hundred files takes milliseconds.
    """
    digest = hashlib.sha256()
    for root in paths:
        if os.path.isdir(root):
            files = []
            for folder, dirs, names in os.walk(root):
                dirs.sort()
                files.extend(os.path.join(folder, name) for name in sorted(names))
        else:
            files = [root]
        for path in files:
            try:
                st = os.lstat(path)
            except OSError:
                digest.update(f"{path}\0missing\n".encode())
                continue
            digest.update(f"{path}\0{st.st_size}\0{st.st_ctime_ns}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return digest.hexdigest()


def read_simulation_cache(path: str, digest: str) -> list[dict] | None:
    """The cached moves when the cache was made from the same apt inputs, else None."""
    try:
        with open(path) as fh:
            cached = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or cached.get("version") != SIMULATION_CACHE_VERSION:
        return None
    if cached.get("digest") != digest or not isinstance(cached.get("moves"), list):
        return None
    return cached["moves"]


def write_simulation_cache(path: str, digest: str, moves: list[dict]) -> None:
    """Keep the moves with the digest they belong to (atomic rename; a failure only costs the next run)."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump({"version": SIMULATION_CACHE_VERSION, "digest": digest, "moves": moves}, fh)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        pass


def simulate_upgrade(module: AnsibleModule, cache: str) -> tuple[list[dict], bool]:
    """The moves of `apt-get -s dist-upgrade`, from the cache when apt's inputs are unchanged."""
    digest = apt_inputs_digest() if cache else ""
    if cache:
        moves = read_simulation_cache(cache, digest)
        if moves is not None:
            return moves, True
    rc, out, err = module.run_command(["apt-get", "-s", "-o", "Debug::NoLocking=1", "dist-upgrade"],
                                      environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(msg=f"apt-get -s dist-upgrade failed: {err.strip()}")
    moves = parse_apt_simulation(out)
    # Not in check mode (it writes nothing then), nor when apt's inputs moved while it ran.
    if cache and not module.check_mode and apt_inputs_digest() == digest:
        write_simulation_cache(cache, digest, moves)
    return moves, False


def parse_dpkg_list(text: str, pattern: str) -> dict:
    """`dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'` -> installed name: version.

    Status-Abbrev is want/state/error: "ii" and a held "hi" are both installed (state "i").
    """
    wanted = re.compile(pattern)
    found = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[2][1:2] == "i" and wanted.match(parts[0]):
            found[parts[0]] = parts[1]
    return found


def cuda_toolkits(prefix: str = "/usr/local") -> dict:
    """CUDA toolkits by X.Y, from each /usr/local/cuda-X.Y/version.json (present since CUDA 11.1)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(prefix, "cuda-*/version.json"))):
        try:
            with open(path) as fh:
                version = json.load(fh)["cuda"]["version"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found[major_minor(version)] = version
    return found


def find_nvml(lib_dirs: tuple[str, ...] = LIB_DIRS) -> str | None:
    """The real file behind the first libnvidia-ml.so.1 (or versioned file) in the library dirs."""
    for directory in lib_dirs:
        link = os.path.join(directory, "libnvidia-ml.so.1")
        if os.path.exists(link):
            return os.path.realpath(link)
        versioned = sorted(glob.glob(os.path.join(directory, "libnvidia-ml.so.*.*")))
        if versioned:
            return versioned[-1]
    return None


def pick_driver_version(smi: dict, module_version: str | None, nvml_version: str | None) -> str | None:
    """nvidia-smi is the authority when it answers; otherwise the module, then the library on disk."""
    return smi.get("driver_version") or module_version or nvml_version


def classify_source(driver_version: str | None, driver_package: str | None, dlvm: bool) -> str:
    """Who installed the driver: the image (`dlvm`, also any driver outside apt), `apt`, or `none`."""
    if not driver_version:
        return "none"
    if dlvm or not driver_package:
        return "dlvm"
    return "apt"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "dlvm_markers": {"type": "list", "elements": "str", "default": ["/opt/deeplearning"]},
            "package_pattern": {"type": "str", "default": "(nvidia-|libnvidia-|cuda-|linux-)"},
            "simulate_upgrade": {"type": "bool", "default": False},
            "pinned_branch": {"type": "str"},
            "pinned_cuda": {"type": "str"},
            "held_kernel": {"type": "bool", "default": False},
            "simulation_cache": {"type": "str", "default": "/var/cache/forja/apt-simulation.json"},
            "state": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        re.compile(params["package_pattern"])
    except re.error as exc:
        module.fail_json(msg=f"package_pattern is not a valid regular expression: {exc}")
    state = state_option(module)

    smi = run_smi(module, params["nvidia_smi"])
    try:
        with open("/proc/driver/nvidia/version") as fh:
            module_version = parse_proc_version(fh.read())
    except OSError:
        module_version = None
    nvml_path = find_nvml()
    nvml_version = nvml_version_from_name(nvml_path) if nvml_path else None
    driver_package = None
    if nvml_path:
        rc, out, _err = module.run_command(["dpkg-query", "-S", nvml_path])
        if rc == 0 and out:
            driver_package = out.split(":", 1)[0].strip()
    dpkg_format = "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n"
    rc, out, _err = module.run_command(["dpkg-query", "-W", dpkg_format])
    packages = parse_dpkg_list(out, params["package_pattern"]) if rc == 0 else {}
    dlvm = any(os.path.exists(p) for p in params["dlvm_markers"])
    gpus = pci_gpus()
    driver_version = pick_driver_version(smi, module_version, nvml_version)
    result = {
        "changed": False,
        "gpu_present": bool(gpus or smi["gpus"]),
        "pci_gpus": gpus,
        "smi": smi,
        "kernel_module_version": module_version,
        "nvml_library_version": nvml_version,
        "nvml_library_path": nvml_path,
        "driver_package": driver_package,
        "driver_version": driver_version,
        "source": classify_source(driver_version, driver_package, dlvm),
        "dlvm": dlvm,
        "packages": packages,
        "cuda_toolkits": cuda_toolkits(),
        "kernel": os.uname().release,
    }
    held_kernel = params["held_kernel"]
    if state is not None:
        result["state"] = state
        held_kernel = held_kernel and bool(state["holds_installed"])
    if params["simulate_upgrade"]:
        result["upgrade_moves"], result["upgrade_simulation_cached"] = simulate_upgrade(
            module, params["simulation_cache"])
        result["pin_violations"] = pin_violations(result["upgrade_moves"], params["pinned_branch"],
                                                  params["pinned_cuda"], held_kernel)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
