# Copyright: forja contributors
# Apache-2.0
"""Zones ranked by Google's capacity advice (Compute `advice.capacity` and `advice.capacityHistory`).

Google's Capacity Advisor (Public Preview) scores, per region, how likely a VM is to be obtained in
each zone (`obtainability` 0.0-1.0), how long a Spot VM is expected to run (`estimatedUptime`
"60s"/"600s"/"3600s"), and gives the 30-day daily Spot preemption rate and list price.

`advise` asks it for the candidate zones of each region (one `advice.capacity` call per region,
and for Spot one `capacityHistory` per zone, in parallel); `rank` orders zones by obtainability,
then estimated uptime, then the 30-day mean preemption rate, the user's order breaking ties. A zone
without a signal keeps its place relative to the others without one and goes after the scored
zones: the advice reorders candidates, it never removes one. "The service is not available for
this project." (HTTP 400), 403, 5xx and an unreachable API are "no signal", never a failure.

Standard library plus forja_gcp's GcpClient: both the collection's modules and forja use it.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import asdict, dataclass, field
from typing import Any

from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    GcpClient,
    GcpError,
    region_of,
    short_name,
)

#: `estimatedUptime` as seconds (Google answers one of these three).
UPTIME_S = {"60s": 60, "600s": 600, "3600s": 3600}
ORDERS = ("advice", "given")
#: Below this best Spot obtainability in the VM's regions, `forja zones` and `forja check` suggest
#: Flex-start: a third-party guide to the advisor reads 0-0.4 as "try another zone, type or model"
#: (the research note peers-3.md, section 4.1). The gcp_gpu_zones module's `flex_start_below` option
#: and the preflight's setting of the same name default to it.
FLEX_START_BELOW = 0.4


@dataclass
class ZoneAdvice:
    """What the advisor said about one zone; None where it said nothing."""

    zone: str
    obtainability: float | None = None
    estimated_uptime_s: int | None = None
    #: The mean of the last 30 days' daily Spot preemption rates (0-1).
    preemption_rate_30d: float | None = None
    #: The newest daily list price in the history, USD an hour (Spot only).
    list_price_usd_hour: float | None = None
    #: Why there is no signal, when there is none ("not available for this project", "HTTP 403", ...).
    no_signal: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> bool:
        return self.obtainability is not None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("extra")
        return data


def provisioning_model(spot: bool | str) -> str:
    """The API's model: SPOT or STANDARD for a bool, the model itself (FLEX_START, ...) for a string."""
    if isinstance(spot, str):
        return spot.upper()
    return "SPOT" if spot else "STANDARD"


def flex_start_suggestion(
    advice: list[ZoneAdvice], machine_type: str, threshold: float = FLEX_START_BELOW
) -> str:
    """A line suggesting Flex-start when even the best Spot zone scores below `threshold`; "" when a
    zone scores at least that, or none has a score (no signal is no reason to change models)."""
    scores = [a.obtainability for a in advice if a.obtainability is not None]
    if not scores or max(scores) >= threshold:
        return ""
    best = max(scores)
    return (
        f"Spot obtainability for {machine_type} is at most {best:.2f} in these zones "
        f"(below {threshold:.2f}): "
        "consider a Flex-start VM, which waits in Google's queue for capacity, then runs up to 7 days "
        "without preemption (gcp_instance_provisioning_model: flex_start, gcp_instance_max_run_duration: 3d)"
    )


def _why(exc: GcpError) -> str:
    if exc.status == 400 and "not available" in exc.message.lower():
        return "the advisor is not available for this project"
    if exc.status:
        return f"HTTP {exc.status}: {exc.message.splitlines()[0][:160]}"
    return exc.message.splitlines()[0][:160]


def _uptime_s(text: Any) -> int | None:
    if not isinstance(text, str) or not text.endswith("s"):
        return None
    try:
        return int(float(text[:-1]))
    except ValueError:
        return None


def _money(price: Any) -> float | None:
    if not isinstance(price, dict):
        return None
    try:
        return int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9
    except (TypeError, ValueError):
        return None


