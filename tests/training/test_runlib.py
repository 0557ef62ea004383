"""trainer.runlib, the library a user's own loop uses: the same files and survival as the built-in trainer.

Real runs in this process (one rank) and real files: checkpoints written and read back, a flipped
byte, metrics read by the trainer's report and by forja's status reader on the host
(roles/trainer_run/files/forja-train-state), and a real SIGTERM delivered to this process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from state_reader import state_reader
from trainer_helpers import subprocess_env

from trainer import exit_codes, run_folder, runlib
from trainer.metrics import METRIC_FIELDS, read_jsonl
from trainer.report import render


def short_run(
    run_dir: Path,
    steps: int,
    start_signal_at: int | None = None,
    lr: float = 0.1,
    save_every: int = 5,
    stop_requested: bool = False,
    **run_args: object,
) -> runlib.Run:
    """A tiny loop in the library's documented shape; SIGTERM to this process at ``start_signal_at``,
    after leaving `forja stop`'s request in the run's folder when ``stop_requested``.

    ``lr`` 5 makes it diverge within a few dozen steps (test_divergence.py)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with runlib.Run(total_steps=steps, config={"lr": lr}, run_dir=run_dir, **run_args) as run:
        state = run.resume()
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
        for step in range(run.start_step + 1, steps + 1):
            x = torch.randn(8, 4)
            loss = (model(x).squeeze(-1) - x.sum(-1)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.log(step, loss=loss.item(), lr=lr, samples=8)
            if step == start_signal_at:
                if stop_requested:
                    (run_dir / run_folder.STOP_REQUESTED).write_text("forja stop\n")
                os.kill(os.getpid(), signal.SIGTERM)
            stop = run.should_stop()
            if stop or step % save_every == 0 or step == steps:
                run.save({"model": model.state_dict(), "opt": opt.state_dict()}, step)
            if stop:
                break
    return run


def test_the_contract_is_read_from_forja_and_torchrun_variables(tmp_path: Path) -> None:
    env = {
        "FORJA_RUN": "own",
        "FORJA_RUN_DIR": str(tmp_path / "run"),
        "FORJA_CHECKPOINT_DIR": str(tmp_path / "run" / run_folder.CHECKPOINTS_DIR),
        "FORJA_RESUME_FROM": str(tmp_path / "run" / run_folder.CHECKPOINTS_DIR / "ckpt-5.pt"),
        "FORJA_PRICE_PER_HOUR": "0.8536",
        "FORJA_NNODES": "1",
        "FORJA_NODE_RANK": "0",
        "FORJA_NPROC_PER_NODE": "2",
        "FORJA_WORLD_SIZE": "2",
        "FORJA_CONFIG": "/etc/forja/train/own.yaml",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
    }
    c = runlib.Contract.from_env(env)
    assert (c.run, c.rank, c.local_rank, c.world_size, c.nproc_per_node) == ("own", 1, 1, 2, 2)
    assert c.price_per_hour == pytest.approx(0.8536)
    assert c.resume_from == tmp_path / "run" / run_folder.CHECKPOINTS_DIR / "ckpt-5.pt"
    assert c.config == Path("/etc/forja/train/own.yaml")
    local = runlib.Contract.from_env({})
    assert (local.run_dir.name, local.rank, local.world_size, local.resume_from) == ("forja-run", 0, 1, None)
    with pytest.raises(ValueError, match="FORJA_PRICE_PER_HOUR='cheap'"):
        runlib.Contract.from_env({"FORJA_PRICE_PER_HOUR": "cheap"})


def test_a_completed_run_leaves_a_summary_and_a_checkpoint_that_resumes(tmp_path: Path) -> None:
    run = short_run(tmp_path / "run", steps=12)
    assert (run.status, run.exit_code) == ("completed", exit_codes.COMPLETED)
    summary = json.loads((tmp_path / "run" / run_folder.SUMMARY).read_text())
    assert (summary["status"], summary["steps"], summary["last_checkpoint"]) == (
        "completed",
        12,
        "ckpt-12.pt",
    )

    again = runlib.Run(total_steps=20, run_dir=tmp_path / "run")
    with again:
        state = again.resume()
        assert again.resume() is None  # handed over once
    assert state is not None and state["step"] == 12 and again.start_step == 12
    assert set(state) >= {"model", "opt", "step", "wall_s", "rng"}
    events = [e["event"] for e in read_jsonl(tmp_path / "run" / run_folder.EVENTS)]
    assert events[0] == "start" and "resume" in events


def test_sigterm_sets_the_flag_saves_exits_preempted_and_the_next_session_resumes(
    tmp_path: Path,
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    run = short_run(tmp_path / "run", steps=100, start_signal_at=7)
    assert signal.getsignal(signal.SIGTERM) == before  # handlers restored when the session ends
    assert (run.status, run.exit_code, run.step) == ("preempted", exit_codes.PREEMPTED, 7)
    summary = json.loads((tmp_path / "run" / run_folder.SUMMARY).read_text())
    assert (summary["status"], summary["last_checkpoint"]) == ("preempted", "ckpt-7.pt")
    preempt = [e for e in read_jsonl(tmp_path / "run" / run_folder.EVENTS) if e["event"] == "preempt"]
    assert preempt[0]["signal"] == "SIGTERM" and preempt[0]["saved_step"] == 7

    done = short_run(tmp_path / "run", steps=20)
    assert (done.status, done.start_step, done.step) == ("completed", 7, 20)
    summary = json.loads((tmp_path / "run" / run_folder.SUMMARY).read_text())
    assert (summary["resumed_from_step"], summary["preemptions"]) == (7, 1)
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / run_folder.METRICS)] == list(range(1, 21))


