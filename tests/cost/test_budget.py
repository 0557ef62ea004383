"""Budget levels: ok, warn at the threshold, cap; per instance or for the whole project."""

from __future__ import annotations

import pytest

from forja.cost.budget import Budget, Level, check, check_project
from forja.cost.spend import CostLine


@pytest.mark.parametrize(
    "spend, level",
    [
        (0.0, Level.OK),
        (39.99, Level.OK),
        (40.0, Level.WARN),
        (49.99, Level.WARN),
        (50.0, Level.CAP),
        (75, Level.CAP),
    ],
)
def test_levels_against_a_50_dollar_cap_warning_at_80_percent(spend, level):
    assert check(Budget(50, 0.8), spend).level is level


def test_hours_left_at_the_current_rate():
    result = check(Budget(50, 0.8), spend_usd=41.464, usd_per_hour=0.8536)
    assert result.hours_left == pytest.approx(10.0)
    assert result.message == (
        "spent $41.46 of the $50.00 cap (83%, warning at 80%); 10h 00m of running left at $0.85/h"
    )


def test_a_short_run_s_spend_reads_in_fractions_of_a_cent_while_the_figures_keep_their_digits():
    result = check(Budget(0.01, 0.1), spend_usd=0.0019884954039891124, usd_per_hour=0.0042)
    assert result.message == (
        "spent 0.2¢ of the $0.01 cap (20%, warning at 10%); 1h 54m of running left at $0.0042/h"
    )
    assert result.spend_usd == 0.001988
    assert result.hours_left == pytest.approx((0.01 - 0.0019884954039891124) / 0.0042)


def test_a_reached_cap_says_what_was_spent():
    assert check(Budget(3), 3.2712).message == "spend cap $3.00 reached (spent $3.27)"


@pytest.mark.parametrize(
    "cap, warn, field",
    [(0, 0.8, "cap_usd"), (-5, 0.8, "cap_usd"), (50, 0, "warn_fraction"), (50, 1.2, "warn_fraction")],
)
def test_a_bad_budget_names_the_field_and_the_fix(cap, warn, field):
    with pytest.raises(ValueError, match=f"budget {field} is .*; give"):
        Budget(cap, warn)


def line(name, status, rate, session, total=None):
    return CostLine(
        name,
        "us-east1-d",
        "g2-standard-8",
        False,
        status,
        rate,
        "note",
        0.0,
        session,
        total,
        rate * 730,
        30.0,
        None,
    )


def test_the_project_cap_counts_every_instance_and_the_running_ones_burn_rate():
    lines = [line("a", "RUNNING", 0.85, 10.0), line("b", "TERMINATED", 0.85, 5.0, total=25.0)]
    result = check_project(Budget(40, 0.8), lines)
    assert result.spend_usd == pytest.approx(35.0)
    assert result.level is Level.WARN
    assert result.hours_left == pytest.approx(5 / 0.85)
