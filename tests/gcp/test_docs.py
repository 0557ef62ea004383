"""The plugins and the modules carry documentation that ansible-doc renders.

Every plugin under plugins/ is checked for a description and examples; the list comes from the
folder itself, so a plugin added without its DOCUMENTATION or EXAMPLES fails here rather than in a
user's `ansible-doc`.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from gcp_helpers import REPO, offline_env

# ansible-doc's type for each plugins/ folder, and the file suffix that holds a plugin's docs
# (a filter's docs live in a YAML file next to the Python file that holds several filters).
KINDS = {"modules": ("module", ".py"), "inventory": ("inventory", ".py"),
         "filter": ("filter", ".yml"), "strategy": ("strategy", ".py")}


def _plugins() -> list[tuple[str, str]]:
    found = []
    for folder, (kind, suffix) in KINDS.items():
        found += [(kind, p.stem) for p in sorted((REPO / "plugins" / folder).glob(f"*{suffix}"))
                  if not p.name.startswith("_")]
    return found


def ansible_doc(*args: str) -> str:
    proc = subprocess.run(
        [str(REPO / ".venv/bin/ansible-doc"), *args],
        cwd=REPO,
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[ERROR]" not in proc.stderr and "[WARNING]" not in proc.stderr, proc.stderr
    return proc.stdout


def test_the_modules_document_options_examples_and_return_values():
    docs = json.loads(ansible_doc("-j", "-t", "module", "gcp_gpu_instance", "gcp_gpu_firewall"))
    instance = docs["gcp_gpu_instance"]
    assert {"spot", "instance_termination_action", "fallback_zones", "credentials_file"} <= set(
        instance["doc"]["options"]
    )
    assert "instance" in instance["return"] and "gpu_type" in instance["return"]["instance"]["contains"]
    assert "fallback_zones" in instance["examples"]
    firewall = docs["gcp_gpu_firewall"]
    assert firewall["doc"]["options"]["source_ranges"]["default"] == ["35.235.240.0/20"]
    assert firewall["examples"] and firewall["return"]


def test_the_inventory_plugin_renders_with_its_fragments_and_examples():
    text = ansible_doc("-t", "inventory", "gcp_gpu")
    for expected in (
        "projects",
        "keyed_groups",
        "cache_plugin",
        "ansible_host_preference",
        "EXAMPLES",
        "plugin: gcp_gpu",
        "FORJA_GCP_CREDENTIALS_FILE",
    ):
        assert expected in text, expected


def test_every_plugin_folder_is_covered():
    folders = {p.name for p in (REPO / "plugins").iterdir() if p.is_dir()}
    assert folders - set(KINDS) == {"module_utils", "callback"}


@pytest.mark.parametrize(("kind", "name"), _plugins(), ids=lambda v: v)
def test_the_plugin_renders_with_a_description_and_examples(kind, name):
    entry = json.loads(ansible_doc("-j", "-t", kind, name))[name]
    assert entry["doc"]["short_description"] and entry["doc"]["description"]
    assert entry["examples"].strip()
