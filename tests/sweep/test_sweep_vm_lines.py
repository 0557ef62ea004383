"""On the VMs a sweep reads a trial's metric lines from its journal (what `forja logs` shows): every
progress line the trainer printed since the last look feeds the pruner at its step, not only the
newest line the status play carries."""

from __future__ import annotations

from forja.sweep_runners import series_of
from trainer.metrics import progress_line


def test_each_progress_line_in_the_journal_is_a_metric_line_for_the_pruner() -> None:
    records = [{"step": step, "loss": loss, "lr": 1e-3, "samples_per_s": 1000.0, "data_wait_s": 0.0,
                "step_time_s": 0.1, "cpu_util": 50.0, "cost_usd": 0.01}
               for step, loss in ((5, 2.25), (10, 1.5), (15, 0.0123), (20, float("nan")))]
    journal = "\n".join([
        "Nov 30 12:00:00 forja-l4 python[812]: INFO loading the digits",
        *(f"Nov 30 12:00:0{i} forja-l4 python[812]: {progress_line(record, 30, 12.0)}"
          for i, record in enumerate(records)),
    ])
    newest = {"step": 25, "loss": 0.01, "cost_usd": 0.02}

    seen = series_of(journal, newest)

    # a diverged step (nan) is no value to compare; the status play's newest line comes last, whole
    assert seen == ({"step": 5, "loss": 2.25}, {"step": 10, "loss": 1.5}, {"step": 15, "loss": 0.0123},
                    newest)
    assert series_of(journal, {"step": 15, "loss": 0.0123})[-1] == {"step": 15, "loss": 0.0123}
    assert series_of("", newest) == (newest,)
