"""The trainer_run role's fetch brings the exported model back to the controller (model/), not checkpoints.

A real localhost play of the role's own fetch.yml (tests/localplay.py), over a run folder laid out
as the trainer leaves it. This machine has no installed state reader: the play lists the results with
the repository's (roles/trainer_run/files/forja-train-state --results and the role's spec) and hands
the listing over as the wait does, as the final state trainer_run_final.
"""

from __future__ import annotations

import json
from pathlib import Path

from localplay import REPO, run_local_play


def test_fetch_brings_the_model_and_leaves_the_checkpoints_unless_asked(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "run1"
    for name, data in {
        "summary.json": b"{}", "model/model.json": b"{}", "model/model.safetensors": b"weights",
        "model/model.safetensors.tmp.99": b"half", "checkpoints/ckpt-1.pt": b"ckpt",
    }.items():  # fmt: skip
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(data)

    def fetch(dest: str, fetch_model: bool) -> list[dict[str, object]]:
        role_vars = {"trainer_run_name": "run1", "trainer_run_out_root": str(tmp_path / "runs"),
                     "trainer_run_fetch_checkpoints": False, "trainer_run_fetch_model": fetch_model}
        reader = str(REPO / "roles/trainer_run/files/forja-train-state")
        return [{
            "name": f"List the results for {dest}",
            "ansible.builtin.command": {"argv": [reader, "run1", "--results",
                                                 "{{ trainer_run_results_spec | to_json }}"]},
            "vars": role_vars, "register": f"listed_{dest}", "changed_when": False,
        }, {
            "name": f"Fetch into {dest}",
            "ansible.builtin.include_role": {"name": "forja.gpu.trainer_run", "tasks_from": "fetch.yml"},
            "vars": {**role_vars, "trainer_run_fetch_dir": str(tmp_path / dest),
                     "trainer_run_final": f"{{{{ listed_{dest}.stdout | from_json }}}}"},
        }]  # fmt: skip

    play = tmp_path / "play.yml"
    play.write_text(json.dumps([{"name": "Fetch a run", "hosts": "localhost", "gather_facts": False,
                                 "vars_files": [str(REPO / "roles/trainer_run/vars/main.yml")],
                                 "tasks": fetch("with", True) + fetch("without", False)}]))  # fmt: skip
    run_local_play(play)

    def fetched(dest: str) -> set[str]:
        root = tmp_path / dest / "localhost"
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}

    assert fetched("with") == {"summary.json", "model/model.json", "model/model.safetensors"}
    assert fetched("without") == {"summary.json", "model/model.json"}
    assert (tmp_path / "with" / "localhost" / "model" / "model.safetensors").read_bytes() == b"weights"
