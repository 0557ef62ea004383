"""forja.gpu.forja_format: a playbook prints a figure as the forja command does (a real play)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from forja import format as fmt

REPO = Path(__file__).resolve().parents[2]
#: The digits demo's summary, as the playbooks' messages once printed it in full.
SUMMARY = {"steps": 300, "final_loss": 0.008180368691682816, "cost_usd": 0.0019884954039891124,
           "accuracy": 0.97222, "samples_per_s": 1249.6, "wall_s": 187.0}


def run_play(tmp_path: Path, msg: str, **extravars: object) -> tuple[int, str]:
    """A local play that prints one message through forja's collection, as site.yml's plays do."""
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "name": "Print a figure", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Show it", "ansible.builtin.debug": {"msg": msg}}],
    }]))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", json.dumps(extravars), str(play)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        env={"ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default", "ANSIBLE_NOCOLOR": "1",
             "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_a_play_shows_the_summary_as_forja_does(tmp_path: Path) -> None:
    rc, said = run_play(
        tmp_path,
        "loss {{ s.final_loss | forja.gpu.forja_format('final_loss') }}, "
        "cost {{ s.cost_usd | forja.gpu.forja_format('cost_usd') }}, "
        "{{ s.accuracy | forja.gpu.forja_format('accuracy') }}, "
        "{{ s.samples_per_s | forja.gpu.forja_format('samples_per_s') }}, "
        "{{ s.wall_s | forja.gpu.forja_format('duration') }}",
        s=SUMMARY,
    )
    assert rc == 0, said
    expected = (f"loss {fmt.loss(SUMMARY['final_loss'])}, cost {fmt.money(SUMMARY['cost_usd'])}, 97.2%, "
                "1,250 samples/s, 3m 07s")
    assert expected == "loss 0.008180, cost 0.2¢, 97.2%, 1,250 samples/s, 3m 07s"
    assert expected in said, said


def test_a_missing_figure_stays_as_the_play_gave_it(tmp_path: Path) -> None:
    msg = "loss {{ s.final_loss | default('?') | forja.gpu.forja_format('final_loss') }}"
    rc, said = run_play(tmp_path, msg, s={})
    assert rc == 0 and "loss ?" in said, said


def test_an_unknown_kind_fails_naming_the_kinds_it_takes(tmp_path: Path) -> None:
    rc, said = run_play(tmp_path, "{{ 1 | forja.gpu.forja_format('furlongs') }}")
    assert rc != 0
    assert "'furlongs' is not a figure forja knows" in said and "final_loss" in said, said
