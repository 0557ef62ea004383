"""The watcher knows a Flex-start VM ends at its max run duration: one Google stopped then is started
again (its run saved and mirrored its checkpoint before, trainer/preemption.py), one stopped earlier
by its user is left alone, and a request still queued for capacity (PENDING) is waited for."""

from __future__ import annotations

import pytest

from forja.contract import InstanceState
from forja.managed import RecoveryBudget, Tally, decide

ZONES = ("us-east1-d", "us-east1-b")
ENDS = "2026-11-30T10:00:00.000-08:00"
FLEX = {"exists": True, "zone": "us-east1-d", "provisioning_model": "FLEX_START", "ends_at": ENDS}


@pytest.mark.parametrize(
    ("vm", "action", "says"),
    [
        (InstanceState(**FLEX, status="TERMINATED", last_stop="2026-11-30T18:00:01Z"), "restart",
         "max run duration"),
        (InstanceState(**FLEX, status="TERMINATED", last_stop="2026-11-30T17:00:00Z"), "done",
         "not preempted"),
        (InstanceState(**FLEX, status="PENDING"), "watch", "PENDING"),
    ],
)
def test_the_watcher_restarts_a_flex_start_vm_stopped_at_its_end(vm, action, says):
    decision = decide(vm, "preempted", Tally(), RecoveryBudget(), ZONES)
    assert decision.action == action and says in decision.reason
    if action == "restart":
        assert decision.zones == ("us-east1-d",)


def test_a_spent_budget_stops_restarting_a_flex_start_vm():
    vm = InstanceState(**FLEX, status="TERMINATED", last_stop="2026-11-30T18:00:01Z")
    assert decide(vm, "preempted", Tally(recoveries=10), RecoveryBudget(), ZONES).action == "give_up"
