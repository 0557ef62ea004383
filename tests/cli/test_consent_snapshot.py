"""Consent before upload, the run's snapshot and `--again` (issue 29 part 3), through the CLI
(typer's CliRunner in process) and the API on temporary git projects; no host is contacted.

- `forja train` says what it will send and asks a person; "no" sends and records nothing;
  `forja_upload_consent: never` refuses `train` and `data push`, `--yes` or not; a bad value is
  named with the three it may be;
- a snapshot holds the commit, the uncommitted changes (tracked and untracked) and their digest;
  `forja runs --show` shows it; `--again` sends the snapshot's code from a temporary worktree when
  the project has moved on, and leaves the user's tree alone;
- `--delete-data-after` without a dataset in the config is refused before anything is recorded.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from forja import consent, datasets, snapshot
from forja.cli import app
from forja.errors import Cancelled, ConfigError, ExitCode
from forja.history import History
from forja.session import Session
from trainer import run_folder

REPO = Path(__file__).resolve().parents[2]
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
runner = CliRunner()


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True)
    return done.stdout


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A git project with one commit: the demo config, a model file and a deploy key."""
    folder = tmp_path / "proj"
    folder.mkdir()
    git(folder, "init", "-q")
    git(folder, "config", "user.email", "t@example.com")
    git(folder, "config", "user.name", "t")
    shutil.copyfile(REPO / "trainer" / "configs" / "digits.yaml", folder / "run.yaml")
    (folder / "model.py").write_text("WIDTH = 8\n")
    (folder / "deploy_id").write_text(KEY)
    git(folder, "add", "run.yaml", "model.py")
    git(folder, "commit", "-q", "-m", "one")
    return folder


