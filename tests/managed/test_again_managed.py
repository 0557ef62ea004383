"""A run's snapshot sent again as a managed Spot run (`forja train --again RUN --managed`,
`Forja.train_managed_again`), and sent again from the same snapshot when a zone move needs it.

Real parts only: a git project whose tree moved on since the run, the run's snapshot in a real
history, forja.snapshot's temporary worktree of the run's commit and patch. What is sent is decided by
plain functions, read here directly: `again.sending` (the first send), `managed.to_send_again` (what the
watcher keeps) and `managed.resent` (what a zone move sends). Sending itself is a playbook on a host;
here it is asked of a session with no inventory, the refusal that comes after train() has checked
every keyword it was given and before anything is recorded, so the glue between those functions and
`train` runs for real. A zone move's sending on hosts is the sandbox drill's
(tests/sandbox/test_site_e2e.py, `send_again` through the same `resent`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from forja import again, managed, snapshot
from forja.errors import ConfigError
from forja.history import History
from forja.session import Session


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True)
    return done.stdout


def worktrees(project: Path) -> int:
    return len(git(project, "worktree", "list").splitlines())


@pytest.fixture
def moved_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Session, Path]:
    """Run r1's snapshot (model WIDTH 16, uncommitted; -e seed=3), then its project moved on (WIDTH 32
    committed, its config changed); no inventory is named anywhere."""
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no user's inventory either
    for name in ("FORJA_INVENTORY", "ANSIBLE_INVENTORY"):
        monkeypatch.delenv(name, raising=False)
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
               "extravars": {"seed": 3, "lr": 0.1}}
    snapshot.record(session, "r1", project=project, config=project / "run.yaml", options=options)
    (project / "run.yaml").write_text("steps: 9\n")
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
    assert worktrees(project) == 1, "no worktree was made"


def test_it_is_sent_from_the_run_s_commit_and_patch_with_its_options_and_the_caller_s_variables_over_its_own(
    moved_on: tuple[Session, Path],
) -> None:
    session, project = moved_on
    with again.sending(session, "r1", name="r2", train={"extravars": {"lr": 0.5}, "poll_s": 5}) as sent:
        how = sent.keywords
        code = Path(how["project"])
        assert code != project and (code / "model.py").read_text() == "WIDTH = 16\n"  # r1's commit + patch
        assert Path(how["config"]).read_text() == "steps: 7\n"  # the snapshot's copy, not the file now
        assert (how["name"], how["excludes"], how["script"], how["args"]) == ("r2", ["data/"], None, [])
        assert how["extravars"] == {"seed": 3, "lr": 0.5} and how["poll_s"] == 5
        assert "temporary worktree" in sent.said
    assert not code.exists() and worktrees(project) == 1
    assert (project / "model.py").read_text() == "WIDTH = 32\n"
    with again.sending(session, "r1") as unnamed:
        assert unnamed.keywords["name"].startswith("run-")  # named for the config the run was given


def test_a_zone_move_sends_it_again_from_the_same_snapshot_under_its_new_name(
    moved_on: tuple[Session, Path],
) -> None:
    session, project = moved_on
    with again.sending(session, "r1", name="r2", train={"extravars": {"lr": 0.5}}) as sent:
        kept = managed.to_send_again({**sent.keywords, "wait": False}, again="r1")
    # What the watcher keeps (on disk, for a watcher started later) names the snapshot, not the
    # temporary folders the run was first sent from, nor what belonged to that one sending.
    assert kept["again"] == "r1" and not {"config", "project", "name", "wait"} & kept.keys()
    with managed.resent(session, "r2", kept) as how:
        assert (Path(how["project"]) / "model.py").read_text() == "WIDTH = 16\n"
        assert Path(how["config"]).read_text() == "steps: 7\n"
        assert (how["name"], how["wait"], how["excludes"]) == ("r2", False, ["data/"])
        assert how["extravars"] == {"seed": 3, "lr": 0.5}, "the caller's -e survive the move"
        assert "again" not in how
    assert not Path(how["project"]).exists() and worktrees(project) == 1
    plain = managed.to_send_again({"config": "run.yaml", "name": "r3", "wait": False, "replace": True})
    with managed.resent(session, "r3", plain) as how:  # a run sent from its config: as it was sent
        assert how == {"config": "run.yaml", "name": "r3", "wait": False}


def test_sent_where_no_hosts_are_named_train_refuses_it_records_nothing_and_the_worktree_goes(
    moved_on: tuple[Session, Path],
) -> None:
    session, project = moved_on
    said: list[str] = []
    with pytest.raises(ConfigError) as first:
        again.train_managed_again(session, "r1", fallback_zones=["us-east1-b"], name="r2", say=said.append,
                                  extravars={"lr": 0.5}, poll_s=5)
    assert first.value.field == "inventory", first.value
    assert "temporary worktree" in said[0]
    state = managed.WatchState(run="r2", zones=["us-east1-d", "us-east1-b"],
                               train=managed.to_send_again({"excludes": ["data/"]}, again="r1"))
    with pytest.raises(ConfigError) as moved:
        managed.Watcher(session, state, say=said.append).send_again()
    assert moved.value.field == "inventory", moved.value
    assert [r.run_id for r in session.history.list()] == ["r1"]
    assert worktrees(project) == 1
