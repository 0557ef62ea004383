#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""Find the interpreter on a host that has PyTorch (read-only), for every role that needs it.

Why a module: where an image keeps its PyTorch is not one fixed path. Google's Deep Learning VM
images kept it in conda (/opt/conda) until release M128 (March 2025) and in the image's own Python
since; a user may have a conda env, or name an interpreter. So forja never assumes a path: it asks
each candidate interpreter what it has, and picks the first whose PyTorch fits. One module serves
jupyter_colab (the Colab kernel) and trainer_run (the trainer's environment), so both always agree.
The decisions are small pure functions that unit tests feed with real probe output.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: torch_python_facts
short_description: Find the Python interpreter that has PyTorch on a host (read-only)
description:
  - Probes candidate interpreters, in order, and returns the first whose installed C(torch)
    distribution fits I(spec). Each candidate is asked, without importing PyTorch, for its Python
    version, its environment (C(sys.prefix)), its site-packages folders and the installed
    C(torch) version (C(importlib.metadata)), so probing is fast and safe.
  - The candidates are I(candidates) (yours, first) followed, unless I(only_candidates), by the
    places images keep PyTorch (I(default_candidates)) - conda, conda environments, the system
    Python. Glob patterns are expanded on the host; two candidates that are the same environment
    are probed once.
  - With I(probe_cuda), the chosen interpreter imports torch and reports whether CUDA works and
    how many GPUs it sees.
  - Never changes the host; C(changed) is always false. Finding nothing is not an error unless
    I(required) (the caller decides and names its own variable in the message).
version_added: "0.1.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  candidates:
    description:
      - Interpreters to try first, as paths or glob patterns (for example a role variable naming one).
    type: list
    elements: str
    default: []
  default_candidates:
    description:
      - The places images keep PyTorch, tried after I(candidates).
      - C(/opt/conda/bin/python) is where Deep Learning VM images up to M127 (and the C(-conda)
        variants) keep it; C(/usr/bin/python3) is the image's own Python, where the sandbox's
        Deep Learning VM layer keeps it (see the sandbox README for what is and is not confirmed).
    type: list
    elements: str
    default:
      - /opt/conda/bin/python
      - /opt/conda/envs/*/bin/python
      - /usr/bin/python3
      - /usr/local/bin/python3
  only_candidates:
    description: Probe only I(candidates) (an interpreter the user named must be that one).
    type: bool
    default: false
  spec:
    description:
      - Versions of PyTorch that fit, as a PEP 440 specifier (C(==), C(!=), C(>=), C(<=), C(>), C(<),
        C(~=), comma-separated). A local label (C(+cu128)) is ignored. Empty accepts any version.
    type: str
    default: ""
  probe_cuda:
    description: Import torch in the chosen interpreter and report CUDA availability and the GPU count.
    type: bool
    default: false
  required:
    description: Fail when no candidate fits.
    type: bool
    default: false
  state:
    description:
      - The options of M(forja.gpu.host_state) (C(packages), C(files), ...), compared in this same call
        and returned as RV(state), so a role that finds its PyTorch and checks what it installs makes
        one remote call, not two. The comparison runs before the probes.
    type: dict
  gpus:
    description:
      - Also report the host's NVIDIA GPUs as RV(gpus), read as M(forja.gpu.nvidia_facts) reads them (the PCI
        bus and C(nvidia-smi)), so a role that sizes its processes by the GPUs asks the host once.
    type: bool
    default: false
  env:
    description:
      - An environment for M(forja.gpu.forja_torch_env) layered on the interpreter this call finds, compared
        with its record in this same call (as M(forja.gpu.host_state)'s C(torch_envs) compares one), and
        returned as RV(env). A role then calls forja_torch_env only when RV(env.action) is not C(none).
      - Its keys are forja_torch_env's options without C(base_python) and C(pin); the found interpreter is
        the base and its torch is pinned. When none fits, the base is I(env.fallback_python) and
        I(env.fallback_packages) (e.g. a torch wheel) are installed too, with nothing pinned.
    type: dict
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Find the image's PyTorch
  forja.gpu.torch_python_facts:
  register: found_torch

- name: Use the interpreter the user named, and nothing else
  forja.gpu.torch_python_facts:
    candidates: ["{{ my_python }}"]
    only_candidates: true
    spec: ">=2.7,<2.8"
    required: true

- name: Find the image's PyTorch and the setup packages that are missing, in one call
  forja.gpu.torch_python_facts:
    state:
      packages: [python3-venv, util-linux]
  register: found_torch

- name: Show what was found
  ansible.builtin.debug:
    msg: "PyTorch {{ found_torch.torch_version }} at {{ found_torch.python }}"
  when: found_torch.python
"""

RETURN = r"""
python:
  description: The chosen interpreter (as the candidate named it), or null when none fits.
  returned: always
  type: str
  sample: /usr/bin/python3
torch_version:
  description: The chosen interpreter's installed torch version, or null.
  returned: always
  type: str
  sample: 2.7.1
python_version:
  description: The chosen interpreter's Python version, or null.
  returned: always
  type: str
  sample: 3.10.12
prefix:
  description: The chosen interpreter's C(sys.prefix) (its environment), or null.
  returned: always
  type: str
site_dirs:
  description:
    - The chosen interpreter's site-packages folders on C(sys.path), in order.
    - What an environment layered on it must see.
  returned: always
  type: list
  elements: str
  sample: ["/usr/local/lib/python3.10/dist-packages", "/usr/lib/python3/dist-packages"]
cuda:
  description: With I(probe_cuda), whether CUDA works in the chosen interpreter and how many GPUs it sees.
  returned: when probe_cuda and an interpreter was chosen
  type: dict
  contains:
    available: {description: torch.cuda.is_available()., type: bool}
    device_count: {description: torch.cuda.device_count()., type: int}
    error: {description: Why the probe failed (empty when it ran)., type: str}
probed:
  description: Every candidate tried, in order, with what it said (C(path), C(torch), C(fits), C(error), ...).
  returned: always
  type: list
  elements: dict
state:
  description:
    - M(forja.gpu.host_state)'s result for I(state) (C(ok), C(differences), C(packages_missing), ...).
  returned: when state is given
  type: dict
gpus:
  description:
    - With I(gpus), the NVIDIA GPUs on the PCI bus (C(pci_gpus)) and what C(nvidia-smi) says (C(smi),
      with C(ok), C(error) and C(gpus)), as M(forja.gpu.nvidia_facts) returns them.
  returned: when gpus
  type: dict
env:
  description:
    - For I(env), what forja_torch_env would do (C(action) none, create, update, rebuild, or check with the
      C(reason) it cannot tell), the environment's C(python) and C(inputs_hash) as forja_torch_env returns
      them, and C(options), the forja_torch_env options to call it with.
  returned: when env is given
  type: dict
  contains:
    path:
      description: The environment's folder, as given in O(env).
      type: str
    action:
      description:
        - What forja_torch_env would do - C(none), C(create), C(update), C(rebuild), or C(check) when it
          cannot tell.
      type: str
      sample: none
    reason:
      description: Why, in words (for C(check), what stopped the comparison).
      type: str
    python:
      description: The environment's interpreter, as forja_torch_env returns it (absent for C(check)).
      type: str
    inputs_hash:
      description: The hash of the environment's inputs, as forja_torch_env returns it (absent for C(check)).
      type: str
    options:
      description: The forja_torch_env options to call it with.
      type: dict
"""

import glob
import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.forja.gpu.plugins.module_utils.forja_host_state import state_option
from ansible_collections.forja.gpu.plugins.module_utils.forja_nvidia import pci_gpus, run_smi
from ansible_collections.forja.gpu.plugins.module_utils.forja_torch_layer import (
    ARGUMENT_SPEC,
    env_action,
    with_defaults,
)

# Runs in each candidate; it must work on any Python 3 and never import torch (slow, and it may crash).
PROBE = r"""
import json, sys
out = {"python_version": "%d.%d.%d" % tuple(sys.version_info[:3]), "prefix": sys.prefix,
       "executable": sys.executable, "torch": None,
       "site_dirs": [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]}
try:
    from importlib.metadata import version
    out["torch"] = version("torch")
except Exception:
    pass
print(json.dumps(out))
"""

CUDA_PROBE = r"""
import json
import torch
print(json.dumps({"available": bool(torch.cuda.is_available()),
                  "device_count": int(torch.cuda.device_count())}))
"""

_SPEC = re.compile(r"^\s*(~=|==|!=|<=|>=|<|>)\s*([0-9][0-9A-Za-z.*+!-]*)\s*$")


def release(version: str) -> tuple[int, ...]:
    """`2.7.1+cu128` -> (2, 7, 1): the numeric release, without local label or pre/post parts."""
    numbers = []
    for part in version.split("+", 1)[0].split("."):
        match = re.match(r"\d+", part)
        if not match:
            break
        numbers.append(int(match.group()))
        if match.group() != part:
            break
    return tuple(numbers)


def _pad(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def fits(version: str | None, spec: str) -> bool:
    """Whether ``version`` satisfies a PEP 440 specifier set on its release numbers.

    Enough for the specifiers roles use (`>=2.7,<2.8`, `==2.7.*`, `~=2.7.0`); no `packaging`
    dependency on the host. Raises ValueError for a clause it cannot read.
    """
    if not version:
        return False
    have = release(version)
    for clause in filter(None, (c.strip() for c in (spec or "").split(","))):
        match = _SPEC.match(clause)
        if not match:
            raise ValueError(f"cannot read the version specifier {clause!r} (use e.g. '>=2.7,<2.8')")
        op, raw = match.groups()
        if raw.endswith(".*"):
            prefix = release(raw[:-2])
            same = have[:len(prefix)] == prefix
            if (op == "==" and not same) or (op == "!=" and same):
                return False
            if op not in ("==", "!="):
                raise ValueError(f"'{op}' does not take a wildcard: {clause!r}")
            continue
        a, b = _pad(have, release(raw))
        ok = {"==": a == b, "!=": a != b, "<=": a <= b, ">=": a >= b, "<": a < b, ">": a > b}.get(op)
        if op == "~=":
            want = release(raw)
            if len(want) < 2:
                raise ValueError(f"'~=' needs at least two numbers: {clause!r}")
            ok = a >= b and have[:len(want) - 1] == want[:-1]
        if not ok:
            return False
    return True


def expand(candidates: list[str], exists=os.path.exists) -> list[str]:
    """Candidates in order, glob patterns expanded (sorted), missing paths dropped, duplicates once."""
    seen: list[str] = []
    for candidate in candidates:
        paths = sorted(glob.glob(candidate)) if glob.has_magic(candidate) else [candidate]
        for path in paths:
            if path not in seen and exists(path):
                seen.append(path)
    return seen


def parse_probe(stdout: str) -> dict:
    """The probe's JSON (its last line: interpreters may print warnings before it)."""
    lines = [line for line in (stdout or "").splitlines() if line.strip()]
    if not lines:
        raise ValueError("the interpreter printed nothing")
    return json.loads(lines[-1])


def choose(probed: list[dict]) -> dict | None:
    """The first probed candidate that fits, or None."""
    return next((p for p in probed if p.get("fits")), None)


def probe_all(module: AnsibleModule, paths: list[str], spec: str) -> list[dict]:
    probed: list[dict] = []
    prefixes: set[str] = set()
    for path in paths:
        entry: dict = {"path": path, "torch": None, "fits": False, "error": ""}
        if not os.access(path, os.X_OK):
            entry["error"] = "not executable"
            probed.append(entry)
            continue
        rc, out, err = module.run_command([path, "-I", "-c", PROBE],
                                          environ_update={"PYTHONWARNINGS": "ignore"})
        if rc != 0:
            entry["error"] = (err or out).strip()[-500:] or f"exit {rc}"
            probed.append(entry)
            continue
        try:
            info = parse_probe(out)
        except ValueError as exc:
            entry["error"] = f"unreadable probe output: {exc}"
            probed.append(entry)
            continue
        if info.get("prefix") in prefixes:
            continue  # the same environment under another name
        prefixes.add(info.get("prefix"))
        entry.update(info)
        entry["fits"] = fits(entry["torch"], spec)
        probed.append(entry)
    return probed


def layered_env(module: AnsibleModule, env: dict, found: str | None) -> dict:
    """The `env` option's environment on the found interpreter (or the fallback), and its action.

    Why here: whether the trainer's environment is up to date depends on the interpreter this call
    picks, so comparing it in the same call spares the role a forja_torch_env call on every re-run.
    """
    fallback = {"fallback_python": "/usr/bin/python3", "fallback_packages": []}
    unknown = sorted(set(env) - (set(ARGUMENT_SPEC) - {"base_python", "pin"}) - set(fallback))
    if unknown or not env.get("path"):
        module.fail_json(msg=f"env: give path and any of forja_torch_env's options other than base_python "
                             f"and pin, or fallback_python/fallback_packages (unknown: {unknown})")
    wanted = {**fallback, **env}
    options = {name: value for name, value in wanted.items() if name not in fallback}
    options["packages"] = list(options.get("packages") or [])
    if found:
        options.update(base_python=found, pin=["torch"])
    else:
        options.update(base_python=wanted["fallback_python"], pin=[],
                       packages=list(wanted["fallback_packages"] or []) + options["packages"])
    options = with_defaults(options)
    return {**env_action(options, module.run_command), "options": options}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "candidates": {"type": "list", "elements": "str", "default": []},
            "default_candidates": {"type": "list", "elements": "str",
                                   "default": ["/opt/conda/bin/python", "/opt/conda/envs/*/bin/python",
                                               "/usr/bin/python3", "/usr/local/bin/python3"]},
            "only_candidates": {"type": "bool", "default": False},
            "spec": {"type": "str", "default": ""},
            "probe_cuda": {"type": "bool", "default": False},
            "required": {"type": "bool", "default": False},
            "state": {"type": "dict"},
            "gpus": {"type": "bool", "default": False},
            "env": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        fits("0", params["spec"])
    except ValueError as exc:
        module.fail_json(msg=f"spec: {exc}")
    state = state_option(module)
    wanted = list(params["candidates"])
    if not params["only_candidates"]:
        wanted += params["default_candidates"]
    probed = probe_all(module, expand(wanted), params["spec"])
    chosen = choose(probed)
    result: dict = {
        "changed": False,
        "python": chosen["path"] if chosen else None,
        "torch_version": chosen["torch"] if chosen else None,
        "python_version": chosen.get("python_version") if chosen else None,
        "prefix": chosen.get("prefix") if chosen else None,
        "site_dirs": chosen.get("site_dirs", []) if chosen else [],
        "probed": probed,
    }
    if state is not None:
        result["state"] = state
    if params["gpus"]:
        result["gpus"] = {"pci_gpus": pci_gpus(), "smi": run_smi(module, "nvidia-smi")}
    if params["env"] is not None:
        result["env"] = layered_env(module, params["env"], chosen["path"] if chosen else None)
    if chosen and params["probe_cuda"]:
        rc, out, err = module.run_command([chosen["path"], "-c", CUDA_PROBE],
                                          environ_update={"PYTHONWARNINGS": "ignore"})
        try:
            result["cuda"] = {**parse_probe(out), "error": ""} if rc == 0 else {
                "available": False, "device_count": 0, "error": (err or out).strip()[-500:]}
        except ValueError as exc:
            result["cuda"] = {"available": False, "device_count": 0, "error": str(exc)}
    if params["required"] and not chosen:
        tried = "; ".join(f"{p['path']}: torch {p['torch'] or 'none'}"
                          + (f" ({p['error']})" if p["error"] else "") for p in probed)
        tried = tried or "no candidate exists"
        module.fail_json(msg=f"no interpreter with PyTorch{' ' + params['spec'] if params['spec'] else ''} "
                             f"among {wanted}: {tried}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
