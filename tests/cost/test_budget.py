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
    assert "10.0 h of running left" in result.message
    assert "warning at 80%" in result.message


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
