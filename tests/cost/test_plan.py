"""`forja plan`: bad machine input refused before anything runs; the plan priced and calibrated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from forja.api import Forja
from forja.cli import app
from forja.cli.plan import describe
from forja.cost.prices import load_prices
from forja.errors import ConfigError
from forja.history import History
from forja.plan import PlanReport
from trainer.plan_format import format_plan

TINY = {"model": "trainer.gpt:gpt", "model_args": {"layers": 1, "width": 32, "heads": 2, "context": 32,
        "vocab_size": 256}, "data": "trainer.gpt:tokens", "data_args": {"context": 32, "max_bytes": 20000},
        "steps": 50, "batch_size": 8, "max_batch_size": 8}  # fmt: skip  (a cap: fewer traces in the search)


@pytest.fixture
def forja(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Forja:
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    return Forja(project_dir=tmp_path, inventory=None, history=History(tmp_path / "home" / "history.sqlite"))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def test_every_gpu_of_the_machine_catalog_has_plan_constants_with_their_sources() -> None:
    from forja.machines import catalog
    from trainer.gpus import gpu_table

    table = gpu_table()
    gpus = {m.gpu_type for m in catalog().MACHINE_TYPES.values() if m.gpu_type} | {"nvidia-tesla-t4"}
    assert gpus <= set(table), gpus - set(table)
    for name, spec in table.items():
        assert set(spec.sources) >= {"usable_mib", "context_mib", "tflops"}, name


def test_an_unknown_machine_type_is_refused_naming_close_ones(forja: Forja, config: Path) -> None:
    with pytest.raises(ConfigError, match=r"machine: 'g2-standard-7' is not in forja's machine catalog.*g2-"):
        forja.plan(config, machine="g2-standard-7")


def test_a_gpu_count_the_machine_does_not_have_is_refused_naming_one_that_has_it(
    forja: Forja, config: Path
) -> None:
    with pytest.raises(ConfigError, match=r"gpus: g2-standard-8 has 1 x nvidia-l4, not 2; give --gpus 1, "
                                          r"or a machine type with enough: g2-standard-24 \(2\)"):
        forja.plan(config, machine="g2-standard-8", gpus=2)


def test_a_machine_without_gpus_is_refused(forja: Forja, config: Path) -> None:
    with pytest.raises(ConfigError, match="e2-standard-4 comes with no GPU"):
        forja.plan(config, machine="e2-standard-4")


def test_forja_plan_prints_the_plan_and_its_cost_and_calibrates_from_a_measured_run(
    forja: Forja, config: Path, tmp_path: Path
) -> None:
    """--json: the trainer's plan whole, priced on demand and Spot; --calibrate: scaled by what the
    newest fetched run of the same model on an L4 measured (its summary.json)."""
    run = tmp_path / "results" / "tiny-1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({**TINY, "precision": "bf16"}))
    (run / "summary.json").write_text(json.dumps({
        "status": "completed", "micro_batch": 8, "accum_steps": 1, "precision": "bf16",
        "gpu_name": "NVIDIA L4", "peak_reserved_mib": 40.0, "step_s": 0.5}))  # fmt: skip
    forja.history.start("tiny-1", name="tiny-1", hosts=["forja-l4"], config_path=str(config), config_hash="x")
    forja.history.update("tiny-1", status="completed", artifact_dir=str(run))
    shown = CliRunner().invoke(app, ["--json", "plan", str(config), "--calibrate"])
    assert shown.exit_code == 0, shown.output
    found = json.loads(shown.stdout)
    rates = load_prices(None).data["machine_types"]["g2-standard-8"]["us-east1"]
    assert found["usd_per_hour"] == rates["on_demand"] and found["spot_usd_per_hour"] == rates["spot"]
    assert found["usd"] == pytest.approx(found["seconds"] * rates["on_demand"] / 3600)
    assert found["spot_usd"] == pytest.approx(found["seconds"] * rates["spot"] / 3600)
    plan = found["trainer"]
    assert found["calibrated_from"] == "run tiny-1" and plan["calibration"]["source"] == "run tiny-1"
    # measured over predicted at the run's own micro-batch: the plan's step time there is the run's
    assert plan["step_s"]["how"] == "calibrated" and plan["step_s"]["value"] == pytest.approx(0.5)
    assert plan["plan"] == {"micro_batch": 8, "accum_steps": 1, "world_size": 1, "global_batch": 8}
    assert plan["peak_mib"]["value"] == pytest.approx(plan["gpu"]["context_mib"]["value"] + 40.0)
    # for people: the same figures, each with how it was found and how sure it is
    text = format_plan(plan) + "\n" + describe(PlanReport(**found))
    for words in ("largest micro-batch that fits", "(calibrated, ±5%)", "calibrated by     run tiny-1",
                  "on Spot at $0.", "on g2-standard-8 in us-east1-d"):
        assert words in text, words


