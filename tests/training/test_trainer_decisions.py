"""What 'auto' becomes, the LR curve, the progress line, and when checkpoints are written."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from trainer_helpers import tiny_digits

from trainer import metrics, run_folder
from trainer.checkpoint import CheckpointManager
from trainer.config import validate
from trainer.data import choose_workers
from trainer.metrics import progress_line, read_jsonl
from trainer.precision import resolve
from trainer.runtime import has_conv, wants_channels_last
from trainer.schedule import lr_at
from trainer.train import train


@pytest.mark.parametrize(
    ("requested", "device", "dtype", "conv", "expected"),
    [
        ("auto", "cuda", "bf16", True, True),
        ("auto", "cuda", "fp32", True, False),
        ("auto", "cuda", "bf16", False, False),
        ("auto", "cpu", "bf16", True, False),
        (True, "cpu", "fp32", False, True),
    ],
)
def test_channels_last_only_where_it_helps(requested, device, dtype, conv, expected) -> None:
    assert wants_channels_last(requested, device, dtype, conv) is expected


def test_conv_models_are_detected_without_allocating() -> None:
    from trainer.demo import digits_cnn

    assert has_conv(digits_cnn) and not has_conv(lambda: torch.nn.Linear(4, 2))


def test_workers_stay_off_on_cpu_and_leave_cores_free_on_gpu() -> None:
    assert choose_workers("auto", "cpu") == 0
    assert 1 <= choose_workers("auto", "cuda") <= 4
    assert choose_workers(3, "cpu") == 3


def test_precision_choice_keeps_an_explicit_request_and_never_picks_fp16_on_cpu() -> None:
    assert resolve("fp32", "cpu") == "fp32"
    assert resolve("auto", "cpu") in ("bf16", "fp32")


def test_lr_warms_up_linearly_then_follows_a_cosine_to_min_lr() -> None:
    kw = {"lr": 1.0, "total_steps": 110, "warmup_steps": 10, "min_lr": 0.1, "cosine": True}
    assert [lr_at(s, **kw) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert lr_at(60, **kw) == pytest.approx(0.55)
    assert lr_at(110, **kw) == pytest.approx(0.1)
    assert lr_at(50, **{**kw, "cosine": False}) == 1.0


def test_progress_line_reads_like_a_sentence() -> None:
    record = {
        "step": 120,
        "loss": 0.312,
        "lr": 0.0018,
        "samples_per_s": 11234.4,
        "step_time_s": 0.01,
        "data_wait_s": 0.0002,
        "gpu_mem_gb": 9.13,
        "gpu_util": 97.0,
        "cpu_util": 35.0,
        "cost_usd": 0.012,
    }
    line = progress_line(record, 400, 70)
    assert line == (
        "step 120/400 | loss 0.3120 | lr 1.80e-03 | 11,234 samples/s | data wait 2% | gpu 9.1 GB 97% | "
        "cpu 35% | $0.01 | eta 1m 10s"
    )


def test_the_cpu_figure_is_read_at_most_once_a_window(monkeypatch: pytest.MonkeyPatch) -> None:
    now, reads = [0.0], []
    real = metrics.psutil.cpu_percent

    def cpu_percent(interval: float | None = None) -> float:
        reads.append(now[0])
        return real(interval)

    monkeypatch.setattr(metrics, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(metrics.psutil, "cpu_percent", cpu_percent)
    window = metrics.CPU_WINDOW_S
    figures = []
    for at in (1e9, 2e9, 2e9 + window / 2, 2e9 + window):  # past any earlier read, then inside a window
        now[0] = at
        figures.append(metrics.cpu_utilisation())
    assert reads == [1e9, 2e9, 2e9 + window]
    assert figures[2] == figures[1]  # inside the window: that window's figure again


def test_progress_line_shows_a_short_run_s_figures_for_people() -> None:
    """A first step on the CPU: a loss to 4 significant digits, a fraction of a cent, hours of eta."""
    record = {"step": 1, "loss": 2.302585092994046, "lr": 3e-4, "samples_per_s": 42.71828,
              "step_time_s": 0.5, "data_wait_s": 0.25, "gpu_mem_gb": None, "cpu_util": 99.4,
              "cost_usd": 0.0019884954039891124}
    line = progress_line(record, 12_000, 7_530.6)
    assert line == ("step 1/12000 | loss 2.303 | lr 3.00e-04 | 42.7 samples/s | data wait 50% | cpu 99% | "
                    "0.2¢ | eta 2h 05m")


def test_checkpoints_on_timer_and_epoch_ends_carry_the_resolved_config(tmp_path: Path) -> None:
    # digits: 1438 samples / 64 = 22 steps per epoch; a timer so short it fires every step
    raw = tiny_digits(
        tmp_path,
        steps=30,
        batch_size=64,
        checkpoint_every_s=1e-6,
        checkpoint_min_interval_s=0,
        keep_checkpoints=50,
    )
    run = Path(raw["out_dir"])
    (run / run_folder.CHECKPOINTS_DIR).mkdir(parents=True)
    (run / run_folder.CHECKPOINTS_DIR / "ckpt-7.pt.tmp.4242").write_bytes(b"half a write")
    train(validate(raw))
    events = read_jsonl(run / run_folder.EVENTS)
    reasons = {e["step"]: e["reason"] for e in events if e["event"] == "checkpoint"}
    assert reasons[22] == "epoch" and reasons[30] == "final" and reasons[5] == "timer"
    stale = list((run / run_folder.CHECKPOINTS_DIR).glob("*.tmp.*"))
    assert not stale, "the stale temporary must be removed at start"
    found = CheckpointManager(run / run_folder.CHECKPOINTS_DIR).load_latest()
    assert found is not None
    assert found.state["config"] == yaml.safe_load((run / run_folder.CONFIG).read_text()) | {"steps": 30}
    assert found.state["config"]["precision"] == "fp32" and found.state["config"]["batch_size"] == 64


def test_a_duplicate_signal_is_absorbed_but_a_later_one_stops_at_once() -> None:
    import os
    import signal

    from trainer.preemption import StopRequest

    # a background job of a non-interactive shell starts with SIGINT ignored: make it Python's default
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # systemd + torchrun deliver the same stop twice
            assert stop.requested and stop.signal_name == "SIGINT"
            stop.received_at -= StopRequest.REPEAT_AFTER_S + 1  # as if the first came seconds ago
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, outer)


def test_epoch_end_checkpoints_of_tiny_epochs_are_rate_limited(tmp_path: Path) -> None:
    raw = tiny_digits(tmp_path, steps=50, batch_size=64, checkpoint_min_interval_s=3600, keep_checkpoints=50)
    train(validate(raw))
    events = read_jsonl(Path(raw["out_dir"]) / run_folder.EVENTS)
    assert [(e["step"], e["reason"]) for e in events if e["event"] == "checkpoint"] == [(50, "final")]
