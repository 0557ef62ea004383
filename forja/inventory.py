"""The Ansible inventory as plain values: the one reader every part of forja uses.

Why one reader: `ansible-inventory --list` (ansible-core 2.19) writes every value it does not
trust, which is everything an inventory *plugin* such as `gcp_gpu` sets, as
`{"__ansible_unsafe": "10.213.0.20"}`, and it merges the fact cache into each host's variables.
Read naively, `forja tunnel` printed `ansible@{'__ansible_unsafe': ...}` and `forja cost` choked on
timestamps. Here, once for all readers (`Forja.hosts()`, `forja tunnel`, `forja cost`, the
stopped-VM check):

- the markers are removed, so every value is the plain JSON value the inventory holds;
- facts are kept out (ansible-inventory runs with `INJECT_FACT_VARS` off and the `ansible_facts`
  namespace is dropped), so a filled fact cache never changes what forja reads.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from forja import errors
from forja import format as fmt

#: The key ansible-core's legacy inventory JSON profile wraps untrusted values in.
UNSAFE_MARKER = "__ansible_unsafe"
#: Where the fact cache shows up once facts are not injected as top-level variables.
FACT_KEYS = ("ansible_facts", "ansible_local")
#: Compute Engine statuses in which the VM cannot answer SSH although the instance exists.
STOPPED_STATUSES = frozenset({"STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED"})
#: The guest attribute the autostop agent writes when it stops the VM (roles/autostop:
#: autostop_guest_attribute); the gcp_gpu inventory exposes a stopped VM's as `guest_attributes`.
STOP_REASON_ATTRIBUTE = "forja/autostop"

#: What Ansible says when a source does not parse (STRICT_INVENTORY makes it fatal;
#: ansible/inventory/manager.py), and the first plugin's reason, from its warnings on stderr or from
#: forja.runner's output tail (lines joined with spaces).
_UNPARSED = re.compile(r"Completely failed to parse inventory source (?P<source>.+?)(?= Failed to parse "
                       r"inventory with |\s*\n|\s*$| \[WARNING\]| \[ERROR\])")
#: One plugin's reason: up to the end of its line (stderr), or to the next message (a joined output tail).
_REASON = re.compile(r"Failed to parse inventory with '(?P<plugin>[^']+)' plugin: (?P<reason>.+?)"
                     r"(?=\n| \[WARNING\]| \[ERROR\]| ERROR!| Failed to parse inventory with |$)")
#: An inventory plugin as Ansible names it when it loaded it by path (2.19): shown as the user wrote it.
_PLUGIN_MODULE = re.compile(r"ansible_collections\.(\w+)\.(\w+)\.plugins\.inventory\.(\w+)")
#: What Ansible's other plugins say about a file that is not theirs: never the cause (the `constructed`
#: fallback reads every .yml, the `yaml` one every plugin config, the `ini` one every YAML file).
_NOISE = ("Incorrect plugin name in file", "Plugin configuration YAML file, not YAML inventory",
          "no root 'plugin' key found", "is normally a sign this is a YAML file",
          "ending in ':' is not allowed")
#: forja's own inventory plugins (plugins/inventory/): a config of any other is not a forja inventory.
FORJA_PLUGINS = ("forja.gpu.gcp_gpu", "forja.gpu.inventory_required")
#: The keys of a group in a YAML inventory (Ansible's yaml plugin skips, with a warning, any other).
_GROUP_KEYS = frozenset({"hosts", "vars", "children"})

#: Set for every Ansible process forja starts (forja.runner's plays, `read` here): an inventory source
#: that exists but does not parse stops Ansible, the one source of `-i` and each of several alike;
#: Ansible's default only warns and goes on with an empty or partial inventory ("nothing is running").
#: `unparsed` turns what Ansible then says into forja's error. Not in ansible.cfg: Ansible run by hand
#: over several sources (the gcp_gpu plugin's tests) still reports every failing one.
STRICT_INVENTORY = {"ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
                    "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True"}

Inventory = str | Path | Sequence[str | Path] | None
#: What names the inventory when none is given: the CLI's `-i` and `Forja(inventory=)` alike.
INVENTORY_ENV = "FORJA_INVENTORY"


def chosen(inventory: Inventory = None) -> str | list[str] | None:
    """The inventory a command acts on, as absolute paths: the one given, else $FORJA_INVENTORY, else
    the user's own (`forja init`'s ~/.config/forja/inventory, under $XDG_CONFIG_HOME when set) when
    it exists.

    The one rule for the CLI and the API, so `forja -i X`, `FORJA_INVENTORY=X forja` and
    `Forja(inventory=X)` act on the same hosts. The user's own inventory is a default because the
    user wrote it for this purpose (`forja init`), unlike ansible.cfg's, which chooses nothing.
    None when nothing names one (see `required`).
    """
    if inventory is None:
        inventory = os.environ.get(INVENTORY_ENV) or None
    if inventory is None and not os.environ.get("ANSIBLE_INVENTORY"):
        from forja.paths import user_inventory

        own = user_inventory()
        inventory = own if own.exists() else None
    if inventory is None:
        return None
    if isinstance(inventory, str | Path):
        return str(Path(inventory).expanduser().resolve())
    return [str(Path(i).expanduser().resolve()) for i in inventory]


def required(inventory: str | list[str] | None) -> str | list[str] | None:
    """`inventory` (from `chosen`), or the "choose an inventory" error when nothing names one.

    Asked before a playbook runs or the inventory is read, so a command that forgot `-i` stops
    with the choices instead of a play error. Ansible's own ANSIBLE_INVENTORY also counts (None
    is then passed on and Ansible reads it); ansible.cfg's default does not: it only names the choices.
    """
    if inventory is None and not os.environ.get("ANSIBLE_INVENTORY"):
        raise not_chosen()
    for path in [inventory] if isinstance(inventory, str) else inventory or []:
        if not os.path.exists(path):
            raise errors.ConfigError("inventory", f"{path} does not exist; check -i or {INVENTORY_ENV}. "
                                                  f"{_choices()}")
        if not os.access(path, os.R_OK):
            raise errors.ConfigError("inventory", f"{path} cannot be read by this user; check its "
                                                  "permissions, or name another with -i")
        broken = _broken_links(path)
        if broken is not None:
            raise errors.ConfigError("inventory", broken, source=path)
        what = not_an_inventory(path)
        if what is not None:  # before any play: Ansible would read no host from it, or not read it at all
            raise errors.ConfigError("inventory", what, source=path)
    return inventory


def _broken_links(path: str) -> str | None:
    """Why a folder inventory's group variables cannot be read: a link in group_vars/ whose file is
    gone. `forja init` links forja's shared settings from the forja that wrote them; a forja installed
    again elsewhere (a new Python under pipx) leaves those links pointing at nothing, and Ansible would
    stop with a bare "could not find"."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    for link in sorted(folder.glob("group_vars/**/*")):
        if link.is_symlink() and not link.exists():
            return (f"{link} links to {os.readlink(link)}, which is gone (forja was installed elsewhere "
                    "since `forja init` wrote it); run `forja init --force` with your options again, "
                    "or point the link at this forja's inventory/group_vars/all")
    return None


