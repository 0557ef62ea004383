"""The managed watcher's zone moves in the order of Google's capacity advice (issue 28).

`forja.zones.ranked` turns the published ranking (gcp_gpu_zones, run by playbooks/zones.yml; its own
tests are tests/gcp/test_zone_advice.py) into the order the watcher tries; here the ranking is handed
in, so the choice is tested without a cloud.
"""

from __future__ import annotations

from typing import Any

import pytest

from forja import errors, managed
from forja import zones as zone_advice
from forja.contract import ZoneRank, ZoneReport


def _report(signal: str = "advice", **scores: float | None) -> ZoneReport:
    rows = [ZoneRank(zone=z, obtainability=s, given=i) for i, (z, s) in enumerate(scores.items())]
    rows.sort(key=lambda r: -(r.obtainability or -1.0))
    return ZoneReport(project="p", machine_type="g2-standard-8", provisioning_model="SPOT", signal=signal,
                      zones=rows)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    answer: dict[str, Any] = {}

    def fake(session: Any, regions: Any = (), extravars: Any = None) -> ZoneReport:
        calls.append(dict(extravars or {}))
        if isinstance(answer.get("report"), Exception):
            raise answer["report"]
        return answer["report"]

    monkeypatch.setattr(zone_advice, "zones", fake)
    calls.append(answer)  # calls[0]: where the test puts the answer
    return calls


def test_the_best_scored_zone_comes_first_and_zones_not_given_are_left_out(asked) -> None:
    asked[0]["report"] = _report(**{"us-east1-b": 0.1, "us-central1-a": 0.9, "us-central1-b": 0.99})
    order, report = zone_advice.ranked(None, ["us-east1-b", "us-central1-a"])  # type: ignore[arg-type]
    assert order == ["us-central1-a", "us-east1-b"]
    assert asked[1]["gcp_instance_zone"] == "us-east1-b"
    assert asked[1]["gcp_instance_fallback_zones"] == ["us-central1-a"]
    assert zone_advice.scores(report, order)[0] == {
        "zone": "us-central1-a", "obtainability": 0.9, "estimated_uptime_s": None,
        "preemption_rate_30d": None, "no_signal": ""}


@pytest.mark.parametrize("answer", [
    _report("no signal: the advisor is not available for this project", **{"us-central1-a": None}),
    errors.ForjaError("the zone ranking published nothing"),
])
def test_no_signal_or_no_ranking_keeps_the_users_order(asked, answer) -> None:
    asked[0]["report"] = answer
    order, _ = zone_advice.ranked(None, ["us-east1-b", "us-central1-a"])  # type: ignore[arg-type]
    assert order == ["us-east1-b", "us-central1-a"]


def test_the_watcher_moves_by_the_advice_and_keeps_zones_that_ran_out_last(asked, tmp_path) -> None:
    asked[0]["report"] = _report(**{"us-east1-b": 0.1, "us-central1-a": 0.9, "us-east1-d": 1.0})
    state = managed.WatchState(run="r", zones=["us-east1-d", "us-east1-b", "us-central1-a"],
                               tally=managed.Tally(failed_zones=("us-east1-d",)))
    watcher = managed.Watcher(None, state)  # type: ignore[arg-type]
    decision = managed.decide(
        managed.InstanceState(name="vm", exists=True, zone="us-east1-d", status="TERMINATED", spot=True,
                              preempted_at="2026-11-30T06:00:00Z"),
        "running", state.tally, watcher.budget, state.zones)
    assert decision.action == "move" and decision.zones == ("us-east1-b", "us-central1-a", "us-east1-d")
    zones, why = watcher._by_advice(decision.zones)
    assert zones == ("us-central1-a", "us-east1-b", "us-east1-d")  # the one that ran out stays last
    assert why["zone_signal"] == "advice"
    assert [s["zone"] for s in why["zone_scores"]] == ["us-central1-a", "us-east1-b"]