def _builtin_run(run_dir: Path, steps: int, start_signal_at: int | None = None,
                 stop_requested: bool = False) -> None:
    """The built-in trainer on the tiny digits config, with the same SIGTERM as `short_run`."""
    from trainer_helpers import tiny_digits

    from trainer.config import validate
    from trainer.train import train

    def hook(done: int) -> None:
        if done == start_signal_at:
            if stop_requested:
                (run_dir / run_folder.STOP_REQUESTED).write_text("forja stop\n")
            os.kill(os.getpid(), signal.SIGTERM)

    raw = tiny_digits(run_dir.parent, out_dir=str(run_dir), steps=steps, checkpoint_every_steps=5)
    train(validate(raw), on_step=hook)


@pytest.mark.parametrize("loop", ["runlib", "built-in"])
def test_a_stop_forja_stop_asked_for_counts_as_a_stop_and_a_later_sigterm_as_a_preemption(
    tmp_path: Path, loop: str
) -> None:
    """`forja stop` leaves its request in the run's folder before the unit's SIGTERM: that session
    is a stop, not a preemption (the VM was never taken away). The next session forgets the
    request, so a later SIGTERM without one (Google's) is a preemption again."""
    run_dir = tmp_path / "run"
    run = short_run if loop == "runlib" else _builtin_run
    run(run_dir, 20, start_signal_at=7, stop_requested=True)
    stopped = [e for e in read_jsonl(run_dir / run_folder.EVENTS) if e["event"] == "preempt"]
    assert [e.get("requested_by") for e in stopped] == ["forja stop"]
    run(run_dir, 20, start_signal_at=12)
    assert not (run_dir / run_folder.STOP_REQUESTED).exists(), "the resumed session forgot the request"
    run(run_dir, 20)
    summary = json.loads((run_dir / run_folder.SUMMARY).read_text())
    assert (summary["status"], summary["stops"], summary["preemptions"], summary["restarts"]) == (
        "completed", 1, 1, 0), summary


def test_the_resume_point_skips_a_checkpoint_whose_bytes_changed(tmp_path: Path) -> None:
    ckpts = tmp_path / "run" / run_folder.CHECKPOINTS_DIR
    assert runlib.resume_point(ckpts) is None
    short_run(tmp_path / "run", steps=10)  # saves at 5 and 10
    assert runlib.resume_point(ckpts) == ckpts / "ckpt-10.pt"
    newest = ckpts / "ckpt-10.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 3] ^= 0x01  # one flipped bit inside the tensors
    newest.write_bytes(bytes(data))
    assert runlib.resume_point(ckpts) == ckpts / "ckpt-5.pt"
    assert newest.exists()  # the launcher's look only reads
    cli = subprocess.run(
        [sys.executable, "-m", "trainer.runlib", "resume-point", str(ckpts)],
        env=subprocess_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert cli.returncode == 0 and cli.stdout.strip() == str(ckpts / "ckpt-5.pt"), cli.stderr

    run = runlib.Run(run_dir=tmp_path / "run")
    with run:
        state = run.resume()
    assert state is not None and state["step"] == 5
    assert (ckpts / "ckpt-10.pt.corrupt").exists()  # the session sets it aside for a person to see


def test_a_run_whose_every_checkpoint_is_corrupt_stops_with_its_own_exit_code(tmp_path: Path) -> None:
    short_run(tmp_path / "run", steps=5)
    path = tmp_path / "run" / run_folder.CHECKPOINTS_DIR / "ckpt-5.pt"
    path.write_bytes(path.read_bytes()[:-200] + b"x" * 200)

    def script(_argv: list[str]) -> int:
        with runlib.Run(run_dir=tmp_path / "run") as run:
            run.resume()
        return run.exit_code

    assert runlib.main(script, []) == exit_codes.NO_VALID_CHECKPOINT
    assert exit_codes.NO_VALID_CHECKPOINT in exit_codes.NO_RESTART


def test_metric_lines_are_read_by_the_report_and_by_forjas_status_reader(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    short_run(run_dir, steps=10, render_plots=False)
    rows = list(read_jsonl(run_dir / run_folder.METRICS))
    assert all(set(METRIC_FIELDS) <= set(row) for row in rows)
    summary = render(run_dir)
    assert summary["status"] == "completed" and summary["median_samples_per_s"] > 0
    assert all((run_dir / p).stat().st_size > 0 for p in summary["plots"])
    reader = state_reader()
    assert reader.total_steps(str(run_dir)) == 10
    assert reader.last_json_line(str(run_dir / run_folder.METRICS))["step"] == 10


def test_cost_uses_the_contracts_price_and_counts_the_whole_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORJA_PRICE_PER_HOUR", "3600")  # one dollar per second: cost_usd == wall_s
    short_run(tmp_path / "alone", steps=5, render_plots=False)
    alone = list(read_jsonl(tmp_path / "alone" / run_folder.METRICS))[-1]
    assert alone["cost_usd"] == pytest.approx(alone["wall_s"])
    monkeypatch.setenv("FORJA_RUN", "own")  # launched by forja: the process exists for the run
    short_run(tmp_path / "forja", steps=5, render_plots=False)
    last = list(read_jsonl(tmp_path / "forja" / run_folder.METRICS))[-1]
    age = last["time"] - psutil.Process().create_time()  # this pytest process: many seconds old
    assert last["wall_s"] == pytest.approx(age, abs=1.0) and last["wall_s"] > alone["wall_s"]


def test_saving_without_a_model_entry_is_refused_naming_the_fix(tmp_path: Path) -> None:
    with runlib.Run(run_dir=tmp_path / "run") as run, pytest.raises(ValueError, match="'model' entry"):
        run.save({"weights": torch.zeros(1)}, 1)