def unparsed(said: str) -> errors.ConfigError | None:
    """The error for an inventory source Ansible could not parse, read from what Ansible said
    (ansible-inventory's stderr, a play's output); None when it said no such thing.

    Why after the fact and not a check up front: Ansible parses the inventory anyway, first thing in
    every play and `ansible-inventory` call, and with STRICT_INVENTORY it stops there.
    A check of forja's own would cost every command another parse (a dynamic plugin's API calls
    included), and could disagree with Ansible's plugins (a `*.gcp_gpu.yml` is a plugin config).
    So the error costs nothing when the inventory is fine. Exit 2, like a missing file (`required`).

    The message is the cause in the inventory's own words (`inventory PATH: projects: no project
    given; ...`): the plugin that owns the file says it, not the other plugins Ansible tried after it
    (their "not my kind of file" is dropped), and a file that is no forja inventory at all says so.
    """
    found = _UNPARSED.search(said)
    if found is None:
        return None
    source = found["source"].strip()
    reasons: dict[str, str] = {}
    for cause in _REASON.finditer(said):
        plugin = _PLUGIN_MODULE.sub(r"\1.\2.\3", cause["plugin"])
        reason = cause["reason"].strip().rstrip(".").removeprefix(f"{source}: ")  # it is named once
        if not any(noise in reason for noise in _NOISE):
            reasons.setdefault(plugin, reason)
    what = not_an_inventory(source, reasons.get("auto", ""))
    if what is not None:
        return errors.ConfigError("inventory", what, source=source)
    ours = [r for p, r in reasons.items() if p in FORJA_PLUGINS or p.startswith("forja.")]
    if ours:  # forja's plugins name the field and the fix themselves
        return errors.ConfigError("inventory", ours[0], source=source)
    reason = next(iter(reasons.values()), "") or "Ansible gave no reason"
    return errors.ConfigError("inventory", f"{reason}. Fix it, or name another with -i", source=source)


