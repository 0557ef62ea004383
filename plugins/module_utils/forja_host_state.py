# Copyright: forja contributors
# Apache-2.0
"""host_state's comparisons, shared by every module that reports a host's state in its own call.

Why here: a module that must read the host anyway (nvidia_facts) can make host_state's comparison
in the same remote call (its `state` option) instead of a role making a second call for it; both
then compare by this one code, so a difference means the same thing whichever module reports it.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import re
import stat
import urllib.error
import urllib.request
from collections.abc import Callable

from ansible_collections.forja.gpu.plugins.module_utils.forja_dpkg import (
    dpkg_held,
    dpkg_installed,
    dpkg_query,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_torch_layer import env_action

# host_state's options: the module's argument spec, and what nvidia_facts' `state` accepts.
ARGUMENT_SPEC: dict[str, dict] = {
    "packages": {"type": "list", "elements": "str", "default": []},
    "holds": {"type": "list", "elements": "str", "default": []},
    "users": {"type": "list", "elements": "dict", "default": []},
    "directories": {"type": "list", "elements": "dict", "default": []},
    "files": {"type": "list", "elements": "dict", "default": []},
    "exists": {"type": "list", "elements": "path", "default": []},
    "units": {"type": "list", "elements": "dict", "default": []},
    "pip": {"type": "list", "elements": "dict", "default": []},
    "http": {"type": "list", "elements": "dict", "default": []},
    "torch_envs": {"type": "list", "elements": "dict", "default": []},
}
# The key each entry of a list of dicts must have.
ENTRY_KEYS = {"users": "name", "directories": "path", "files": "path", "units": "name", "pip": "python",
              "http": "url", "torch_envs": "path"}

RunCommand = Callable[[list[str]], tuple[int, str, str]]


class HostStateError(Exception):
    """Bad options, or a host that cannot be asked (the caller fails the task with the message)."""


# Asked of an environment's interpreter: its site-packages folder and each distribution's version.
PIP_PROBE = r"""
import json, sysconfig
from importlib import metadata
dists = {}
for d in metadata.distributions():
    name = d.metadata["Name"]
    if name:
        dists.setdefault(name, d.version)
print(json.dumps({"purelib": sysconfig.get_path("purelib"), "dists": dists}))
"""
# name, [extras], specifiers, ; markers (the markers are not evaluated: forja's pins have none)
REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(?P<spec>[^;]*?)\s*(;.*)?$")
UNIT_ENABLED = {"enabled", "enabled-runtime", "static", "alias", "indirect", "generated"}


def canonical(name: str) -> str:
    """PEP 503's normal form, which pip compares names in."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_met(requirement: str, installed: dict[str, str]) -> bool:
    """Whether an installed distribution satisfies `requirement` (a PEP 508 specifier, no URL).

    With the `packaging` library (which ansible's own pip module needs on the host) every
    specifier is understood; without it only a bare name and `==` are, and anything else reads as
    unmet, so the caller's pip task runs and decides: never a false "satisfied".
    """
    match = REQUIREMENT.match(requirement)
    if not match:
        return False
    version = installed.get(canonical(match["name"]))
    if version is None:
        return False
    spec = match["spec"].replace(" ", "")
    if not spec:
        return True
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion
    except ImportError:
        return spec.startswith("==") and "," not in spec and spec[2:] == version
    try:
        return SpecifierSet(spec).contains(version, prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False


def name_of(uid: int, lookup) -> str:  # type: ignore[no-untyped-def]
    try:
        return lookup(uid)[0]
    except KeyError:
        return str(uid)


def ownership_reasons(st: os.stat_result, entry: dict) -> list[str]:
    """What differs in an existing path's owner, group and mode."""
    reasons = []
    if entry.get("owner") and name_of(st.st_uid, pwd.getpwuid) != str(entry["owner"]):
        reasons.append(f"owner {name_of(st.st_uid, pwd.getpwuid)}, not {entry['owner']}")
    if entry.get("group") and name_of(st.st_gid, grp.getgrgid) != str(entry["group"]):
        reasons.append(f"group {name_of(st.st_gid, grp.getgrgid)}, not {entry['group']}")
    if entry.get("mode") and stat.S_IMODE(st.st_mode) != int(str(entry["mode"]), 8):
        reasons.append(f"mode {stat.S_IMODE(st.st_mode):04o}, not {int(str(entry['mode']), 8):04o}")
    return reasons


def directory_reason(entry: dict) -> str:
    try:
        st = os.stat(entry["path"])
    except OSError:
        return "missing"
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    return "; ".join(ownership_reasons(st, entry))


def file_reason(entry: dict, path: str) -> str:
    """Why a file differs from `entry`, or '' when it does not."""
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    reasons = ownership_reasons(st, entry)
    if entry.get("checksum") or entry.get("contains"):
        with open(path, "rb") as fh:
            data = fh.read()
        # SHA-1: the checksum ansible's copy and template modules compare, so the caller can compute it too
        if entry.get("checksum") and hashlib.sha1(data).hexdigest() != entry["checksum"]:
            reasons.append("content differs")
        if entry.get("contains") and str(entry["contains"]).encode() not in data:
            reasons.append("lacks the required text")
    return "; ".join(reasons)


def files_differ(entries: list[dict], base: str = "") -> list[dict]:
    differ = []
    for entry in entries:
        reason = file_reason(entry, os.path.join(base, entry["path"]) if base else entry["path"])
        if reason:
            differ.append({**entry, "reason": reason})
    return differ


def parse_systemctl_show(text: str) -> list[dict[str, str]]:
    """`systemctl show` output for several units: one property block each, in the order asked."""
    blocks: list[dict[str, str]] = []
    for chunk in text.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in chunk.splitlines() if "=" in line)
        blocks.append(props)
    return blocks


