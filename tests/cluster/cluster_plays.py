"""The play the cluster tests run: only the gcp_instance role, on the controller, with no SSH wait."""

from __future__ import annotations

from pathlib import Path

import yaml


def role_play(tmp_path: Path) -> Path:
    """A play that runs only the role (state started, creating what is missing, no SSH wait)."""
    play = tmp_path / "cluster.yml"
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Bring the cluster up",
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                    "roles": [
                        {
                            "role": "forja.gpu.gcp_instance",
                            "vars": {
                                "gcp_instance_create_if_missing": True,
                                "gcp_instance_wait_for_ssh": False,
                                "gcp_instance_ssh_key_file": str(tmp_path / "ssh" / "id"),
                            },
                        }
                    ],
                }
            ],
            sort_keys=False,
        )
    )
    return play