def not_an_inventory(path: str, unknown_plugin: str = "") -> str | None:
    """Why the file at `path` is no inventory forja can use, read from the file alone (no plugin
    runs); None when it may be one, or is not a YAML/JSON file (Ansible judges those).

    Cheap enough to ask before any play: YAML that is not a mapping, groups that are not groups
    (an OAuth client secret given to -i), a gcp_gpu config under a name its plugin does not read, and
    (`unknown_plugin`: Ansible's `auto` plugin could not load it) another plugin's config.
    """
    target = Path(path)
    if target.suffix not in (".yml", ".yaml", ".json") or not target.is_file():
        return None
    import yaml

    try:
        data = yaml.safe_load(target.read_text(errors="replace"))
    except (OSError, yaml.YAMLError):
        return None  # Ansible's yaml plugin says where the YAML breaks
    plugin = data.get("plugin") if isinstance(data, dict) else None
    if data is None:
        why = "it is empty"
    elif not isinstance(data, dict):
        why = f"it is a YAML {'list' if isinstance(data, list) else type(data).__name__}, not an inventory"
    elif secret := [k for k in ("installed", "web") if "client_id" in (data.get(k) or {})]:
        key = secret[0]
        why = (f"it is an OAuth client secret (top-level \"{key}\"), not an inventory; a key file goes "
               "in FORJA_GCP_CREDENTIALS_FILE, and must be a service-account key")
    elif data.get("type") == "service_account":
        why = "it is a service-account key, not an inventory; set FORJA_GCP_CREDENTIALS_FILE to it instead"
    elif plugin is not None:
        name = str(plugin)
        ours = name in FORJA_PLUGINS or name.split(".")[-1] in ("gcp_gpu", "inventory_required")
        if name.endswith("gcp_gpu") and not target.name.endswith(("gcp_gpu.yml", "gcp_gpu.yaml")):
            return (f"the forja.gpu.gcp_gpu plugin reads only files named *gcp_gpu.yml; rename it "
                    f"(e.g. {target.stem}.gcp_gpu.yml), or name another with -i")
        if ours or not unknown_plugin:
            return None
        missing = "specifies unknown plugin" in unknown_plugin
        why = f"it configures the inventory plugin '{name}'" + (
            ", which is not installed" if missing else f", which failed: {unknown_plugin}")
    else:
        groups = [k for k, v in data.items()
                  if not (v is None or (isinstance(v, dict) and v.keys() <= _GROUP_KEYS))]
        if not groups:
            return None
        why = (f"'{groups[0]}' is not a group (a group holds only hosts, vars and children), so Ansible "
               "would read no host from it")
    return f"not a forja inventory: {why}. {_choices()}{_init_hint()}"


