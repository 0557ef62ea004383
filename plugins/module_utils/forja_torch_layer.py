# Copyright: forja contributors
# Apache-2.0
"""forja_torch_env's record and its inputs' hash, shared with host_state's check of an environment.

Why here: whether a layered environment is up to date is decided by its record (the inputs' hash
forja_torch_env wrote when it finished). host_state reads the same record and computes the same
hash in the call that compares the rest of a role's host state, so a role calls forja_torch_env
only for an environment that is missing or out of date; one copy of the rule keeps both answers equal.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable

RECORD = ".forja-env.json"
CONSTRAINTS = "forja-constraints.txt"
LAYER_PTH = "_forja_layer.pth"

# forja_torch_env's options, and each host_state torch_envs entry's (with the same defaults).
ARGUMENT_SPEC: dict[str, dict] = {
    "base_python": {"type": "path", "required": True},
    "path": {"type": "path", "required": True},
    "packages": {"type": "list", "elements": "str", "default": []},
    "requirements": {"type": "path"},
    "pin": {"type": "list", "elements": "str", "default": ["torch"]},
    "pip_package": {"type": "str", "default": ""},
    "pip_args": {"type": "str", "default": ""},
    "owner": {"type": "str"},
    "mutable": {"type": "bool", "default": False},
}

# Run in the base interpreter: its real Python, its site folders, the versions of the pinned names.
BASE_PROBE = r"""
import json, sys
from importlib.metadata import version
names = json.loads(sys.argv[1])
pins = {}
for name in names:
    try:
        pins[name] = version(name)
    except Exception:
        pass
print(json.dumps({"base_executable": getattr(sys, "_base_executable", sys.executable),
                  "python_version": "%d.%d" % tuple(sys.version_info[:2]),
                  "site_dirs": [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))],
                  "pins": pins}))
"""

RunCommand = Callable[[list[str]], tuple[int, str, str]]


class TorchLayerError(Exception):
    """An input that cannot be read: the message names the option and what was wrong."""


def with_defaults(entry: dict) -> dict:
    """An entry as forja_torch_env's argument spec would hand it over (defaults filled in)."""
    params = {name: entry.get(name, spec.get("default")) for name, spec in ARGUMENT_SPEC.items()}
    for name in ("base_python", "path", "requirements"):
        if params[name]:
            params[name] = os.path.expanduser(os.path.expandvars(str(params[name])))
    return params


def pip_tail(out: str, err: str, lines: int = 25) -> str:
    text = "\n".join(x for x in (out or "", err or "") if x.strip())
    return "\n".join(text.strip().splitlines()[-lines:])


def read_requirements(path: str | None) -> str:
    if not path:
        return ""
    try:
        with open(path) as fh:
            return fh.read()
    except OSError as exc:
        raise TorchLayerError(f"requirements: cannot read {path}: {exc}") from exc


def probe_base(run_command: RunCommand, base_python: str, pin: list[str]) -> dict:
    """What the environment is layered on: the base's executable, version, site folders and pins."""
    if not os.access(base_python, os.X_OK):
        raise TorchLayerError(f"base_python: {base_python} is not an executable interpreter on the host")
    rc, out, err = run_command([base_python, "-I", "-c", BASE_PROBE, json.dumps(pin)])
    if rc != 0:
        raise TorchLayerError(f"base_python: {base_python} could not be asked for its packages: "
                              f"{pip_tail(out, err)}")
    return json.loads(out.strip().splitlines()[-1])


def constraints_text(pins: dict[str, str]) -> str:
    """`torch==2.7.1` lines, sorted, with a header saying why."""
    lines = ["# forja: the base interpreter's versions; nothing installed here may replace them."]
    lines += [f"{name}=={pins[name]}" for name in sorted(pins)]
    return "\n".join(lines) + "\n"


def layer_pth_text(site_dirs: list[str]) -> str:
    """The .pth that makes the environment see the base's packages, after its own."""
    return "".join(f"{d}\n" for d in site_dirs)


def inputs_hash(base: dict, params: dict, requirements_text: str) -> str:
    """Everything the environment is built from; a different hash means build (or update) again."""
    blob = json.dumps({"base": base, "packages": params["packages"], "requirements": requirements_text,
                       "pip_package": params["pip_package"], "pip_args": params["pip_args"],
                       "owner": params["owner"]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def plan(record: dict | None, wanted_hash: str, mutable: bool) -> str:
    """What to do given the existing record: none, create, update or rebuild."""
    if record is None:
        return "create"
    if record.get("inputs_hash") == wanted_hash:
        return "none"
    return "update" if mutable else "rebuild"


def read_record(path: str) -> dict | None:
    try:
        with open(os.path.join(path, RECORD)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


# Why plan() chose each action, for people (host_state's differences).
ACTION_REASONS = {"none": "", "create": "no finished environment (no record)",
                  "update": "its inputs changed since it was built",
                  "rebuild": "its inputs changed since it was built"}


def env_action(entry: dict, run_command: RunCommand) -> dict:
    """What forja_torch_env would do with `entry` (its options): none, create, update or rebuild.

    An input it cannot read (no base interpreter, an unreadable requirements file) is reported as
    `check` with the reason: forja_torch_env then runs and fails with that message.
    """
    params = with_defaults(entry)
    try:
        requirements = read_requirements(params["requirements"])
        base = probe_base(run_command, params["base_python"], params["pin"])
    except TorchLayerError as exc:
        return {"path": params["path"], "action": "check", "reason": str(exc)}
    wanted = inputs_hash(base, params, requirements)
    action = plan(read_record(params["path"]), wanted, params["mutable"])
    # python and inputs_hash as forja_torch_env returns them, so a role that skips it for an
    # environment found up to date reads the same keys from this answer.
    return {"path": params["path"], "action": action, "reason": ACTION_REASONS[action],
            "python": os.path.join(params["path"], "bin", "python"), "inputs_hash": wanted}