def capacity(
    client: GcpClient, project: str, region: str, zones: list[str], machine_type: str, spot: bool | str,
    gpu_type: str = "", gpu_count: int = 0,
) -> dict[str, dict[str, Any]]:
    """advice.capacity for the zones of one region: {zone: scores}; GcpError when it has no answer."""
    selection: dict[str, Any] = {"machineTypes": [machine_type]}
    if gpu_type and gpu_count:
        selection["guestAccelerators"] = [{"acceleratorType": gpu_type, "acceleratorCount": gpu_count}]
    body = {
        "size": 1,
        "distributionPolicy": {
            "targetShape": "ANY_SINGLE_ZONE", "zones": [{"zone": f"zones/{z}"} for z in zones],
        },
        "instanceFlexibilityPolicy": {"instanceSelections": {"forja": selection}},
        "instanceProperties": {"scheduling": {"provisioningModel": provisioning_model(spot)}},
    }
    answer = client.request("POST", f"projects/{project}/regions/{region}/advice/capacity", body=body,
                            request_id=False) or {}
    found: dict[str, dict[str, Any]] = {}
    for recommendation in answer.get("recommendations") or []:
        scores = recommendation.get("scores") or {}
        for shard in recommendation.get("shards") or []:
            zone = short_name(shard.get("zone"))
            if zone in zones and zone not in found:
                found[zone] = scores
    return found


def history(client: GcpClient, project: str, zone: str, machine_type: str) -> dict[str, Any]:
    """advice.capacityHistory (Spot only) for one zone: the 30-day preemption rates and prices."""
    body = {
        "instanceProperties": {"machineType": machine_type, "scheduling": {"provisioningModel": "SPOT"}},
        "locationPolicy": {"location": f"zones/{zone}"},
        "types": ["PREEMPTION", "PRICE"],
    }
    return client.request(
        "POST", f"projects/{project}/regions/{region_of(zone)}/advice/capacityHistory", body=body,
        request_id=False,
    ) or {}


def advise(
    client: GcpClient, project: str, zones: list[str], machine_type: str, spot: bool | str,
    gpu_type: str = "", gpu_count: int = 0, workers: int = 8,
) -> list[ZoneAdvice]:
    """What the advisor says of each zone, in the order given; never raises for a missing signal."""
    zones = list(dict.fromkeys(zones))
    advice = {zone: ZoneAdvice(zone) for zone in zones}
    regions: dict[str, list[str]] = {}
    for zone in zones:
        regions.setdefault(region_of(zone), []).append(zone)

    def ask_region(region: str) -> None:
        try:
            found = capacity(client, project, region, regions[region], machine_type, spot,
                             gpu_type, gpu_count)
        except GcpError as exc:
            for zone in regions[region]:
                advice[zone].no_signal = _why(exc)
            return
        for zone in regions[region]:
            scores = found.get(zone)
            if scores is None:
                advice[zone].no_signal = "no recommendation for this zone"
                continue
            try:
                advice[zone].obtainability = float(scores["obtainability"])
            except (KeyError, TypeError, ValueError):
                advice[zone].no_signal = "no obtainability score"
            advice[zone].estimated_uptime_s = _uptime_s(scores.get("estimatedUptime"))

    def ask_history(zone: str) -> None:
        try:
            answer = history(client, project, zone, machine_type)
        except GcpError:
            return  # the history is a tie-breaker: without it the zone keeps its capacity scores
        rates = [r.get("preemptionRate") for r in answer.get("preemptionHistory") or []]
        rates = [float(r) for r in rates if isinstance(r, (int, float))][-30:]
        if rates:
            advice[zone].preemption_rate_30d = round(sum(rates) / len(rates), 4)
        prices = [_money(p.get("listPrice")) for p in answer.get("priceHistory") or []]
        prices = [p for p in prices if p is not None]
        if prices:
            advice[zone].list_price_usd_hour = round(prices[-1], 6)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(ask_region, list(regions)))
        if provisioning_model(spot) == "SPOT":
            list(pool.map(ask_history, [z for z in zones if advice[z].scored]))
    return [advice[zone] for zone in zones]


def sort_key(advice: ZoneAdvice) -> tuple[float, float, float, float]:
    """Scored zones first; then higher obtainability, longer uptime, lower 30-day preemption rate."""
    if not advice.scored:
        return (1.0, 0.0, 0.0, 0.0)
    return (
        0.0,
        -(advice.obtainability or 0.0),
        -(advice.estimated_uptime_s or 0),
        advice.preemption_rate_30d if advice.preemption_rate_30d is not None else 1.0,
    )


def rank(advice: list[ZoneAdvice]) -> list[ZoneAdvice]:
    """The zones in the order to try them (a stable sort: the user's order breaks ties)."""
    return sorted(advice, key=sort_key)


def order_zones(
    client: GcpClient, project: str, zones: list[str], machine_type: str, spot: bool | str,
    gpu_type: str = "", gpu_count: int = 0,
) -> tuple[list[str], list[ZoneAdvice]]:
    """The zones ranked by the advice, and what it said; the given order when it said nothing."""
    advice = advise(client, project, zones, machine_type, spot, gpu_type, gpu_count)
    if not any(a.scored for a in advice):
        return [a.zone for a in advice], advice
    return [a.zone for a in rank(advice)], advice