def unit_reason(entry: dict, props: dict[str, str]) -> str:
    reasons = []
    if props.get("LoadState") != "loaded":
        return f"not loaded ({props.get('LoadState', 'unknown')})"
    if props.get("NeedDaemonReload") == "yes":
        reasons.append("its file changed since systemd read it")
    enabled = props.get("UnitFileState") in UNIT_ENABLED
    if entry.get("enabled") is not None and enabled != bool(entry["enabled"]):
        reasons.append(f"{props.get('UnitFileState') or 'no unit file state'}, not "
                       f"{'enabled' if entry['enabled'] else 'disabled'}")
    if entry.get("active") is not None and (props.get("ActiveState") == "active") != bool(entry["active"]):
        reasons.append(f"{props.get('ActiveState')}, not {'active' if entry['active'] else 'inactive'}")
    return "; ".join(reasons)


def http_status(url: str) -> int | None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url), timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


def allowed_statuses(entry: dict) -> list[int]:
    return [int(s) for s in entry.get("status") or [200]]


def entries_error(params: dict) -> str:
    """The first entry that lacks its key, named with its field, or '' when every entry has one."""
    for field, key in ENTRY_KEYS.items():
        for index, entry in enumerate(params.get(field) or []):
            if not isinstance(entry, dict) or not entry.get(key):
                return f"{field}[{index}] has no {key!r}: each entry needs one ({entry!r})"
    return ""


def state_option(module) -> dict | None:  # type: ignore[no-untyped-def]
    """A facts module's `state` option compared in its own call (None when not given).

    Why here: nvidia_facts and torch_python_facts take host_state's comparison as an option, so a
    role reads its host once; a bad option fails the module naming `state`.
    """
    if module.params.get("state") is None:
        return None
    try:
        return compare(module.params["state"], module.run_command)
    except HostStateError as exc:
        module.fail_json(msg=f"state: {exc}")
        raise  # fail_json exits; this keeps the type checker and a stubbed module honest


