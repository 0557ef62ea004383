"""Every plugin of the forja.gpu collection renders with `ansible-doc <fqcn>`.

The list comes from the plugins/ tree itself (and, for filters, from the names each filter file
exports), so a plugin added without DOCUMENTATION/EXAMPLES fails here rather than in a user's
`ansible-doc`.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.forja.gpu.plugins.doc_fragments.gcp_auth import ModuleDocFragment
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import AUTH_ARGUMENT_SPEC

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"
# ansible-doc's type for each plugins/ folder that holds plugins a user calls by name.
KINDS = {"modules": "module", "inventory": "inventory", "filter": "filter", "strategy": "strategy",
         "callback": "callback", "vars": "vars"}
# Folders that hold code or docs shared by the plugins, not plugins of their own; an action plugin is
# the controller side of the module of the same name, which documents it.
SHARED = {"module_utils", "doc_fragments", "plugin_utils", "action"}


def _filter_names(path: Path) -> list[str]:
    """The filters a filter file exports (one file may hold several, each documented in its own YAML)."""
    module = importlib.import_module(f"ansible_collections.forja.gpu.plugins.filter.{path.stem}")
    return sorted(module.FilterModule().filters())


def plugins_in_tree() -> dict[str, list[str]]:
    """ansible-doc kind -> the FQCNs of the plugins of that kind found under plugins/."""
    found: dict[str, list[str]] = {}
    for folder, kind in KINDS.items():
        files = sorted(p for p in (PLUGINS / folder).glob("*.py") if not p.name.startswith("_"))
        names = [n for p in files for n in _filter_names(p)] if kind == "filter" else [p.stem for p in files]
        if names:
            found[kind] = [f"forja.gpu.{name}" for name in names]
    return found


def ansible_doc(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FORJA_GCP_", "GOOGLE_"))}
    env |= {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[ERROR]" not in proc.stderr and "[WARNING]" not in proc.stderr, proc.stderr
    return proc.stdout


def test_every_plugin_folder_is_a_kind_ansible_doc_knows():
    folders = {p.name for p in PLUGINS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - SHARED <= set(KINDS), folders - SHARED - set(KINDS)


def test_every_action_plugin_is_documented_by_its_module():
    actions = {p.stem for p in (PLUGINS / "action").glob("*.py") if not p.name.startswith("_")}
    assert actions and actions <= {p.stem for p in (PLUGINS / "modules").glob("*.py")}, actions


def test_the_tree_holds_the_plugins_the_roles_use():
    found = plugins_in_tree()
    assert {"forja.gpu.nvidia_facts", "forja.gpu.gcp_gpu_instance"} <= set(found["module"])
    assert "forja.gpu.gcp_gpu" in found["inventory"]
    assert {"forja.gpu.forja_dpkg_query", "forja.gpu.forja_hourly_rate"} <= set(found["filter"])


@pytest.mark.parametrize("kind", sorted(plugins_in_tree()))
def test_every_plugin_renders_with_a_description_and_examples(kind: str):
    names = plugins_in_tree()[kind]
    docs = json.loads(ansible_doc("-j", "-t", kind, *names))
    assert sorted(docs) == sorted(names), "ansible-doc found no docs for some of them"
    for name, entry in docs.items():
        assert entry["doc"]["short_description"] and entry["doc"]["description"], name
        assert (entry.get("examples") or "").strip(), f"{name} has no EXAMPLES"


def test_ansible_doc_lists_the_collections_plugins_by_fqcn():
    listed = json.loads(ansible_doc("-j", "-t", "module", "-l", "forja.gpu"))
    assert set(listed) == set(plugins_in_tree()["module"])


def test_the_modules_document_options_examples_and_return_values():
    docs = json.loads(ansible_doc("-j", "-t", "module", "forja.gpu.gcp_gpu_instance",
                                  "forja.gpu.gcp_gpu_firewall"))
    instance = docs["forja.gpu.gcp_gpu_instance"]
    assert {"spot", "instance_termination_action", "fallback_zones", "credentials_file"} <= set(
        instance["doc"]["options"]
    )
    assert "instance" in instance["return"] and "gpu_type" in instance["return"]["instance"]["contains"]
    assert "fallback_zones" in instance["examples"]
    firewall = docs["forja.gpu.gcp_gpu_firewall"]
    assert firewall["doc"]["options"]["source_ranges"]["default"] == ["35.235.240.0/20"]
    assert firewall["examples"] and firewall["return"]


def test_the_inventory_plugin_renders_with_its_fragments_and_examples():
    text = ansible_doc("-t", "inventory", "forja.gpu.gcp_gpu")
    for expected in (
        "projects",
        "keyed_groups",
        "cache_plugin",
        "ansible_host_preference",
        "EXAMPLES",
        "plugin: forja.gpu.gcp_gpu",
        "FORJA_GCP_CREDENTIALS_FILE",
    ):
        assert expected in text, expected


def _own_docs(path: Path) -> dict:
    """The DOCUMENTATION a plugin file states itself, before any fragment is merged in."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DOCUMENTATION":
            return yaml.safe_load(node.value.value)
    raise AssertionError(f"{path} has no DOCUMENTATION")


def test_the_auth_fragment_documents_exactly_the_options_the_modules_accept():
    documented = (yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
                  | yaml.safe_load(ModuleDocFragment.MODULES)["options"])
    assert set(documented) == set(AUTH_ARGUMENT_SPEC)
    for name, spec in AUTH_ARGUMENT_SPEC.items():
        assert documented[name]["type"] == spec["type"], name
        assert documented[name].get("default") == spec.get("default"), name
        assert documented[name].get("choices") == spec.get("choices"), name


@pytest.mark.parametrize(("path", "fragments"), [
    ("modules/gcp_gpu_instance.py", ["forja.gpu.gcp_auth", "forja.gpu.gcp_auth.modules"]),
    ("modules/gcp_gpu_firewall.py", ["forja.gpu.gcp_auth", "forja.gpu.gcp_auth.modules"]),
    ("modules/gcp_gpu_bucket.py", ["forja.gpu.gcp_auth", "forja.gpu.gcp_auth.modules"]),
    ("inventory/gcp_gpu.py", ["forja.gpu.gcp_auth"]),
])
def test_the_gcp_plugins_take_the_auth_options_from_the_fragment_not_a_copy(path: str, fragments: list[str]):
    docs = _own_docs(PLUGINS / path)
    assert set(fragments) <= set(docs["extends_documentation_fragment"])
    shared = set(yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"])
    assert not shared & set(docs["options"]), "a copy of the shared auth options is back"


def test_ansible_doc_renders_every_roles_entry_points():
    roles = sorted(p.parent.parent.name for p in (REPO / "roles").glob("*/meta/argument_specs.yml"))
    docs = json.loads(ansible_doc("-j", "-t", "role", *[f"forja.gpu.{role}" for role in roles]))
    for role in roles:
        specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
        entry_points = docs[f"forja.gpu.{role}"]["entry_points"]
        assert set(entry_points) == set(specs["argument_specs"]), role
        assert all(e.get("short_description") for e in entry_points.values()), role
