"""The trainer_run role's fetch brings the exported model back to the controller (model/), not checkpoints.

A real localhost play of the role's own fetch.yml (tests/localplay.py), over a run folder laid out
as the trainer leaves it.
"""

from __future__ import annotations

import json
from pathlib import Path

from localplay import run_local_play


def test_fetch_brings_the_model_and_leaves_the_checkpoints_unless_asked(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "run1"
    for name, data in {
        "summary.json": b"{}", "model/model.json": b"{}", "model/model.safetensors": b"weights",
        "model/model.safetensors.tmp.99": b"half", "checkpoints/ckpt-1.pt": b"ckpt",
    }.items():  # fmt: skip
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(data)

    def fetch(dest: str, fetch_model: bool) -> dict[str, object]:
        return {
            "name": f"Fetch into {dest}",
            "ansible.builtin.include_role": {"name": "forja.gpu.trainer_run", "tasks_from": "fetch.yml"},
            "vars": {"trainer_run_name": "run1", "trainer_run_out_root": str(tmp_path / "runs"),
                     "trainer_run_fetch_dir": str(tmp_path / dest), "trainer_run_fetch_model": fetch_model},
        }  # fmt: skip

    play = tmp_path / "play.yml"
    play.write_text(json.dumps([{"name": "Fetch a run", "hosts": "localhost", "gather_facts": False,
                                 "tasks": [fetch("with", True), fetch("without", False)]}]))  # fmt: skip
    run_local_play(play)

    def fetched(dest: str) -> set[str]:
        root = tmp_path / dest / "localhost"
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}

    assert fetched("with") == {"summary.json", "model/model.json", "model/model.safetensors"}
    assert fetched("without") == {"summary.json", "model/model.json"}
    assert (tmp_path / "with" / "localhost" / "model" / "model.safetensors").read_bytes() == b"weights"