def compare(options: dict, run_command: RunCommand) -> dict:
    """Compare the host with `options` (host_state's options); return host_state's result keys.

    `run_command` is AnsibleModule.run_command. Raises HostStateError for bad options or when
    systemd cannot report the units.
    """
    unknown = sorted(set(options) - set(ARGUMENT_SPEC))
    if unknown:
        raise HostStateError(f"unknown host_state option(s) {unknown}: use {sorted(ARGUMENT_SPEC)}")
    p = {name: list(options.get(name) or []) for name in ARGUMENT_SPEC}
    if error := entries_error(p):
        raise HostStateError(error)
    result: dict = {}

    wanted = list(dict.fromkeys(p["packages"] + p["holds"]))
    installed: list[str] = []
    held: list[str] = []
    if wanted:
        _rc, out, _err = run_command(dpkg_query(wanted))  # rc 1: some are unknown, i.e. missing
        installed, held = dpkg_installed(out.splitlines()), dpkg_held(out.splitlines())
    result["packages_missing"] = [name for name in p["packages"] if name not in installed]
    result["holds_installed"] = [name for name in p["holds"] if name in installed]
    result["holds_missing"] = [name for name in result["holds_installed"] if name not in held]

    users_differ = []
    for entry in p["users"]:
        try:
            user = pwd.getpwnam(entry["name"])
        except KeyError:
            users_differ.append({**entry, "reason": "missing"})
            continue
        have = {"home": user.pw_dir, "shell": user.pw_shell}
        reasons = [f"{field} {have[field]}, not {entry[field]}" for field in have
                   if entry.get(field) and have[field] != entry[field]]
        if reasons:
            users_differ.append({**entry, "reason": "; ".join(reasons)})
    result["users_differ"] = users_differ
    result["directories_differ"] = [{**e, "reason": r} for e in p["directories"]
                                    if (r := directory_reason(e))]
    result["files_differ"] = files_differ(p["files"])
    result["exists"] = {path: os.path.lexists(path) for path in p["exists"]}

    units_differ = []
    if p["units"]:
        names = [entry["name"] for entry in p["units"]]
        rc, out, err = run_command(
            ["systemctl", "show", "--property=Id,LoadState,ActiveState,UnitFileState,NeedDaemonReload",
             "--", *names])
        blocks = parse_systemctl_show(out) if rc == 0 else []
        if len(blocks) != len(names):
            raise HostStateError(f"systemctl show could not report the units {names}: "
                                 f"{err.strip() or out[-500:]}")
        for entry, props in zip(p["units"], blocks, strict=True):
            if reason := unit_reason(entry, props):
                units_differ.append({**entry, "reason": reason})
    result["units_differ"] = units_differ

    pip_states = []
    for entry in p["pip"]:
        state = {"python": entry["python"], "purelib": None, "missing": list(entry.get("packages") or []),
                 "files_differ": [{**f, "reason": "no environment"} for f in entry.get("files") or []]}
        if os.access(entry["python"], os.X_OK):
            rc, out, _err = run_command([entry["python"], "-I", "-c", PIP_PROBE])
            if rc == 0:
                probe = json.loads(out.strip().splitlines()[-1])
                dists = {canonical(name): version for name, version in probe["dists"].items()}
                state["purelib"] = probe["purelib"]
                state["missing"] = [r for r in entry.get("packages") or [] if not requirement_met(r, dists)]
                state["files_differ"] = files_differ(entry.get("files") or [], probe["purelib"])
        pip_states.append(state)
    result["pip"] = pip_states

    result["http_differ"] = [{**e, "got": got} for e in p["http"]
                             if (got := http_status(e["url"])) not in allowed_statuses(e)]
    result["torch_envs"] = [env_action(entry, run_command) for entry in p["torch_envs"]]

    differences = ([f"package {n}: not installed" for n in result["packages_missing"]]
                   + [f"package {n}: not held" for n in result["holds_missing"]]
                   + [f"user {e['name']}: {e['reason']}" for e in users_differ]
                   + [f"folder {e['path']}: {e['reason']}" for e in result["directories_differ"]]
                   + [f"file {e['path']}: {e['reason']}" for e in result["files_differ"]]
                   + [f"unit {e['name']}: {e['reason']}" for e in units_differ]
                   + [f"pip {s['python']}: {r} not satisfied" for s in pip_states for r in s["missing"]]
                   + [f"pip {s['python']}: {f['path']}: {f['reason']}"
                      for s in pip_states for f in s["files_differ"]]
                   + [f"{e['url']}: answered {e['got']}, not {allowed_statuses(e)}"
                      for e in result["http_differ"]]
                   + [f"environment {e['path']}: {e['action']} ({e['reason']})"
                      for e in result["torch_envs"] if e["action"] != "none"])
    result["differences"] = differences
    result["ok"] = not differences
    return result
