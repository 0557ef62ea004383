"""Zones ranked by Google's capacity advice (issue 28, part 1), against the emulator over real HTTP.

- the emulator's `advice.capacity`, `capacityHistory` and `calendarMode`, driven by Google's own
  `compute_v1.AdviceClient`, with the scores its knobs set (Python and the HTTP control path);
- the ranking (plugins/module_utils/forja_gcp_advice.py): obtainability, then uptime, then the 30-day
  preemption rate; 400 "not available", 403 and 5xx are no signal, never a failure;
- gcp_gpu_instance's stock-out fallback in the advice's order (zone_order), and in the given one;
- `forja zones`: the table and --json, for three regions (its time is printed, never asserted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import google.api_core.exceptions
import pytest
import requests
from ansible_collections.forja.gpu.plugins.module_utils import forja_gcp_advice as advice
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import GcpClient, GcpConfig
from gcp_helpers import emulator_env, run_module_tasks
from google.cloud import compute_v1
from google.oauth2 import service_account

PROJECT = "forja-sandbox"
# Google's type names, shortened
Selection = compute_v1.CapacityAdviceRequestInstanceFlexibilityPolicyInstanceSelection
Flexibility = compute_v1.CapacityAdviceRequestInstanceFlexibilityPolicy
AdviceScheduling = compute_v1.CapacityAdviceRequestInstancePropertiesScheduling
HistoryScheduling = compute_v1.CapacityHistoryRequestInstancePropertiesScheduling
HistoryProperties = compute_v1.CapacityHistoryRequestInstanceProperties
L4 = "g2-standard-8"
FORJA = str(Path(sys.executable).parent / "forja")
pytestmark = pytest.mark.usefixtures("only_googles_background_lookup_left_the_machine")


def _client(emulator, key_file: Path) -> GcpClient:
    return GcpClient(GcpConfig(project=PROJECT, api_url=emulator.base_url, credentials_file=str(key_file),
                               max_retries=0))


@pytest.fixture
def adviser(emulator, key_file: Path) -> compute_v1.AdviceClient:
    credentials = service_account.Credentials.from_service_account_file(str(key_file))
    return compute_v1.AdviceClient(credentials=credentials, transport="rest",
                                   client_options={"api_endpoint": emulator.url})


# -- the emulator, driven by Google's own client ------------------------------------------------------
def test_googles_advice_client_reads_the_scores_the_emulator_was_given(emulator, adviser) -> None:
    emulator.set_advice(PROJECT, "us-central1-a", L4, obtainability=0.2, estimated_uptime="60s")
    emulator.set_advice(PROJECT, "us-central1-b", L4, obtainability=0.9, estimated_uptime="3600s")
    request = compute_v1.CapacityAdviceRequest(
        size=1,
        distribution_policy=compute_v1.CapacityAdviceRequestDistributionPolicy(
            target_shape="ANY_SINGLE_ZONE",
            zones=[compute_v1.CapacityAdviceRequestDistributionPolicyZoneConfiguration(zone=f"zones/{z}")
                   for z in ("us-central1-a", "us-central1-b", "us-central1-f")]),
        instance_flexibility_policy=Flexibility(
            instance_selections={"l4": Selection(
                machine_types=[L4])}),
        instance_properties=compute_v1.CapacityAdviceRequestInstanceProperties(
            scheduling=AdviceScheduling(provisioning_model="SPOT")),
    )
    answer = adviser.capacity(project=PROJECT, region="us-central1", capacity_advice_request_resource=request)
    got = {r.shards[0].zone.rsplit("/", 1)[-1]: (r.scores.obtainability, r.scores.estimated_uptime)
           for r in answer.recommendations}
    # us-central1-f has no L4: no recommendation there; the best zone comes first.
    assert got == {"us-central1-b": (0.9, "3600s"), "us-central1-a": (0.2, "60s")}
    assert answer.recommendations[0].shards[0].provisioning_model == "SPOT"

    emulator.set_advice(PROJECT, "us-central1-a", L4, preemption_rate=[0.5] * 15 + [0.1] * 15, price=0.25)
    history = adviser.capacity_history(
        project=PROJECT, region="us-central1", capacity_history_request_resource=(
        compute_v1.CapacityHistoryRequest(
            instance_properties=HistoryProperties(
                machine_type=L4,
                scheduling=HistoryScheduling(provisioning_model="SPOT")),
            location_policy=compute_v1.CapacityHistoryRequestLocationPolicy(location="zones/us-central1-a"),
            types=["PREEMPTION", "PRICE"])))
    assert len(history.preemption_history) == 30 and len(history.price_history) == 30
    rates = [day.preemption_rate for day in history.preemption_history]
    assert rates[0] == 0.5 and rates[-1] == 0.1
    assert history.price_history[-1].list_price.currency_code == "USD"
    assert history.price_history[-1].list_price.nanos == 250_000_000
    assert history.location.endswith("/zones/us-central1-a")

    emulator.set_advice(PROJECT, "us-central1-c", L4, "STANDARD", obtainability=0.95)
    calendar = adviser.calendar_mode(
        project=PROJECT, region="us-central1", calendar_mode_advice_request_resource=(
        compute_v1.CalendarModeAdviceRequest(future_resources_specs={"a": compute_v1.FutureResourcesSpec(
            target_resources=compute_v1.FutureResourcesSpecTargetResources(
                specific_sku_resources=compute_v1.FutureResourcesSpecSpecificSKUResources(
                    machine_type=L4, instance_count=1)))})))
    (recommendation,) = calendar.recommendations
    # a reservation goes where the on-demand obtainability is best
    assert recommendation.recommendations_per_spec["a"].location == "zones/us-central1-c"


def test_a_project_without_the_advisor_gets_googles_400_and_history_wants_spot(emulator, adviser) -> None:
    emulator.set_advice(PROJECT, available=False)
    request = compute_v1.CapacityAdviceRequest(size=1, instance_flexibility_policy=(
        Flexibility(instance_selections={
            "l4": Selection(machine_types=[L4])})))
    with pytest.raises(google.api_core.exceptions.BadRequest, match="not available for this project"):
        adviser.capacity(project=PROJECT, region="us-east1", capacity_advice_request_resource=request)
    emulator.set_advice(PROJECT, available=True)
    assert adviser.capacity(project=PROJECT, region="us-east1", capacity_advice_request_resource=request)
    standard = compute_v1.CapacityHistoryRequest(instance_properties=HistoryProperties(
        machine_type=L4,
        scheduling=HistoryScheduling(provisioning_model="STANDARD")))
    with pytest.raises(google.api_core.exceptions.BadRequest, match="only SPOT"):
        adviser.capacity_history(project=PROJECT, region="us-east1",
                                 capacity_history_request_resource=standard)


def test_the_http_control_path_sets_scores_and_refuses_bad_ones(emulator) -> None:
    url = f"{emulator.url}/emulator/v1/advice"
    ok = requests.put(url, json={"project": PROJECT, "zone": "us-east1-b", "machine_type": L4,
                                 "obtainability": 0.3, "estimated_uptime": "600s"}, timeout=10)
    assert ok.status_code == 200, ok.text
    assert ok.json()["scores"] == [{"zone": "us-east1-b", "machineType": L4, "provisioningModel": "SPOT",
                                    "obtainability": 0.3, "estimatedUptime": "600s", "preemptionRate": [0.1],
                                    "price": []}]
    for bad in ({"project": PROJECT, "zone": "us-east1-b", "machine_type": L4, "obtainability": 1.5},
                {"project": PROJECT, "zone": "us-east1-b", "machine_type": L4, "estimated_uptime": "5m"},
                {"project": PROJECT, "zone": "mars-1a", "machine_type": L4},
                {"project": PROJECT, "colour": "blue"}):
        refused = requests.put(url, json=bad, timeout=10)
        assert refused.status_code == 400, (bad, refused.text)
    off = requests.put(url, json={"project": PROJECT, "available": False}, timeout=10)
    assert off.json()["available"] is False
    assert requests.delete(url, timeout=10).status_code == 200
    assert emulator.advice.snapshot(PROJECT) == {"project": PROJECT, "available": True, "scores": []}


# -- the ranking ----------------------------------------------------------------------------------------
def test_zones_are_ranked_by_obtainability_then_uptime_then_preemption(emulator, key_file: Path) -> None:
    scores = (("us-east1-b", 0.5, "3600s", 0.3), ("us-central1-a", 0.9, "600s", 0.1),
              ("us-central1-b", 0.9, "3600s", 0.2), ("us-central1-c", 0.9, "3600s", 0.05))
    for zone, obtainability, uptime, rate in scores:
        emulator.set_advice(PROJECT, zone, L4, obtainability=obtainability, estimated_uptime=uptime,
                            preemption_rate=rate)
    zones = ["us-east1-b", "us-central1-a", "us-central1-b", "us-central1-c", "us-east1-d"]
    order, said = advice.order_zones(_client(emulator, key_file), PROJECT, zones, L4, spot=True)
    # us-east1-d was not set: the default score (0.8), between the 0.9s and the 0.5.
    assert order == ["us-central1-c", "us-central1-b", "us-central1-a", "us-east1-d", "us-east1-b"]
    by_zone = {a.zone: a for a in said}
    assert by_zone["us-central1-c"].preemption_rate_30d == 0.05
    assert by_zone["us-central1-a"].estimated_uptime_s == 600
    assert by_zone["us-central1-c"].list_price_usd_hour  # priced from forja's table by default
    # one capacity call per region, one history call per zone
    assert emulator.stats["by_method"]["compute.advice.capacity"] == 2
    assert emulator.stats["by_method"]["compute.advice.capacityHistory"] == 5


@pytest.mark.parametrize("how", ["not-available", "403", "503"])
def test_no_signal_keeps_the_given_order_and_never_fails(emulator, key_file: Path, how: str) -> None:
    emulator.set_advice(PROJECT, "us-central1-a", L4, obtainability=0.95)
    if how == "not-available":
        emulator.set_advice(PROJECT, available=False)
    else:
        emulator.faults.add(method="advice.capacity", status=int(how), times=None)
    zones = ["us-east1-b", "us-central1-a"]
    order, said = advice.order_zones(_client(emulator, key_file), PROJECT, zones, L4, spot=True)
    assert order == zones
    assert all(not a.scored and a.no_signal for a in said)
    if how == "not-available":
        assert said[0].no_signal == "the advisor is not available for this project"
    else:
        assert f"HTTP {how}" in said[0].no_signal


def test_an_unreachable_api_is_no_signal(tmp_path: Path, emulator, key_file: Path) -> None:
    client = GcpClient(GcpConfig(project=PROJECT, api_url="http://127.0.0.1:9/compute/v1/",
                                 credentials_file=str(key_file), max_retries=0))
    order, said = advice.order_zones(client, PROJECT, ["us-east1-b", "us-east1-d"], L4, spot=False)
    assert order == ["us-east1-b", "us-east1-d"] and all(a.no_signal for a in said)


# -- gcp_gpu_instance's stock-out fallback ---------------------------------------------------------------
def _stockout_drill(emulator) -> None:
    """The drill's scores: a stock-out in the first zone, a low score in the second, a high one in
    the third."""
    emulator.faults.add(method="instances.insert", error="ZONE_RESOURCE_POOL_EXHAUSTED", zone="us-east1-d")
    emulator.set_advice(PROJECT, "us-east1-b", L4, obtainability=0.1, estimated_uptime="60s")
    emulator.set_advice(PROJECT, "us-central1-a", L4, obtainability=0.9, estimated_uptime="3600s")


@pytest.mark.parametrize("zone_order", ["advice", "given"])
def test_the_stock_out_fallback_tries_zones_in_the_advices_order(
    tmp_path: Path, emulator, key_file: Path, zone_order: str
) -> None:
    _stockout_drill(emulator)
    vm = {"name": "ranked", "zone": "us-east1-d", "fallback_zones": ["us-east1-b", "us-central1-a"],
          "machine_type": L4, "spot": True, "image_family": "pytorch-2-7-cu128-ubuntu-2204-nvidia-570",
          "image_project": "deeplearning-platform-release", "boot_disk_size_gb": 50, "zone_order": zone_order}
    result = run_module_tasks(tmp_path, emulator_env(emulator, key_file),
                              [{"forja.gpu.gcp_gpu_instance": vm, "register": "made"}])["made"]
    tried = [(t["zone"], t["error"]) for t in result["zones_tried"]]
    if zone_order == "advice":
        assert tried == [("us-east1-d", "ZONE_RESOURCE_POOL_EXHAUSTED"), ("us-central1-a", None)]
        assert {a["zone"]: a["obtainability"] for a in result["zone_advice"]} == {
            "us-east1-b": 0.1, "us-central1-a": 0.9}
    else:
        assert tried == [("us-east1-d", "ZONE_RESOURCE_POOL_EXHAUSTED"), ("us-east1-b", None)]
        assert "zone_advice" not in result and "compute.advice.capacity" not in emulator.stats["by_method"]


# -- forja zones ----------------------------------------------------------------------------------------
@pytest.fixture
def inventory(tmp_path: Path, emulator, key_file: Path):
    inventory = tmp_path / "inventory"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    (inventory / "hosts.yml").write_text("all:\n  hosts: {}\n")
    (inventory / "group_vars" / "all" / "vm.yml").write_text(
        "gcp_instance_zone: us-east1-d\ngcp_instance_fallback_zones: [us-east1-b]\ngcp_instance_spot: true\n")
    env = {**emulator_env(emulator, key_file), "FORJA_HOME": str(tmp_path / "home"),
           "PATH": os.environ["PATH"]}
    return env, inventory


def _forja(env: dict, inventory: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([FORJA, "-i", str(inventory), *argv], env=env, cwd=inventory.parent,
                          capture_output=True, text=True, timeout=300, check=False)


def test_forja_zones_ranks_three_regions_as_a_table_and_as_json(emulator, inventory) -> None:
    env, inv = inventory
    _stockout_drill(emulator)
    emulator.set_advice(PROJECT, "europe-west4-a", L4, obtainability=0.7, estimated_uptime="600s")
    started = time.monotonic()
    proc = _forja(env, inv, "--json", "zones", "--region", "us-central1", "--region", "europe-west4")
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    order = [z["zone"] for z in report["zones"]]
    assert report["signal"] == "advice" and report["provisioning_model"] == "SPOT"
    assert order[0] == "us-central1-a" and order.index("europe-west4-a") < order.index("us-east1-b")
    assert {"us-east1-c", "us-central1-f", "europe-west4-c"} <= set(order)  # every zone of the 3 regions
    by_zone = {z["zone"]: z for z in report["zones"]}
    assert by_zone["us-central1-f"]["offered"] is False and order[-1] in ("us-east1-c", "us-central1-f")
    assert by_zone["us-central1-f"]["no_signal"] == f"{L4} is not offered here"
    assert by_zone["us-east1-d"]["given"] == 0 and by_zone["us-east1-d"]["usd_per_hour"] > 0
    assert by_zone["us-east1-b"]["preemption_rate_30d"] == 0.1
    print(f"forja zones for 3 regions ({len(order)} zones) against the emulator: {took:.2f} s "
          f"(the module itself: {report['elapsed_s']:.2f} s)")

    table = _forja({**env, "COLUMNS": "200"}, inv, "zones", "--region", "us-central1")
    assert table.returncode == 0, table.stdout + table.stderr
    text = " ".join(table.stdout.split())
    assert "ranked by Google's capacity advice" in text and "us-east1-d (your zone)" in text
    assert text.index("us-central1-a") < text.index("us-east1-b")


def test_forja_zones_without_the_advisor_keeps_your_order_and_says_why(emulator, inventory) -> None:
    env, inv = inventory
    emulator.set_advice(PROJECT, available=False)
    proc = _forja(env, inv, "--json", "zones")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["signal"].startswith("no signal") and "not available" in report["signal"]
    assert [z["zone"] for z in report["zones"]][:2] == ["us-east1-d", "us-east1-b"]