def _init_hint() -> str:
    """`forja init`, where the choices do not name it already."""
    return "" if "forja init" in _choices() else "; or write your own with `forja init`"


def not_chosen() -> errors.ConfigError:
    """No -i, FORJA_INVENTORY, ANSIBLE_INVENTORY or user's inventory: the error naming the choices,
    `forja init` among them (it writes the inventory forja then uses by default)."""
    from forja.paths import user_inventory

    return errors.ConfigError(
        "inventory", f"no inventory chosen. {_choices()}; or set {INVENTORY_ENV} to it; or run "
                     f"`forja init --project PROJECT_ID` once, which writes your own inventory for Google "
                     f"Cloud to {user_inventory()}, forja's default from then on")


def _choices() -> str:
    """"Name one: -i PATH (what) ...": the choices that ansible.cfg's default inventory
    (inventory/choose.yml, their one home) lists.

    In a clone the paths stay as choose.yml writes them (relative to the clone, where its README
    runs forja); in an installed copy they are made absolute, since the user runs forja anywhere."""
    import configparser

    import yaml

    from forja.paths import REPO_ROOT, ansible_env

    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(REPO_ROOT / "ansible.cfg")
    default = REPO_ROOT / cfg.get("defaults", "inventory", fallback="inventory/choose.yml")
    choices = (yaml.safe_load(default.read_text()) or {}).get("choices", {}) if default.is_file() else {}
    installed = bool(ansible_env())
    named = "; ".join(f"-i {REPO_ROOT / path if installed else path} ({what})"
                      for path, what in choices.items())
    return f"Name one: {named or '-i PATH'}"


