"""Helpers of the jupyter tests: the role's config template rendered as Ansible would render it."""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import jinja2
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "jupyter_colab"


@dataclass(frozen=True)
class LocalServer:
    port: int
    token: str
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://localhost:{self.port}"


def render_config(**overrides: object) -> dict:
    """Render the role's config template with its defaults (plus overrides), like Ansible would."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    contract = yaml.safe_load((ROLE.parent / "host_contract" / "defaults" / "main.yml").read_text())
    values = {**contract, **defaults, **overrides}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    # Some defaults come from the host contract (a dependency of the role), as Ansible renders them.
    values = {
        key: env.from_string(value).render(**values)
        if isinstance(value, str) and "{{ host_contract_" in value else value
        for key, value in values.items()
    }
    env.filters["to_nice_json"] = lambda data, indent=4: json.dumps(data, indent=indent, sort_keys=True)
    env.filters["bool"] = bool
    template = env.from_string((ROLE / "templates" / "jupyter_notebook_config.json.j2").read_text())
    return json.loads(template.render(**values))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]



def ansible_playbook() -> str:
    """The venv's ansible-playbook, found even when the venv is not activated."""
    beside = Path(sys.executable).with_name("ansible-playbook")
    return str(beside) if beside.exists() else "ansible-playbook"
