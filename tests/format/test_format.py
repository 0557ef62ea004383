"""Numbers for people (forja.format): each formatter against a table of real values.

The inputs are figures forja really printed raw before (the digits demo's final loss and cost,
a g2-standard-8's rate, the sandbox's throughput), with what a person should read instead.
"""

from __future__ import annotations

import math

import pytest

from forja import format as fmt


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0.008180368691682816, "0.008180"),  # the digits demo's final loss, once printed in full
        (2.302585092994046, "2.303"),  # ln(10): an untrained 10-class model
        (0.31, "0.3100"),
        (1.0, "1.000"),
        (12.5, "12.50"),
        (123456.0, "1.235e+05"),
        (0.0, "0.000"),
        (math.inf, "inf"),
        (None, ""),
        (math.nan, "nan"),  # a diverged step is said, not shown as a missing figure
    ],
)
def test_a_loss_shows_four_significant_digits(value: float | None, shown: str) -> None:
    assert fmt.loss(value) == shown


@pytest.mark.parametrize(
    ("usd", "shown"),
    [
        (0.0019884954039891124, "0.2¢"),  # the digits demo on the sandbox, once printed in full
        (0.2, "$0.20"),
        (0.199999, "$0.20"),
        (0.01, "$0.01"),
        (0.0099, "0.99¢"),
        (0.00046, "0.046¢"),
        (0.00000001, "<0.001¢"),
        (620.5, "$620.50"),  # a g2-standard-8 left running for a month
        (1234.567, "$1,234.57"),
        (0.0, "$0.00"),
        (-0.2, "-$0.20"),
        (None, ""),
    ],
)
def test_money_is_in_cents_or_fractions_of_a_cent(usd: float | None, shown: str) -> None:
    assert fmt.money(usd) == shown


@pytest.mark.parametrize(
    ("rate", "shown"),
    [
        (0.7068, "$0.71/h"),  # g2-standard-8 on demand in us-east1
        (0.2827, "$0.28/h"),  # the same, Spot
        (0.0042, "$0.0042/h"),
        (0.0, "$0.00/h"),
        (None, ""),
    ],
)
def test_an_hourly_rate_carries_its_unit(rate: float | None, shown: str) -> None:
    assert fmt.hourly(rate) == shown


@pytest.mark.parametrize(
    ("value", "unit", "shown"),
    [
        (3.2149, "steps", "3.21 steps/s"),
        (3.2, "steps", "3.2 steps/s"),
        (1249.6, "samples", "1,250 samples/s"),
        (412.37, "samples", "412 samples/s"),
        (0.05, "steps", "0.05 steps/s"),
        (None, "steps", ""),
    ],
)
def test_a_throughput_carries_its_unit(value: float | None, unit: str, shown: str) -> None:
    assert fmt.per_second(value, unit) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.4321, "0.4 s"),
        (3.0, "3 s"),  # a --timeout of 3 reads as the user wrote it
        (9.96, "10.0 s"),
        (42.4, "42 s"),
        (187.0, "3m 07s"),
        (7512.0, "2h 05m"),
        (273_600.0, "3d 04h"),
        (-1.0, ""),
        (None, ""),
    ],
)
def test_a_duration_uses_at_most_two_units(seconds: float | None, shown: str) -> None:
    assert fmt.duration(seconds) == shown


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("final_loss", 0.008180368691682816, "0.008180"),
        ("cost_usd", 0.0019884954039891124, "0.2¢"),
        ("accuracy", 0.97222, "97.2%"),
        ("samples_per_s", 1249.6, "1,250 samples/s"),
        ("wall_s", 187.0, "3m 07s"),
        ("steps", 12000, "12,000"),
        ("status", "completed", "completed"),
        ("final_loss", "n/a", "n/a"),
        ("cost_usd", None, ""),
    ],
)
def test_a_summary_field_is_shown_by_what_it_means(name: str, value: object, shown: str) -> None:
    assert fmt.field(name, value) == shown


def test_a_timestamp_is_shown_to_the_minute() -> None:
    assert fmt.timestamp("2026-11-24T11:10:21.123456+00:00") == "2026-11-24 11:10"
    assert fmt.timestamp(None) == ""


# --- One home for the rules the trainer's log line shares ---------------------------------------------


def test_the_trainer_s_log_line_and_forja_use_one_set_of_rules() -> None:
    """The trainer cannot import forja; forja takes the rules from the trainer's module instead of a copy."""
    from trainer import figures

    for name in ("loss", "money", "per_second", "duration", "MISSING"):
        assert getattr(fmt, name) is getattr(figures, name), name


def test_the_trainer_s_figures_need_only_the_standard_library() -> None:
    """forja imports trainer.figures from the product install, where torch and the trainer's pins
    are absent."""
    import ast
    import sys
    from pathlib import Path

    source = Path(__file__).resolve().parents[2] / "trainer" / "figures.py"
    tree = ast.parse(source.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