def plain(value: Any) -> Any:
    """`value` with every `{"__ansible_unsafe": v}` replaced by `v`, recursively."""
    if isinstance(value, dict):
        if set(value) == {UNSAFE_MARKER}:
            return plain(value[UNSAFE_MARKER])
        return {str(plain(k)): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


@dataclass(frozen=True)
class InventoryData:
    """Groups and per-host variables, plain values only, facts left out."""

    groups: dict[str, dict[str, Any]]
    hostvars: dict[str, dict[str, Any]]

    def group_hosts(self, group: str) -> list[str]:
        """Hosts of a group, children included, in inventory order; "all" is every host."""
        if group == "all" and group not in self.groups:
            return sorted(self.hostvars)
        seen: list[str] = []
        node = self.groups.get(group) or {}
        for host in node.get("hosts", []):
            if host not in seen:
                seen.append(host)
        for child in node.get("children", []):
            for host in self.group_hosts(child):
                if host not in seen:
                    seen.append(host)
        return seen


def _sources(inventory: Inventory) -> list[str]:
    if inventory is None:
        return []
    if isinstance(inventory, str | Path):
        return [str(Path(inventory).expanduser())]
    return [str(Path(i).expanduser()) for i in inventory]


def _ansible_inventory() -> str:
    """The ansible-inventory next to this Python (a venv need not be activated), else PATH's."""
    beside = Path(sys.executable).with_name("ansible-inventory")
    return str(beside) if beside.exists() else (shutil.which("ansible-inventory") or "ansible-inventory")


def parse(listing: Mapping[str, Any]) -> InventoryData:
    """Turn `ansible-inventory --list` JSON into plain groups and hostvars without facts."""
    data = plain(dict(listing))
    meta = data.pop("_meta", {}) or {}
    hostvars = {
        host: {k: v for k, v in (hv or {}).items() if k not in FACT_KEYS}
        for host, hv in (meta.get("hostvars") or {}).items()
    }
    return InventoryData(groups=data, hostvars=hostvars)


def read(inventory: Inventory = None, *, cwd: Path | None = None) -> InventoryData:
    """Run `ansible-inventory --list` over the sources (None: ansible.cfg's) and parse it.

    `cwd` is where ansible.cfg is looked up; forja's repository by default, like the playbooks.
    """
    from forja.paths import REPO_ROOT, ansible_env
    cmd = [_ansible_inventory(), "--list"]
    for source in _sources(inventory):
        cmd += ["-i", source]
    env = {**os.environ, "ANSIBLE_INJECT_FACT_VARS": "False", **STRICT_INVENTORY, **ansible_env()}
    # stdin is never read, and Ansible refuses to start on a non-blocking one (a parent's pipe).
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd or REPO_ROOT, env=env,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        not_parsed = unparsed(proc.stderr)
        if not_parsed is not None:
            raise not_parsed
        said = proc.stderr.strip()[-800:] or proc.stdout.strip()[-800:]
        raise errors.ConfigError("inventory", f"`ansible-inventory --list` failed: {said}")
    try:
        listing = json.loads(proc.stdout)
    except ValueError as exc:
        raise errors.ConfigError("inventory", f"ansible-inventory printed no JSON: {exc}") from exc
    return parse(listing)


@dataclass(frozen=True)
class InventoryHost:
    """How to reach one inventory host (what `forja tunnel` needs), and what its record says."""

    name: str
    address: str
    user: str | None
    port: int
    key_file: str | None
    vars: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def status(self) -> str | None:
        """The cloud's status of the VM (RUNNING, TERMINATED...); None for a host not from a cloud."""
        value = self.vars.get("status")
        return str(value).upper() if value else None

    @property
    def stopped(self) -> bool:
        return self.status in STOPPED_STATUSES

    @property
    def stopped_since(self) -> datetime | None:
        """When the VM last stopped, from the record's `last_stop_timestamp`."""
        value = self.vars.get("last_stop_timestamp")
        if not value:
            return None
        from forja.cost.spend import parse_time

        try:
            return parse_time(str(value))
        except ValueError:
            return None

    @property
    def host_key_checking(self) -> bool:
        """False where the inventory turned it off for this host (the sandbox's throwaway hosts)."""
        value = self.vars.get("ansible_host_key_checking", True)
        return str(value).lower() not in ("false", "no", "0", "off")


def host_of(name: str, hv: Mapping[str, Any]) -> InventoryHost:
    return InventoryHost(
        name=name,
        address=str(hv.get("ansible_host") or name),
        user=hv.get("ansible_user"),
        port=int(hv.get("ansible_port") or 22),
        key_file=hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file"),
        vars=dict(hv),
    )


def hosts(inventory: Inventory = None, pattern: str = "forja_gpu") -> list[InventoryHost]:
    """The hosts of a group (or "all"), with their connection variables."""
    data = read(inventory)
    return [host_of(name, data.hostvars.get(name, {})) for name in data.group_hosts(pattern)]


def gcp_instances(inventory: Inventory = None) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """Hostvars of every host that looks like a GCP instance (for `forja cost`), the names of the
    user's own machines (`host_contract_platform: own`: no cloud price, nothing to count), and the
    others' names (not priced: no machine type or zone known)."""
    data = read(inventory)
    found, own, skipped = [], [], []
    for host, hv in sorted(data.hostvars.items()):
        if (hv.get("machine_type") or hv.get("machineType")) and (hv.get("zone") or hv.get("gcp_zone")):
            found.append({"name": host, **hv})
        elif hv.get("host_contract_platform") == "own":
            own.append(host)
        else:
            skipped.append(host)
    return found, own, skipped


def stopped_error(host: InventoryHost, task: str = "", now: datetime | None = None) -> errors.HostStopped:
    """The error for a stopped VM: since when (its record's `last_stop_timestamp`) and why if known."""
    since = None
    stamp = host.stopped_since
    if stamp is not None:
        ago = ((now or datetime.now(timezone.utc)) - stamp).total_seconds()
        since = f"{stamp.astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC, {_ago(ago)}"
    return errors.HostStopped(host.name, host.status or "unknown", since, stop_reason(host), task=task)


def stop_reason(host: InventoryHost) -> str | None:
    """Why the VM stopped, where its record says: autostop's decision, kept outside the VM."""
    reason = (host.vars.get("guest_attributes") or {}).get(STOP_REASON_ATTRIBUTE)
    return f"autostop stopped it ({reason})" if reason else None


def _ago(seconds: float) -> str:
    """How long ago, as forja shows a duration (`30m 00s ago`, `1h 30m ago`, `2d 07h ago`)."""
    return f"{fmt.duration(max(0.0, seconds))} ago"


@dataclass(frozen=True)
class Cluster:
    """A cluster of the inventory (`gcp_instance_count: N`): the name the user gave its VMs, the group
    the playbooks act on, and its members in rank order (rank 0 first: it follows and writes the run)."""

    name: str
    group: str
    members: list[str]

    @property
    def rank0(self) -> str:
        return self.members[0]


def clusters(data: InventoryData) -> dict[str, Cluster]:
    """Every cluster of the inventory by its name, from the members' hostvars (`forja_cluster`,
    `forja_node_rank`: the gcp_gpu plugin's documented contract, the variables `forja cost` reads too).

    The group is the inventory's own group holding exactly the members (the plugin's `cluster_<name>`),
    read, not rebuilt, so the name's spelling rule stays the plugin's; without one the members are
    named one by one (an Ansible pattern with commas).
    """
    from forja.cost.cluster import cluster_of, rank_of

    found: dict[str, list[tuple[int, str]]] = {}
    for host, hv in data.hostvars.items():
        name = cluster_of(hv)
        if name is not None:
            found.setdefault(name, []).append((rank_of(hv), host))
    result: dict[str, Cluster] = {}
    for name, ranked in sorted(found.items()):
        members = [host for _, host in sorted(ranked)]
        group = next((g for g in sorted(data.groups) if g.startswith("cluster_")
                      and sorted(data.group_hosts(g)) == sorted(members)), ",".join(members))
        result[name] = Cluster(name, group, members)
    return result


def run_targets(data: InventoryData, group: str = "forja_gpu") -> list[str]:
    """What a play over `group` (the playbooks' default hosts) trains: one run per cluster and one per
    host outside a cluster, as trainer_run groups nodes (its vars/main.yml); each named for people
    ("forja-l4", "cluster forja-elastic (forja-elastic-0, forja-elastic-1)").

    Why forja asks: `forja train` follows one run, and a play over a VM beside a cluster starts two.
    """
    from forja.cost.cluster import cluster_of

    hosts = data.group_hosts(group) if group in data.groups else data.group_hosts("all")
    found = clusters(data)
    targets = [h for h in hosts if cluster_of(data.hostvars.get(h) or {}) is None]
    named = {cluster_of(data.hostvars.get(h) or {}) for h in hosts} - {None}
    targets += [f"cluster {c.name} ({', '.join(c.members)})" for name, c in found.items() if name in named]
    return targets


def cluster(data: InventoryData, name: str) -> Cluster:
    """The cluster the user named as its VMs are named (`gcp_instance_name`, e.g. forja-l4).

    Raises ConfigError naming the clusters the inventory has, before anything is sent.
    """
    found = clusters(data)
    if name in found:
        return found[name]
    have = ", ".join(found) or "none"
    raise errors.ConfigError(
        "--cluster", f"{name!r} is not a cluster of the inventory (its clusters: {have}). Give the name "
        "of the cluster's VMs (gcp_instance_name), as `forja -e gcp_instance_name=NAME "
        "-e gcp_instance_count=N up` made them")