def test_train_says_what_it_sends_and_a_no_sends_nothing(
    home: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CliRunner's stdin is no terminal: put the question to it as at one
    monkeypatch.setattr("forja.cli.train.asker", lambda ctx: lambda q: typer.confirm(q, err=True))
    ask = ["-e", "forja_upload_consent=ask"]  # the default, said here so the inventory is not read for it
    result = runner.invoke(app, [*ask, "train", str(project / "run.yaml")], input="n\n")
    assert result.exit_code == ExitCode.CANCELLED, result.output
    assert "the project: 2 files" in result.stderr and str(project) in result.stderr
    assert "sent: model.py, run.yaml" in result.stderr
    assert "deploy_id: an OpenSSH private key" in result.stderr
    assert ".git/: matches '.git'" in result.stderr
    assert "Send the project?" in result.stderr and "nothing was sent" in result.stderr
    assert History().list() == []


def test_never_refuses_an_upload_before_anything_is_sent(
    home: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # never reached: refused first
    result = runner.invoke(app, ["--json", "-e", "forja_upload_consent=never", "data", "push", "--yes",
                                 str(project), "--bucket", "gs://b"])
    assert result.exit_code == ExitCode.USAGE, result.output
    err = json.loads(result.stdout)
    assert err["field"] == "forja_upload_consent" and "forja sends no upload" in err["message"]


def test_a_bad_consent_value_is_named_with_the_three_it_may_be() -> None:
    session = Session(inventory=None, extravars={"forja_upload_consent": "sometimes"})
    with pytest.raises(ConfigError, match="'sometimes' is not one of ask, always, never") as bad:
        consent.setting(session)
    assert bad.value.field == "forja_upload_consent"


def test_without_a_person_ask_goes_on_and_a_person_decides(home: Path, project: Path) -> None:
    session = Session(inventory=None, extravars={"forja_upload_consent": "ask"})
    going = consent.survey(project, [], "the project")
    said: list[str] = []
    consent.obtain(session, going, say=said.append)  # a script or CI: the summary, then on as before
    assert said and said[0].startswith("the project: 2 files")
    consent.obtain(session, going, yes=True, ask=lambda q: pytest.fail("--yes asks nothing"))
    with pytest.raises(Cancelled):
        consent.obtain(session, going, ask=lambda q: False)


def test_a_send_asked_about_already_walks_the_project_once(home: Path, project: Path) -> None:
    """`forja train` asks before its progress display (ask_once), then sends with yes: the survey still
    to make is made only when something is said, asked or refused."""
    asked = Session(inventory=None, extravars={"forja_upload_consent": "ask"})
    consent.obtain(asked, lambda: pytest.fail("surveyed again"), yes=True)
    refused = Session(inventory=None, extravars={"forja_upload_consent": "never"})
    with pytest.raises(ConfigError, match=r"the project: 2 files"):
        consent.obtain(refused, lambda: consent.survey(project, [], "the project"), yes=True)


def test_the_snapshot_holds_the_commit_and_every_uncommitted_change(home: Path, project: Path) -> None:
    (project / "model.py").write_text("WIDTH = 16\n")  # tracked, changed
    (project / "notes.txt").write_text("lr 3e-4 looked best\n")  # untracked, not ignored
    History().start("r1", name="r1")
    session = Session(inventory=None)
    facts = snapshot.record(session, "r1", project=project, config=project / "run.yaml",
                            options={"script": None, "args": [], "extravars": {"steps": 5}})
    assert facts["commit"] == git(project, "rev-parse", "HEAD").strip()
    assert facts["dirty"] and facts["untracked"] == ["deploy_id", "notes.txt"]
    patch = snapshot.folder("r1") / snapshot.PATCH
    assert "+WIDTH = 16" in patch.read_text() and "+lr 3e-4 looked best" in patch.read_text()
    assert facts["patch_sha256"] == snapshot.git_state(project).digest  # the same tree, the same digest
    fetched = home / "results" / "r1" / "th6"  # what the VM wrote at the start, fetched with the results
    fetched.mkdir(parents=True)
    (fetched / run_folder.PACKAGES).write_text(json.dumps({"python": "3.10", "packages": {"torch": "2.7.1"}}))
    History().update("r1", artifact_dir=str(fetched))

    shown = runner.invoke(app, ["runs", "--show", "r1"])
    assert shown.exit_code == 0, shown.output
    assert f"at {facts['commit'][:12]}" in shown.stdout
    assert f"uncommitted changes: sha256 {facts['patch_sha256'][:16]}" in shown.stdout
    assert "overrides: steps=5" in shown.stdout
    assert "packages: 1 on the host (torch 2.7.1)" in shown.stdout


def test_again_sends_the_snapshot_s_code_from_a_worktree_and_leaves_the_tree_alone(
    home: Path, project: Path
) -> None:
    (project / "model.py").write_text("WIDTH = 16\n")
    History().start("r1", name="r1")
    session = Session(inventory=None)
    snapshot.record(session, "r1", project=project, config=project / "run.yaml", options={})
    git(project, "commit", "-qam", "two")
    (project / "model.py").write_text("WIDTH = 32\n")  # the project moved on

    with snapshot.again(session, "r1") as plan:
        assert plan.project is not None and plan.project != project
        assert (plan.project / "model.py").read_text() == "WIDTH = 16\n"  # the run's commit + its patch
        assert "temporary worktree" in plan.said
        History().start("r2", name="r2")  # sent from there: its snapshot names the project, not the worktree
        sent = snapshot.record(session, "r2", project=plan.project, config=plan.config, options={})
    assert (sent["project"], sent["git_root"]) == (str(project), str(project.resolve()))
    with snapshot.again(session, "r2") as plan:
        assert (plan.project / "model.py").read_text() == "WIDTH = 16\n"  # r1's code, again
    assert not plan.project.exists()
    assert (project / "model.py").read_text() == "WIDTH = 32\n"
    assert len(git(project, "worktree", "list").splitlines()) == 1

    gone = runner.invoke(app, ["--json", "train", "--again", "nope"])
    assert gone.exit_code == ExitCode.NOT_FOUND and "forja runs" in json.loads(gone.stdout)["message"]


def test_delete_data_after_needs_a_dataset_in_the_config(project: Path) -> None:
    session = Session(inventory=None)
    with pytest.raises(ConfigError, match=r"data_args\.source is not set") as none:
        datasets.deletion_after_run(session, project / "run.yaml", bucket_copy=False)
    assert none.value.field == "--delete-data-after"
    cfg = project / "bucket.yaml"
    cfg.write_text("data_args: {source: gs://b/datasets/digits}\n")
    assert datasets.deletion_after_run(session, cfg, bucket_copy=True) == {
        "trainer_run_delete_data": "/var/lib/forja/data/digits",
        "trainer_run_delete_bucket_copy": "gs://b/datasets/digits"}
    with pytest.raises(ConfigError, match="goes with --delete-data-after"):
        datasets.deletion_after_run(session, cfg, bucket_copy=True, asked=False)
