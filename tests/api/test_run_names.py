"""A run's name is its identity on the host: a new run is never sent under a completed run's name.

Before: the host started nothing (a completed run is never re-run), forja followed the old run, and
reported its results and events as the new run's. The inventory names a host nothing answers on:
a name refused here is refused before any host is contacted (else HostUnreachable).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from apihosts import REPO, write_inventory

from forja import errors
from forja.api import Forja
from forja.history import History
from trainer import run_folder

DIGITS = REPO / "trainer" / "configs" / "digits.yaml"


@pytest.fixture
def ghost(tmp_path: Path) -> Forja:
    unreachable = {"ansible_host": "127.0.0.1", "ansible_port": 1}
    inventory = write_inventory(tmp_path / "inv.yml", {"ghost": unreachable})
    return Forja(project_dir=tmp_path, inventory=inventory, host_key_checking=False,
                 private_data_dir=tmp_path / "runner", history=History(tmp_path / "h.sqlite"))  # fmt: skip


def test_a_completed_runs_name_is_refused_naming_the_run_and_a_free_name(ghost: Forja) -> None:
    ghost.history.start("digits", name="digits", hosts=["forja-l4"])
    ghost.history.record_event("digits", "preempted", zone="us-east1-d")
    ghost.history.update("digits", status="completed", ended_at="2026-11-28T10:00:00+00:00", steps=300)
    before = (ghost.history.get("digits"), ghost.history.events("digits"))
    with pytest.raises(errors.ConfigError) as info:
        ghost.train(DIGITS, name="digits")
    assert info.value.field == "name" and info.value.exit_code == errors.ExitCode.USAGE
    message = info.value.message
    assert "run 'digits' already completed (2026-11-28T10:00:00+00:00 on forja-l4)" in message
    assert "--name (e.g. digits-2), or --replace to keep the old one as digits-replaced-<time>" in message
    assert (ghost.history.get("digits"), ghost.history.events("digits")) == before, "nothing changed"


def test_a_replacement_the_host_never_took_is_undone(ghost: Forja) -> None:
    """--replace sets the old run aside first; when the play fails before the host's folder moved
    (here: no host answers), the history and the fetched results are as they were."""
    ghost.history.start("digits", name="digits", hosts=["ghost"])
    ghost.history.record_event("digits", "preempted", zone="us-east1-d")
    ghost.history.update("digits", status="completed", ended_at="2026-11-28T10:00:00+00:00", steps=300,
                         artifact_dir=str(ghost.results_dir("digits") / "ghost"))
    (ghost.results_dir("digits") / "ghost").mkdir(parents=True)
    (ghost.results_dir("digits") / "ghost" / run_folder.SUMMARY).write_text("{}")
    before = (ghost.history.get("digits"), ghost.history.events("digits"))
    with pytest.raises(errors.HostUnreachable):
        ghost.train(DIGITS, name="digits", replace=True)
    assert (ghost.history.get("digits"), ghost.history.events("digits")) == before
    assert [r.run_id for r in ghost.history.list()] == ["digits"]
    assert (ghost.results_dir("digits") / "ghost" / run_folder.SUMMARY).is_file()


def test_a_running_run_is_not_replaced(ghost: Forja) -> None:
    ghost.history.start("digits", name="digits", hosts=["ghost"])
    with pytest.raises(errors.ConfigError) as info:
        ghost.train(DIGITS, name="digits", replace=True)
    assert info.value.field == "replace" and "stop it first (forja stop digits)" in info.value.message
    assert ghost.history.get("digits").status == "running"


@pytest.mark.parametrize("status", ["preempted", "stopped", "failed", "diverged"])
def test_a_run_that_did_not_complete_may_be_sent_again_to_resume(ghost: Forja, status: str) -> None:
    ghost.history.start("digits", name="digits", hosts=["ghost"])
    ghost.history.update("digits", status=status, ended_at="2026-11-28T10:00:00+00:00")
    with pytest.raises(errors.HostUnreachable):  # past the name check: on to the host
        ghost.train(DIGITS, name="digits")
