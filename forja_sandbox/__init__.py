"""The local sandbox cloud: real local hosts (systemd-nspawn) and a Compute API emulator.

It sits beside the product: `forja_sandbox` imports `forja`, never the reverse, and its own
dependencies are the `sandbox` extra of the `forja` distribution. The wheel carries this package
either way (an extra adds dependencies, not code), so importing it checks that extra first and
fails with the one fix, instead of failing later inside a background emulator.
"""

from __future__ import annotations

import importlib.metadata
import re

#: The extra that carries the sandbox's dependencies (pyproject.toml lists them: their one home).
EXTRA = "sandbox"


def missing_requirements(distribution: str = "forja", extra: str = EXTRA) -> list[str]:
    """The names of `extra`'s requirements that are not installed (empty when the extra is complete).

    Read from the installed distribution's metadata, so the list of packages is pyproject.toml's.
    A source tree that was never installed has no metadata: nothing is reported missing then.
    """
    try:
        requires = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    missing = []
    for requirement in requires:
        spec, _, marker = requirement.partition(";")
        if not re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", marker):
            continue
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec.strip())
        if name is None:
            continue
        try:
            importlib.metadata.distribution(name.group(0))
        except importlib.metadata.PackageNotFoundError:
            missing.append(name.group(0))
    return missing


_missing = missing_requirements()
if _missing:
    raise ImportError(
        f"the forja sandbox needs the `{EXTRA}` extra ({', '.join(_missing)} not installed): "
        f"pip install 'forja[{EXTRA}]'"
    )
