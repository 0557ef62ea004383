"""The wheel carries forja's Ansible content, so an installed forja works without a clone.

pyproject.toml says everything else; this file adds one step to setuptools' build_py: it copies the
content (`CONTENT`: the collection forja.gpu's playbooks, roles, plugins and meta, with ansible.cfg,
galaxy.yml, site.yml, the inventories and the trainer its trainer_run role bundles) into the wheel as
an installed collection, forja/_collection/ansible_collections/forja/gpu. Why a copy and not package
data: the content lives at the repository's root (the root is the collection), outside every Python
package, and a clone must keep it there. Why that layout: Ansible finds a collection only under
<path>/ansible_collections/<namespace>/<name>, and the clone's link to it cannot go into a wheel;
forja.paths names that path to every Ansible process forja starts. An editable install copies
nothing: it runs from the clone, which is its own content.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

#: What an installed forja needs of the repository root, in the wheel at SHIPPED (forja/paths.py).
CONTENT = ("ansible.cfg", "galaxy.yml", "site.yml", "meta", "playbooks", "plugins", "roles", "inventory",
           "trainer")
SHIPPED = Path("forja", "_collection", "ansible_collections", "forja", "gpu")
#: Never content: caches of the Python that ran in the clone.
LEFT_OUT = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")


class BuildWithContent(build_py):
    """build_py, then the Ansible content copied into the build as the installed collection."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        root = Path(__file__).resolve().parent
        target = Path(self.build_lib) / SHIPPED
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for name in CONTENT:
            source = root / name
            if not source.exists():
                raise SystemExit(f"setup.py: {source} is missing; the wheel would lack forja's content")
            if source.is_dir():
                # links are followed: inventory/sandbox's shared group_vars become files in the wheel
                shutil.copytree(source, target / name, ignore=LEFT_OUT, symlinks=False)
            else:
                shutil.copy2(source, target / name)


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildWithContent})
