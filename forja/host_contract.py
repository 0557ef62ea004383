"""The host contract, read from its one home: ``roles/host_contract/defaults/main.yml``.

What forja's roles and its Python agree on about a host (Jupyter's port and token file, the run
folder, what a run name may be, which run statuses are final) is defined once, as the defaults of
the defaults-only role ``forja.gpu.host_contract``, which jupyter_colab, autostop and trainer_run
depend on. The roles read the variables; Python reads the same file here, once, on first use, so
importing forja needs no checkout and a changed value reaches both sides.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml

from forja import errors

#: The contract's file, relative to forja's Ansible content (the repository / collection root).
CONTRACT_FILE = Path("roles") / "host_contract" / "defaults" / "main.yml"
PREFIX = "host_contract_"


def contract_path() -> Path:
    """Under the same root the playbooks are run from (FORJA_ROOT or the clone)."""
    from forja.paths import REPO_ROOT

    return REPO_ROOT / CONTRACT_FILE


@functools.cache
def defaults() -> dict[str, Any]:
    """The contract's variables without their prefix (``jupyter_port``, ``run_dir``, ...)."""
    path = contract_path()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError as exc:
        raise errors.ConfigError(
            "host contract",
            f"{path} does not exist; run forja from its checkout or set FORJA_ROOT to the folder "
            "that holds playbooks/ and roles/",
        ) from exc
    return {key.removeprefix(PREFIX): value for key, value in data.items()}


def value(name: str) -> Any:
    """One contract variable by its short name, e.g. ``value("jupyter_port")``."""
    found = defaults()
    if name not in found:
        raise KeyError(f"{PREFIX}{name} is not in {CONTRACT_FILE} (known: {', '.join(sorted(found))})")
    return found[name]


@functools.cache
def run_name_pattern() -> re.Pattern[str]:
    """What a run name may be (a systemd instance name and a folder name)."""
    return re.compile(value("run_name_pattern"))


@functools.cache
def final_statuses() -> frozenset[str]:
    """Run statuses after which a run changes no more (until something starts it again)."""
    return frozenset(value("run_final_statuses"))
