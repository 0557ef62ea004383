"""A run's snapshot sent again as a managed Spot run (`forja train --again RUN --managed`,
`Forja.train_managed_again`), and sent again from the same snapshot when a zone move needs it.

Real parts: a git project whose tree moved on since the run, the run's snapshot in a real history,
forja.snapshot's temporary worktree of the run's commit and patch. Sending a run and watching its VM
are playbooks that need hosts: their stand-ins (training.train, managed.watch) record what they were
given, and read the code they were sent while it is there, as the real send would.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from forja import again, managed, snapshot, training
from forja.errors import ConfigError
from forja.history import History
from forja.runs import TrainResult
from forja.session import Session


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True)
    return done.stdout


@pytest.fixture
def moved_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Session, Path]:
    """Run r1's snapshot (model WIDTH 16, uncommitted), then its project moved on (WIDTH 32, committed)."""
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    project = tmp_path / "proj"
    project.mkdir()
    git(project, "init", "-q")
    (project / "run.yaml").write_text("steps: 7\n")
    (project / "model.py").write_text("WIDTH = 8\n")
    git(project, "add", ".")
    git(project, "commit", "-qm", "one")
    (project / "model.py").write_text("WIDTH = 16\n")
    session = Session(tmp_path, inventory=None, history=History(tmp_path / "history.db"))
    session.history.start("r1", name="r1")
    options = {"script": None, "args": [], "excludes": ["data/"], "procs": None, "hooks": {},
               "extravars": {"seed": 3}}
    snapshot.record(session, "r1", project=project, config=project / "run.yaml", options=options)
    git(project, "commit", "-qam", "two")
    (project / "model.py").write_text("WIDTH = 32\n")
    return session, project


def test_a_managed_run_sent_again_needs_a_zone_to_move_to_before_anything(
    moved_on: tuple[Session, Path],
) -> None:
    session, project = moved_on
    with pytest.raises(ConfigError) as refused:
        again.train_managed_again(session, "r1", fallback_zones=[])
    assert refused.value.field == "--fallback-zone"
    assert [r.run_id for r in session.history.list()] == ["r1"]
    assert len(git(project, "worktree", "list").splitlines()) == 1, "no worktree was made"


def test_it_is_sent_from_the_snapshot_and_a_zone_move_puts_the_snapshot_back_to_send_it_again(
    moved_on: tuple[Session, Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    session, project = moved_on
    sent: list[dict[str, Any]] = []
    watched: dict[str, Any] = {}

    def send(_session: Session, config: Any = None, **how: Any) -> TrainResult:
        code = (Path(how["project"]) / "model.py").read_text()  # what goes, read while it is there
        sent.append({"config": Path(config).read_text(), "code": code, **how})
        return TrainResult(how["name"], "running", [], {}, None)

    def watch(_session: Session, name: str, **how: Any) -> str:
        watched.update(name=name, **how)
        return "the run completed"

    monkeypatch.setattr(training, "train", send)
    monkeypatch.setattr(managed, "watch", watch)
    said: list[str] = []
    why = again.train_managed_again(session, "r1", fallback_zones=["us-east1-b"], name="r2", say=said.append)
    assert why == "the run completed" and watched["name"] == "r2"
    assert "temporary worktree" in said[0]
    first = sent[0]
    assert (first["config"], first["code"], first["name"], first["wait"]) == ("steps: 7\n", "WIDTH = 16\n",
                                                                              "r2", False)
    assert (first["excludes"], first["extravars"]) == (["data/"], {"seed": 3})
    assert not Path(first["project"]).exists(), "the worktree lived while the run was sent and watched"
    # What the watcher keeps names the snapshot, not the temporary folders it was sent from.
    kept = watched["train"]
    assert kept["again"] == "r1" and "project" not in kept and "config" not in kept

    # A zone move, here or in a watcher started later (forja watch), sends r2 from r1's snapshot again.
    state = managed.WatchState(run="r2", zones=["us-east1-d", "us-east1-b"], train=kept)
    managed.Watcher(session, state, say=said.append).send_again()
    resent = sent[1]
    assert (resent["config"], resent["code"], resent["name"]) == ("steps: 7\n", "WIDTH = 16\n", "r2")
    assert (resent["excludes"], resent["extravars"]) == (["data/"], {"seed": 3})
    assert (project / "model.py").read_text() == "WIDTH = 32\n"
    assert len(git(project, "worktree", "list").splitlines()) == 1
