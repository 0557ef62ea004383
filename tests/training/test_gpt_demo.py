"""The GPT demo (trainer.gpt) trains through the normal paths, and reports tokens/s and MFU everywhere.

Real parts: the shipped gpt_tiny.yaml config on CPU through ``trainer.train`` (its data is the Python
standard library's own source, byte tokens), the trainer's Prometheus endpoint over HTTP read by
forja's reader (prometheus_client's parser) and shown by `forja top`'s table, and torch's own
FlopCounterMode as the check on the model's stated FLOPs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console

from forja import live as forja_live
from forja.top import run_table
from trainer import run_folder
from trainer.config import load
from trainer.gpt import gpt, tokens
from trainer.live import LiveMetrics
from trainer.mfu import CPU_NOTE
from trainer.train import train

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"


def test_tiny_gpt_trains_on_cpu_and_reports_tokens_per_second_and_mfu_against_the_measured_ceiling(
    tmp_path: Path,
) -> None:
    config = load(CONFIGS / "gpt_tiny.yaml", ["steps=30", "log_every_steps=5", "render_plots=false",
                                               "export_model=false"])  # fmt: skip
    result = train(config, out_dir=tmp_path / "run")
    assert result.status == "completed"
    lines = [json.loads(x) for x in (tmp_path / "run" / run_folder.METRICS).read_text().splitlines()]
    assert lines[-1]["loss"] < lines[0]["loss"] - 0.5 < math.log(256), [x["loss"] for x in lines]
    summary = result.summary
    context = config.model_args["context"]
    assert summary["tokens_per_s"] == pytest.approx(summary["samples_per_s"] * context)
    assert summary["flops_per_sample"] == gpt(**config.model_args).flops_per_sample()
    achieved = summary["flops_per_sample"] * summary["samples_per_s"]
    assert summary["achieved_tflops"] == pytest.approx(achieved / 1e12)
    assert summary["ceiling_tflops"] > 0 and 0 < summary["mfu_ceiling"] < 1
    assert (summary["mfu"], summary["peak_tflops"], summary["mfu_note"]) == (None, None, CPU_NOTE)
    assert 0 < summary["startup_s"] < summary["wall_s"]
    assert all(x["tokens_per_s"] == pytest.approx(x["samples_per_s"] * context) and "mfu" not in x
               for x in lines)  # fmt: skip


def test_the_stated_flops_match_what_torch_counts() -> None:
    """The 6 x weights x tokens + attention count (what MFU divides) against FlopCounterMode on a real
    step. Attention runs as SDPA's math kernel here: the CPU's fused kernel has no FLOP formula in
    torch, so the counter would miss it. Causal attention is counted whole by both."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model = gpt(layers=2, width=64, heads=4, context=32, vocab_size=256)
    batch = torch.randint(0, 256, (3, 32))
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        logits = model(batch)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.flatten()).backward()
    assert model.flops_per_sample() == counter.get_total_flops() / 3


def test_token_data_is_deterministic_next_token_pairs_from_the_standard_library() -> None:
    train_set, held = tokens(context=16, max_bytes=4096, eval_fraction=0.25)
    again, _ = tokens(context=16, max_bytes=4096, eval_fraction=0.25)
    x, y = train_set.tensors
    assert torch.equal(x, again.tensors[0]) and torch.equal(x[:, 1:], y[:, :-1])
    assert (len(train_set), len(held)) == (191, 64) and int(x.max()) < 256
    with pytest.raises(ValueError, match="vocab_size: 100 is below"):
        gpt(vocab_size=100)


def test_live_metrics_serve_tokens_and_mfu_only_once_known_and_forja_top_shows_them(tmp_path: Path) -> None:
    endpoint = LiveMetrics("gpt", tmp_path)
    port = endpoint.serve(0, 1)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        before = forja_live.scrape(url)
        assert (before.tokens_per_second, before.mfu, before.mfu_ceiling) == (None, None, None)
        endpoint.logged(2.5, 100.0, 10.0, 0.0, {"tokens_per_s": 6400.0, "mfu": None, "mfu_ceiling": 0.25})
        sample = forja_live.scrape(url)
    finally:
        endpoint.close()
    assert (sample.tokens_per_second, sample.mfu, sample.mfu_ceiling) == (6400.0, None, 0.25)
    console = Console(width=120, record=True)
    console.print(run_table(sample, sample.scraped_at))
    shown = console.export_text()
    assert "100 samples/s  (6,400 tokens/s)" in shown and "25.0% of measured ceiling" in shown
    assert "datasheet" not in shown
