"""The run folder's names (trainer/run_folder.py) as they are on disk, and everything that spells them.

Hosts, forja's fetch and status, and people's own scripts read these files by name, so the names
are pinned here as literals (the one place a test spells them: every other test uses the module).
What cannot import the module (the launcher, a shell script; the roles' YAML) is held to it here;
the host scripts that can get it installed beside them, a link to the same file. Then the one
atomic write: the old file or the whole new one, and never a temporary file left behind.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.machinery
import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

from trainer import run_folder

REPO = Path(__file__).resolve().parents[2]

#: Every name of the module, as hosts and users find it on disk. A new name is added here too.
ON_DISK = {
    "SUMMARY": "summary.json",
    "EVENTS": "events.jsonl",
    "METRICS": "metrics.jsonl",
    "LOGS": ("events.jsonl", "metrics.jsonl"),
    "CONFIG": "config.yaml",
    "LIVE": "live.json",
    "OOM_RECORD": "oom.json",
    "CHECKPOINTS_DIR": "checkpoints",
    "MODEL_DIR": "model",
    "PLOTS_DIR": "plots",
    "PLOT_LOSS": "loss.png",
    "PLOT_THROUGHPUT": "throughput.png",
    "PLOT_UTILISATION": "utilisation.png",
    "PLOT_COST": "cost.png",
    "PLOT_FILES": ("loss.png", "throughput.png", "utilisation.png", "cost.png"),
    "COMPILE_CACHE_DIR": "compile-cache",
    "TRAINER_LOCK": ".trainer.lock",
    "STOP_REQUESTED": ".forja-stop-requested",
    "LAUNCHER_LOCK": ".lock",
    "LAUNCHER_EXITS": ".forja-exits",
    "ELASTIC": "elastic.json",
    "COMPLETED_MARKER": "COMPLETED",
    "HOOK_LOG": "hook.log",
    "PACKAGES": "packages.json",
    "LOGS_DIR": "logs",
    "TMP_MARK": ".tmp.",
}


def test_the_names_are_the_ones_on_disk() -> None:
    named = {k: v for k, v in vars(run_folder).items() if k.isupper() and not k.startswith("_")}
    assert named == ON_DISK


def test_the_module_needs_only_the_standard_library() -> None:
    """forja imports it where torch is absent, and hosts run it on their system Python."""
    tree = ast.parse((REPO / "trainer" / "run_folder.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


@pytest.mark.parametrize("role", ["autostop", "trainer_run"])
def test_the_roles_install_this_very_file_beside_their_scripts(role: str) -> None:
    files = REPO / "roles" / role / "files"
    link = files / "forja_run_folder.py"
    assert link.is_symlink() and link.resolve() == REPO / "trainer" / "run_folder.py"
    tasks = "".join(p.read_text() for p in (REPO / "roles" / role / "tasks").glob("*.yml"))
    assert tasks.count("forja_run_folder.py") >= 2, "compared with the host (state.yml) and installed"


def test_the_host_scripts_read_the_names_from_it() -> None:
    agent_spec = importlib.util.spec_from_file_location(
        "forja_autostop_names", REPO / "roles/autostop/files/forja_autostop.py")
    assert agent_spec is not None and agent_spec.loader is not None
    agent = importlib.util.module_from_spec(agent_spec)
    agent_spec.loader.exec_module(agent)
    loader = importlib.machinery.SourceFileLoader(
        "forja_train_state_names", str(REPO / "roles/trainer_run/files/forja-train-state"))
    state_spec = importlib.util.spec_from_loader(loader.name, loader)
    assert state_spec is not None
    state = importlib.util.module_from_spec(state_spec)
    loader.exec_module(state)
    for script in (agent, state):
        assert script.run_folder.__file__ is not None
        assert Path(script.run_folder.__file__).resolve() == REPO / "trainer" / "run_folder.py"
        assert script.run_folder.LIVE == run_folder.LIVE and script.run_folder.SUMMARY == run_folder.SUMMARY


def test_what_cannot_import_it_spells_the_same_names() -> None:
    """The launcher (a shell script) and the roles' YAML keep literals: the module's, exactly."""
    launcher = (REPO / "roles/trainer_run/files/forja-train-launch").read_text()
    for name in (run_folder.COMPLETED_MARKER, run_folder.LAUNCHER_LOCK, run_folder.LAUNCHER_EXITS,
                 run_folder.ELASTIC, run_folder.HOOK_LOG, run_folder.STOP_REQUESTED, run_folder.PACKAGES):
        assert f'"$FORJA_OUT/{name}"' in launcher, name
    assert f"$FORJA_OUT/{run_folder.CHECKPOINTS_DIR}}}" in launcher  # FORJA_CHECKPOINT_DIR's default
    tasks = REPO / "roles/trainer_run/tasks"
    stop = (tasks / "stop.yml").read_text()
    assert f"{{{{ trainer_run_name }}}}/{run_folder.STOP_REQUESTED}\"" in stop
    for name in ("state.yml", "validate.yml", "unit.yml"):
        marked = re.findall(r"/(\w+)['\"]\]?", (tasks / name).read_text())
        assert run_folder.COMPLETED_MARKER in marked, name
    spec = (REPO / "roles/trainer_run/vars/main.yml").read_text()
    assert f'excludes: ["{run_folder.LAUNCHER_LOCK}", "*.tmp*"]' in spec
    assert f"['{run_folder.CHECKPOINTS_DIR}']" in spec  # skip_dirs: checkpoints are fetched only if asked
    assert fnmatch.fnmatch(f"{run_folder.METRICS}{run_folder.TMP_MARK}42", "*.tmp*"), "a file being written"
    summary_play = (REPO / "playbooks/summary.yml").read_text()
    assert f'}}}}/{run_folder.SUMMARY}"' in summary_play


# -- the one atomic write --------------------------------------------------------------------------


def test_write_atomic_replaces_the_whole_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / run_folder.SUMMARY
    path.write_text("old")
    assert run_folder.write_atomic(path, '{"é": 1}\n') == path
    assert path.read_bytes() == '{"é": 1}\n'.encode()
    run_folder.write_atomic(path, b"\x00bytes")
    assert path.read_bytes() == b"\x00bytes"
    assert [p.name for p in tmp_path.iterdir()] == [run_folder.SUMMARY]


def test_the_temporary_file_is_beside_the_file_and_named_with_the_writer_s_pid(tmp_path: Path) -> None:
    path = tmp_path / run_folder.OOM_RECORD
    assert run_folder.temporary_path(path) == tmp_path / f"oom.json.tmp.{os.getpid()}"
    with run_folder.atomic_file(path) as handle:
        handle.write(b"{}")
        assert run_folder.temporary_path(path).is_file() and not path.exists()
    assert path.read_bytes() == b"{}"


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    path = tmp_path / run_folder.LIVE
    path.write_text("old")
    with pytest.raises(RuntimeError), run_folder.atomic_file(path) as handle:
        handle.write(b"half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == [run_folder.LIVE]


def test_without_replace_an_existing_file_is_kept(tmp_path: Path) -> None:
    path = tmp_path / run_folder.EVENTS
    run_folder.write_atomic(path, "first\n", replace=False)
    with pytest.raises(FileExistsError):
        run_folder.write_atomic(path, "second\n", replace=False)
    assert path.read_text() == "first\n"
    assert [p.name for p in tmp_path.iterdir()] == [run_folder.EVENTS]


def test_atomic_path_hands_a_writer_the_temporary_name(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_text("old")
    with run_folder.atomic_path(path) as tmp:
        assert tmp == run_folder.temporary_path(path)
        tmp.write_bytes(b"new")
        assert path.read_text() == "old"
    assert path.read_bytes() == b"new"
    with pytest.raises(ValueError), run_folder.atomic_path(path) as tmp:
        tmp.write_bytes(b"bad")
        raise ValueError("did not verify")
    assert path.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["weights.bin"]
