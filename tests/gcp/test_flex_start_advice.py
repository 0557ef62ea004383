"""Flex-start is suggested for a Spot VM that Google's capacity advice says it can hardly give:
`forja zones` and `forja check` say so when even the best zone scores below 0.4 (FLEX_START_BELOW),
and say nothing when a zone scores that or better, or when the advisor gave no score at all."""

from __future__ import annotations

import pytest
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_advice import (
    FLEX_START_BELOW,
    ZoneAdvice,
    flex_start_suggestion,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_preflight import WARN, Plan, Preflight
from test_zone_advice import L4, PROJECT, _client, _forja, inventory  # noqa: F401 (a fixture)

from forja_sandbox.compute_emulator import catalog

EAST = [z for z in catalog.ZONES if z.startswith("us-east1-") and z != "us-east1-c"]  # c has no L4


@pytest.mark.parametrize(
    ("scores", "suggests"),
    [([0.1, 0.39], True), ([0.1, FLEX_START_BELOW], False), ([None, None], False), ([None, 0.2], True)],
)
def test_flex_start_is_suggested_only_below_the_threshold(scores, suggests):
    advice = [ZoneAdvice(f"us-east1-{z}", obtainability=s) for z, s in zip("bd", scores, strict=True)]
    line = flex_start_suggestion(advice, L4)
    assert bool(line) is suggests
    if suggests:
        assert "gcp_instance_provisioning_model: flex_start" in line and L4 in line


def test_forja_zones_suggests_flex_start_when_spot_is_scarce_in_every_zone(emulator, inventory) -> None:  # noqa: F811
    env, inv = inventory
    for zone in EAST:
        emulator.set_advice(PROJECT, zone, L4, obtainability=0.2, estimated_uptime="60s")
    table = _forja({**env, "COLUMNS": "200"}, inv, "zones")
    assert table.returncode == 0, table.stdout + table.stderr
    text = " ".join(table.stdout.split())
    assert "g2-standard-8 spot" in text and "consider a Flex-start VM" in text, table.stdout


def test_forja_check_warns_and_suggests_flex_start_for_a_scarce_spot_vm(emulator, key_file) -> None:
    for zone in ("us-east1-d", "us-east1-b"):
        emulator.set_advice(PROJECT, zone, L4, obtainability=0.1, estimated_uptime="60s")
    checks = Preflight(_client(emulator, key_file),
                       Plan(PROJECT, zone="us-east1-d", fallback_zones=["us-east1-b"], spot=True))
    checks.capacity()
    [finding] = checks.findings
    assert (finding.check, finding.status) == ("capacity", WARN)
    assert "0.10" in finding.detail and "flex_start" in finding.fix

    standard = Preflight(_client(emulator, key_file), Plan(PROJECT, spot=False))
    standard.capacity()
    assert standard.findings == []  # a standard VM is not told about Spot's scarcity
