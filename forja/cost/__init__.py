"""Cost guard: the price table, spend from running intervals, and budget caps.

The host-side enforcement (idle stop, spend cap, maximum runtime) is the autostop role's agent;
this package is what the controller uses to price instances and report on them.
"""

from forja.cost.budget import Budget, BudgetCheck, Level, check
from forja.cost.prices import PriceError, PriceTable, Rate, load_prices, region_of
from forja.cost.spend import CostLine, Instance, Interval, compute_spend, cost_of, cost_report

__all__ = [
    "Budget",
    "BudgetCheck",
    "CostLine",
    "Instance",
    "Interval",
    "Level",
    "PriceError",
    "PriceTable",
    "Rate",
    "check",
    "compute_spend",
    "cost_of",
    "cost_report",
    "load_prices",
    "region_of",
]
