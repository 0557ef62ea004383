#!/usr/bin/python
"""Everything a role needs to know about a host's state, asked in one remote call (read-only).

Why a module: a role that checks each package, folder, file, pip requirement and service with its
own task makes one remote call per thing, 0.2-0.4 s each, on every run, even when nothing has
changed; a re-run of site.yml took ~30x a play that only connects. One call that reports what is
missing or different lets the roles run their install and repair tasks only for that, and skip
them (no remote call) when the host is as it should be. The comparisons are the ones the repair
modules make (dpkg state, owner/group/mode, SHA-1 of the content as the template and copy modules
compute it, systemd's own view of a unit, pip's requirement specifiers), so a deleted unit file, a
stopped service or a changed config is reported and then repaired: nothing is taken on trust.
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

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.forja.gpu.plugins.module_utils.forja_dpkg import (
    dpkg_held,
    dpkg_installed,
    dpkg_query,
)

DOCUMENTATION = r"""
---
module: host_state
short_description: Report in one call which packages, users, folders, files, services and URLs differ
description:
  - Compares the host with what a role wants and returns what is missing or different, so that the
    role runs its install and repair tasks only for that. Never changes the host; C(changed) is
    always false, also in check mode.
  - Packages are asked of dpkg (one C(dpkg-query)); units of systemd (one C(systemctl show));
    pip requirements of the environment's own interpreter (one call per environment).
  - A file differs when it is missing, is not a regular file, or its owner, group, mode, SHA-1 or
    required text differ; a folder when it is missing or its owner, group or mode differ.
version_added: "0.1.0"
author: forja
options:
  packages:
    description: Debian packages that must be installed.
    type: list
    elements: str
    default: []
  holds:
    description:
      - Debian packages that must be on hold when they are installed (those not installed are only
        reported as such).
    type: list
    elements: str
    default: []
  users:
    description: Users that must exist; C(home) and C(shell), when given, must match.
    type: list
    elements: dict
    default: []
  directories:
    description:
      - Folders that must exist, each C(path) with optional C(owner), C(group) and C(mode) (octal string).
    type: list
    elements: dict
    default: []
  files:
    description:
      - Regular files that must exist, each C(path) with optional C(owner), C(group), C(mode) (octal string),
        C(checksum) (SHA-1 of the whole content, as ansible's copy and template modules compute it) and
        C(contains) (text the file must hold).
    type: list
    elements: dict
    default: []
  exists:
    description: Paths whose presence is only reported (true or false), never counted as a difference.
    type: list
    elements: path
    default: []
  units:
    description:
      - systemd units, each C(name) with optional C(enabled) and C(active) (booleans). A unit that is
        not found, or whose file changed since systemd last read it, differs too.
    type: list
    elements: dict
    default: []
  pip:
    description:
      - Python environments, each C(python) (its interpreter), C(packages) (requirement specifiers that
        must be satisfied) and optional C(files) (entries as in I(files), with paths relative to the
        environment's site-packages folder, e.g. a patched module).
    type: list
    elements: dict
    default: []
  http:
    description:
      - URLs fetched from the host (GET, no proxy), each C(url) with C(status), the HTTP status codes
        that count as right.
    type: list
    elements: dict
    default: []
notes:
  - Supports check mode; it is read-only either way.
"""

EXAMPLES = r"""
- name: Check the service's packages, files and unit in one call
  forja.gpu.host_state:
    packages: [python3-venv]
    directories:
      - {path: /etc/forja/jupyter, owner: root, group: jupyter, mode: "0750"}
    files:
      - path: /etc/systemd/system/forja-jupyter.service
        checksum: "{{ lookup('ansible.builtin.template', 'forja-jupyter.service.j2') | hash('sha1') }}"
        owner: root
        group: root
        mode: "0644"
    units:
      - {name: forja-jupyter.service, enabled: true, active: true}
    pip:
      - python: /opt/forja/jupyter/bin/python
        packages: [notebook==6.5.7]
  register: state

- name: Install what is missing
  ansible.builtin.apt:
    name: "{{ state.packages_missing }}"
  when: state.packages_missing | length > 0
"""

RETURN = r"""
ok:
  description: True when nothing differs (every list below is empty).
  returned: always
  type: bool
differences:
  description: One line per difference, for people (never file contents).
  returned: always
  type: list
  elements: str
packages_missing:
  description: The packages of I(packages) that are not installed.
  returned: always
  type: list
  elements: str
holds_installed:
  description: The packages of I(holds) that are installed.
  returned: always
  type: list
  elements: str
holds_missing:
  description: The installed packages of I(holds) that are not on hold.
  returned: always
  type: list
  elements: str
users_differ:
  description: The entries of I(users) that differ, each with C(reason).
  returned: always
  type: list
  elements: dict
directories_differ:
  description: The entries of I(directories) that differ, each with C(reason).
  returned: always
  type: list
  elements: dict
files_differ:
  description: The entries of I(files) that differ, each with C(reason).
  returned: always
  type: list
  elements: dict
exists:
  description: Each path of I(exists), true when it exists.
  returned: always
  type: dict
units_differ:
  description: The entries of I(units) that differ, each with C(reason).
  returned: always
  type: list
  elements: dict
pip:
  description: For each entry of I(pip), C(python), C(purelib) (null when the interpreter does not run),
    C(missing) (unsatisfied requirements) and C(files_differ).
  returned: always
  type: list
  elements: dict
http_differ:
  description: The entries of I(http) that answered another status, each with C(got) (null when unreachable).
  returned: always
  type: list
  elements: dict
"""

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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "list", "elements": "str", "default": []},
            "holds": {"type": "list", "elements": "str", "default": []},
            "users": {"type": "list", "elements": "dict", "default": []},
            "directories": {"type": "list", "elements": "dict", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "exists": {"type": "list", "elements": "path", "default": []},
            "units": {"type": "list", "elements": "dict", "default": []},
            "pip": {"type": "list", "elements": "dict", "default": []},
            "http": {"type": "list", "elements": "dict", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    for field in ("users", "directories", "files", "units", "pip", "http"):
        key = {"users": "name", "units": "name", "pip": "python", "http": "url"}.get(field, "path")
        for index, entry in enumerate(p[field]):
            if not entry.get(key):
                module.fail_json(msg=f"{field}[{index}] has no {key!r}: each entry needs one ({entry!r})")
    result: dict = {"changed": False}

    wanted = list(dict.fromkeys(p["packages"] + p["holds"]))
    installed: list[str] = []
    held: list[str] = []
    if wanted:
        _rc, out, _err = module.run_command(dpkg_query(wanted))  # rc 1: some are unknown, i.e. missing
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
        rc, out, err = module.run_command(
            ["systemctl", "show", "--property=Id,LoadState,ActiveState,UnitFileState,NeedDaemonReload",
             "--", *names])
        blocks = parse_systemctl_show(out) if rc == 0 else []
        if len(blocks) != len(names):
            module.fail_json(msg=f"systemctl show could not report the units {names}: "
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
            rc, out, _err = module.run_command([entry["python"], "-I", "-c", PIP_PROBE])
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
                      for e in result["http_differ"]])
    result["differences"] = differences
    result["ok"] = not differences
    module.exit_json(**result)


if __name__ == "__main__":
    main()
