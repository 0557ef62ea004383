"""forja's machine catalog, read from its one home: ``plugins/module_utils/forja_gcp_machines.py``.

Why there: the gcp_gpu_instance module may only use what AnsiballZ ships (module_utils), so the
table must live in module_utils; that file is plain data plus the standard library, with no
Ansible import. forja's cost code and the sandbox's Compute emulator read the same table through
this loader, by file path, instead of keeping copies that drift (the price rules in
module_utils/forja_cost.py read it as their sibling). forja imports no plugin code
as a package: this is the one place that loads the file, and only the data is used.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from forja import module_utils

#: The catalog's file stem under plugins/module_utils; loaded under that name, as its siblings that
#: import it (forja_cost.py, forja_vertex.py) find it when forja loads them by path.
CATALOG_STEM = "forja_gcp_machines"


def catalog_path() -> Path:
    """Where the catalog is: under the same root the playbooks are run from (FORJA_ROOT or the clone)."""
    return module_utils.path_of(CATALOG_STEM)


def catalog() -> ModuleType:
    """The catalog module, loaded once. Its ``MACHINE_TYPES`` maps a name to a ``MachineType``."""
    return module_utils.load(CATALOG_STEM)


def machine_types() -> dict[str, Any]:
    """Every machine type forja knows, by name."""
    return dict(catalog().MACHINE_TYPES)


def machine_type(name: str) -> Any | None:
    """The catalog's entry for a machine type (``vcpus``, ``memory_mb``, ``gpu_type``, ``gpu_count``,
    ``key`` for the price table), or None for one forja does not know."""
    return catalog().MACHINE_TYPES.get(name)
