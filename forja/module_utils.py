"""The one place forja loads a file of forja's Ansible ``plugins/module_utils`` by path.

Between forja's Python and its Ansible content there is one direction: forja reads Ansible's
module_utils, and nothing under ``plugins/`` imports forja, so the collection works installed on its
own (``ansible-galaxy collection install``) with no forja package beside it.

Why by path: some facts and logic must live in module_utils, the only code an Ansible module may
ship (AnsiballZ) and the code the collection's filters import the Ansible way, yet forja needs the
same code on the controller: the machine catalog, the price table and its rate rules
(``forja.cost``), how figures are shown (``forja.format``), the dataset push. Those files import
nothing but the standard library, their siblings and well-known clients, never Ansible or forja, so
forja loads them as plain modules from the root the playbooks are run from (FORJA_ROOT or the clone)
instead of keeping copies that drift. A file that needs a sibling imports it the Ansible way first
and by its bare name otherwise (``from forja_files import ...``); forja loads that sibling first
under its own name. forja imports no plugin code as a package, and does not put ``plugins/`` on
``sys.path``: the ``ansible_collections`` names belong to Ansible's collection loader.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from forja import errors

#: The folder, relative to forja's Ansible content (the repository / collection root).
MODULE_UTILS = Path("plugins") / "module_utils"
#: The collection's controller-only shared code (what filters import but no module ships to a host).
PLUGIN_UTILS = Path("plugins") / "plugin_utils"


def path_of(stem: str, folder: Path = MODULE_UTILS) -> Path:
    """Where <folder>/<stem>.py is under the root forja runs the playbooks from."""
    from forja.paths import REPO_ROOT

    return REPO_ROOT / folder / f"{stem}.py"


def load(stem: str, module_name: str | None = None, folder: Path = MODULE_UTILS) -> ModuleType:
    """module_utils/<stem>.py (or `folder`'s), loaded once, registered as ``module_name`` (default: ``stem``).

    A file that imports a sibling by name (``from forja_files import ...``) needs that sibling
    loaded first under its own stem; the caller does that. ``load(stem)`` and
    ``load(stem, stem)`` are the same module.
    """
    return _load(stem, module_name or stem, folder)


@functools.cache
def _load(stem: str, name: str, folder: Path) -> ModuleType:
    path = path_of(stem, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise errors.ConfigError(
            stem,
            f"{path} does not exist; run forja from its checkout or set FORJA_ROOT to the folder "
            "that holds playbooks/ and plugins/",
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)  # no half-built module left behind for the next import
        raise
    return module
