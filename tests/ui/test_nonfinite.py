"""The dashboard stays up when a run goes wrong: a live run reporting +Inf (an fp16 overflow) and a
run whose summary holds a bare NaN (as trainers before forja's JSON rule wrote them).

Real parts: the trainer's own metrics endpoint (trainer/live.py) over HTTP, a real history file, the
dashboard's Starlette app driven by Starlette's own test client. Before, both answers were a 500.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from forja.api import Forja
from forja.cli import app
from forja.history import History
from forja.ui.server import Dashboard, make_app
from trainer import finite, run_folder
from trainer.live import LiveMetrics

TOKEN = "t0ken-for-the-test"
runner = CliRunner()


def strict(text: str) -> Any:
    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def client(tmp_path: Path) -> Any:
    live = LiveMetrics("overflow", tmp_path)
    port = live.serve(0, 1)
    assert port is not None
    live.track(100, lambda: 0.01)
    live.progress(5)
    live.logged(math.inf, 120.0, None, 0.0)

    history = History(tmp_path / "history.sqlite")
    run = tmp_path / "results" / "nan-run" / "host"
    run.mkdir(parents=True)
    (run / run_folder.SUMMARY).write_text('{"status": "diverged", "steps": 3, "final_loss": NaN}\n')
    history.start("nan-run", name="nan-run", hosts=["host"])
    history.update("nan-run", status="diverged", artifact_dir=str(run), ended_at="2026-11-29T06:00:00+00:00")
    board = Dashboard(Forja(tmp_path, history=history), [f"http://127.0.0.1:{port}/metrics"])
    board.poll_live()
    try:
        with TestClient(make_app(board, TOKEN, collect=False), base_url="http://127.0.0.1") as test_client:
            test_client.headers["Authorization"] = f"token {TOKEN}"
            yield test_client
    finally:
        live.close()


def test_a_live_run_reporting_inf_is_served_as_null_with_a_flag(client: TestClient) -> None:
    reply = client.get("/api/live")
    assert reply.status_code == 200, reply.text
    (latest,) = [r["latest"] for r in strict(reply.text)["runs"].values()]
    assert latest["loss"] is None and latest[finite.FLAG] == {"loss": "inf"}
    assert latest["step"] == 5  # the rest of the reading is intact


def test_a_diverged_run_with_a_nan_summary_is_listed_and_its_page_opens(client: TestClient) -> None:
    listed = client.get("/api/runs")
    assert listed.status_code == 200, listed.text
    assert [(r["run_id"], r["status"]) for r in strict(listed.text)["runs"]] == [("nan-run", "diverged")]
    page = client.get("/api/runs/nan-run")
    assert page.status_code == 200, page.text
    summary = strict(page.text)["summary"]
    assert summary["final_loss"] is None and summary[finite.FLAG] == {"final_loss": "nan"}


@pytest.mark.parametrize(("loss", "word"), [(math.nan, "nan"), (math.inf, "inf")])
def test_forja_top_names_a_non_finite_loss_and_its_json_stays_json(
    tmp_path: Path, loss: float, word: str
) -> None:
    """On screen the loss reads `nan` or `inf`, not the empty cell of "no loss yet"; under --json it
    is null plus the flag, as in the dashboard's JSON (was: a NaN loss read as missing, and --json
    printed a bare `Infinity`)."""
    live = LiveMetrics("bad-loss", tmp_path)
    port = live.serve(0, 1)
    assert port is not None
    try:
        live.track(100, lambda: 0.01)
        live.progress(5)
        live.logged(loss, 120.0, None, 0.0)
        url = f"http://127.0.0.1:{port}/metrics"
        shown = runner.invoke(app, ["top", "--once", "--url", url], terminal_width=120)
        assert shown.exit_code == 0, shown.output
        (line,) = [x for x in shown.output.splitlines() if x.strip().startswith("loss ")]
        assert line.split() == ["loss", word]
        printed = runner.invoke(app, ["--json", "top", "bad-loss", "--url", url])
        assert printed.exit_code == 0, printed.output
        [sample] = strict(printed.stdout)
        assert sample["loss"] is None and sample[finite.FLAG] == {"loss": word}
        assert sample["step"] == 5
    finally:
        live.close()
