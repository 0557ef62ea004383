"""Where forja's things are: its Ansible content (`REPO_ROOT`) and the user's forja folder (`forja_home`).

Why a module of their own: nearly every part of forja needs one of these two paths, and most of those
parts run no play (the inventory reader, the host contract, the history, a role's `python -m
forja.record`). Kept here, with nothing but the standard library, they pull neither
ansible-runner nor the events into those processes, and they tie no module to the runner.

Two ways forja exists on a machine, and one rule for both:

- a clone (or an editable install of one): the content is the repository itself, and Ansible finds
  ansible.cfg in it (every Ansible process forja starts runs there) and the collection forja.gpu
  through the clone's link collections/ansible_collections/forja/gpu;
- an installed wheel (`pipx install forja`, `pip install forja`): setup.py copies the same content
  (playbooks/, roles/, plugins/, meta/, ansible.cfg, galaxy.yml, site.yml, inventory/, trainer/) into
  the package, as an installed collection: forja/_collection/ansible_collections/forja/gpu. A wheel
  cannot hold the clone's link, so forja names the collection's path and its ansible.cfg to every
  Ansible process it starts (`ansible_env`), from whatever folder the user runs forja in.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
#: The collections path of an installed copy: the content that setup.py copies into the wheel.
SHIPPED_COLLECTIONS = _PACKAGE / "_collection"
#: forja.gpu inside it (the installed copy's REPO_ROOT).
SHIPPED_ROOT = SHIPPED_COLLECTIONS / "ansible_collections" / "forja" / "gpu"
#: Where Ansible looks for collections after forja's own (ansible.cfg's collections_path says the same).
USUAL_COLLECTIONS = ("~/.ansible/collections", "/usr/share/ansible/collections")


def _root() -> Path:
    """FORJA_ROOT when set; else the content shipped inside an installed wheel; else the clone."""
    if os.environ.get("FORJA_ROOT"):
        return Path(os.environ["FORJA_ROOT"])
    return SHIPPED_ROOT if SHIPPED_ROOT.is_dir() else _PACKAGE.parent


#: forja's Ansible content: playbooks/, roles/, plugins/ and ansible.cfg live here. The repository
#: (a clone), the installed copy's forja/_collection/ansible_collections/forja/gpu, or FORJA_ROOT.
REPO_ROOT = _root()


def ansible_env(root: Path | None = None) -> dict[str, str]:
    """What every Ansible process forja starts (plays, `ansible-inventory`) needs in its environment
    to find forja's ansible.cfg and the collection forja.gpu, whatever folder forja runs in.

    A clone needs nothing: its processes run in the clone, where Ansible reads ansible.cfg, whose
    collections_path finds forja.gpu through the clone's link. Content without that link (an
    installed wheel, or a FORJA_ROOT that is an installed collection) gets ANSIBLE_CONFIG (its
    ansible.cfg) and ANSIBLE_COLLECTIONS_PATH (the folder holding ansible_collections/forja/gpu,
    then the usual paths), so `forja.gpu.gcp_gpu` is a known plugin from any folder.
    """
    root = (root or REPO_ROOT).resolve()
    if (root / "collections" / "ansible_collections" / "forja" / "gpu").exists():
        return {}
    env: dict[str, str] = {}
    if (root / "ansible.cfg").is_file():
        env["ANSIBLE_CONFIG"] = str(root / "ansible.cfg")
    if root.parts[-3:] == ("ansible_collections", "forja", "gpu"):
        env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join([str(root.parents[2]), *USUAL_COLLECTIONS])
    return env


def forja_home() -> Path:
    """The user's forja folder (history, runner data); FORJA_HOME overrides it (tests use a temp dir)."""
    return Path(os.environ.get("FORJA_HOME") or Path.home() / ".local" / "share" / "forja").resolve()


def config_home() -> Path:
    """The user's forja settings folder: $XDG_CONFIG_HOME/forja, else ~/.config/forja (where
    `forja init` writes the inventory that forja uses when no other is named)."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    return (Path(base) if base and Path(base).is_absolute() else Path.home() / ".config") / "forja"


def user_inventory() -> Path:
    """The inventory `forja init` writes by default, and forja's default when it exists."""
    return config_home() / "inventory"
