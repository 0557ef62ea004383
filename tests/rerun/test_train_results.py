"""forja-train-state --results: the listing trainer_run's fetch.yml compares with the controller's copies.

It replaced a find call (issue 13: a module of its own on every re-run, for nothing), so these tests
hold it to what that find chose, on a real run folder: the role's own spec (vars/main.yml) is
templated by a localhost play, which runs the old find task beside the state reader, and the two
listings must be the same files with the same SHA-1s. The wait asks only for a run that has ended.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from localplay import run_local_play
from state_reader import STATE_READER, state_reader

from forja import runstate

REPO = Path(__file__).resolve().parents[2]
FINAL = yaml.safe_load((REPO / "roles/host_contract/defaults/main.yml").read_text())[
    "host_contract_run_final_statuses"]


def run_folder(out: Path) -> Path:
    """A finished run's folder with every kind of file the choice must keep or leave out."""
    run = out / "digits"
    files = {
        "summary.json": "{}", "metrics.jsonl": '{"step": 1}\n', "config.yaml": "steps: 1\n", "notes.txt": "n",
        "COMPLETED": "", "train.log": "not a result", ".lock": "", ".hidden.json": "{}",
        "metrics.jsonl.tmp42": "partial", "plots/loss.png": "png", "plots/deep/acc.csv": "a,b\n",
        "model/model.json": "{}", "model/model.safetensors": "weights",
        "checkpoints/ckpt-5.pt": "ckpt", "checkpoints/manifest.json": "{}",
        ".cache/seen.json": "{}",  # find skips hidden names, yet walks hidden folders
    }
    for name, text in files.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)
    (run / "link.json").symlink_to(run / "summary.json")  # a link is no regular file: find leaves it
    return run


PLAY = """
- name: List a run's results the old way and the new way
  hosts: localhost
  gather_facts: false
  vars_files: ["{repo}/roles/trainer_run/vars/main.yml"]
  tasks:
    - name: Find the results as fetch.yml did before forja-train-state listed them
      ansible.builtin.find:
        paths: "{{{{ trainer_run_out_root }}}}/{{{{ trainer_run_name }}}}"
        patterns: >-
          {{{{ ['*'] if trainer_run_fetch_checkpoints | bool
             else ['*.json', '*.jsonl', '*.yaml', '*.txt', '*.csv', '*.png', 'hook.log']
                  + (['*.safetensors'] if trainer_run_fetch_model | bool else []) }}}}
        excludes: [".lock", "*.tmp*"]
        recurse: true
        get_checksum: true
      register: found

    - name: List them with the state reader and the role's spec
      ansible.builtin.command:
        argv: ["{reader}", "{{{{ trainer_run_name }}}}",
               --results, "{{{{ trainer_run_results_spec | to_json }}}}"]
      register: listed
      changed_when: false

    - name: Write both listings
      ansible.builtin.copy:
        dest: "{{{{ trainer_run_out_root }}}}/listings.json"
        content: >-
          {{{{ {{'find': found.files if trainer_run_fetch_checkpoints | bool
                        else found.files | rejectattr('path', 'search', '/checkpoints/') | list,
                'reader': (listed.stdout | from_json).results}} | to_json }}}}
        mode: "0600"
"""


@pytest.mark.parametrize(("checkpoints", "model"), [(False, True), (False, False), (True, True)])
def test_the_listing_is_what_find_chose_with_the_same_checksums(
    tmp_path: Path, checkpoints: bool, model: bool
) -> None:
    run_folder(tmp_path)
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(repo=REPO, reader=STATE_READER))
    run_local_play(play, "-e", json.dumps({
        "trainer_run_out_root": str(tmp_path), "trainer_run_name": "digits",
        "trainer_run_fetch_checkpoints": checkpoints, "trainer_run_fetch_model": model}))
    listings = json.loads((tmp_path / "listings.json").read_text())
    old = {f["path"]: (f["checksum"], f["size"]) for f in listings["find"]}
    new = {f["path"]: (f["checksum"], f["size"]) for f in listings["reader"]}
    assert new == old
    run = tmp_path / "digits"
    assert f"{run}/summary.json" in new and f"{run}/plots/deep/acc.csv" in new
    assert (f"{run}/model/model.safetensors" in new) is model
    assert (f"{run}/checkpoints/ckpt-5.pt" in new) is checkpoints
    assert (f"{run}/train.log" in new) is checkpoints  # every file, when checkpoints come too
    assert not {f"{run}/.lock", f"{run}/metrics.jsonl.tmp42", f"{run}/link.json"} & set(new)


def spec(root: Path, **more: object) -> dict[str, object]:
    return {"root": str(root), "patterns": ["*.json"], "excludes": [], "skip_dirs": [], **more}


def test_a_run_that_has_not_ended_is_never_hashed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The wait passes the final statuses: a run in another status (here unknown: no env file) gets no
    `results`; fetch.yml passes none and gets them whatever the status."""
    reader = state_reader()
    reader.CONF_DIR = str(tmp_path / "conf")  # no run is set up there
    run = run_folder(tmp_path / "out")
    reader.main(["digits", "--results", json.dumps(spec(run, statuses=FINAL))])
    waited = json.loads(capsys.readouterr().out)
    assert waited["status"] == "unknown" and "results" not in waited
    reader.main(["digits", "--results", json.dumps(spec(run))])
    alone = json.loads(capsys.readouterr().out)
    assert [f["path"] for f in alone["results"]] == sorted(
        str(p) for p in run.rglob("*.json") if not p.is_symlink() and not p.name.startswith("."))


def test_a_run_that_ended_carries_its_results_and_forja_still_reads_its_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reader = state_reader()
    reader.CONF_DIR = str(tmp_path / "conf")
    run = run_folder(tmp_path / "out")
    os.makedirs(reader.CONF_DIR)
    Path(reader.CONF_DIR, "digits.env").write_text(f"FORJA_OUT={run}\n")
    reader.main(["digits", "--results", json.dumps(spec(run, statuses=FINAL, skip_dirs=["checkpoints"]))])
    line = capsys.readouterr().out
    state = json.loads(line)
    assert state["status"] == "completed"
    summary = next(f for f in state["results"] if f["path"] == f"{run}/summary.json")
    assert summary == {"path": f"{run}/summary.json", "size": 2,
                       "checksum": "bf21a9e8fbc5a3846fb05b4fa0859e0917b2202f"}  # sha1 of "{}"
    assert not [f for f in state["results"] if "/checkpoints/" in f["path"]]
    parsed = runstate.parse(line)  # the extra key is the role's, not forja's: ignored, not refused
    assert parsed is not None and parsed.final and parsed.run == "digits"


def test_a_missing_folder_lists_nothing_and_an_unreadable_file_has_no_checksum(tmp_path: Path) -> None:
    reader = state_reader()
    assert reader.results(spec(tmp_path / "nowhere")) == []
    assert reader.sha1(str(tmp_path / "gone.json")) is None
