"""Capacity advice: `advice.capacity`, `advice.capacityHistory` and `advice.calendarMode`.

Google's Capacity Advisor (Public Preview) answers, per region, how likely a request for VMs is to
be obtained in each zone (`obtainability` 0.0-1.0, higher is better), how long Spot VMs are
expected to run (`estimatedUptime` "60s", "600s" or "3600s"), and the 30-day daily Spot
preemption rate and list price (days cut at midnight Pacific time). The request and response
shapes are those of the pinned discovery document (`CapacityAdviceRequest`,
`CapacityHistoryRequest`, `CalendarModeAdviceRequest` and their responses), which the server
checks requests against.

The scores are the tests': `AdviceSettings.set` (the emulator's `set_advice`, or
`PUT /emulator/v1/advice`) sets them per (project, zone, machine type, provisioning model); a zone
nobody set answers `DEFAULT_SCORE`, so an untouched emulator ranks every zone alike. Some real
projects get HTTP 400 "The service is not available for this project."; `available=False` makes a
project answer that. 403 and 5xx come from the fault rules (`advice.capacity`, ...).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import threading
from typing import Any
from zoneinfo import ZoneInfo

from . import catalog
from .errors import ApiError
from .operations import Call

Json = dict[str, Any]
UPTIMES = ("60s", "600s", "3600s")
MODELS = ("SPOT", "STANDARD", "FLEX_START", "RESERVATION_BOUND")
HISTORY_DAYS = 30
NOT_AVAILABLE = "The service is not available for this project."
_PACIFIC = ZoneInfo("America/Los_Angeles")


@dataclasses.dataclass(frozen=True)
class Score:
    """What the advisor says for one (project, zone, machine type, provisioning model)."""

    obtainability: float = 0.8
    estimated_uptime: str = "3600s"
    #: The daily Spot preemption rates, oldest first (one value: every day alike).
    preemption_rates: tuple[float, ...] = (0.1,)
    #: The daily list prices in USD an hour, oldest first; () prices it from forja's table.
    prices: tuple[float, ...] = ()

    def day_rate(self, day: int) -> float:
        rates = self.preemption_rates
        return rates[day] if len(rates) == HISTORY_DAYS else rates[-1]


DEFAULT_SCORE = Score()


def _floats(value: Any, name: str, low: float | None = 0.0, high: float | None = None) -> tuple[float, ...]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values or (len(values) != 1 and len(values) != HISTORY_DAYS):
        raise ValueError(f"{name}: one number or {HISTORY_DAYS} (one a day, oldest first), not {len(values)}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name}: numbers, not {v!r}")
        if (low is not None and v < low) or (high is not None and v > high):
            raise ValueError(f"{name}: {v} is outside {low}..{high}")
        out.append(float(v))
    return tuple(out)


class AdviceSettings:
    """The scores the advice methods answer, and which projects may not use them (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scores: dict[tuple[str, str, str, str], Score] = {}
        self.unavailable: set[str] = set()

    def set(
        self,
        project: str,
        zone: str | None = None,
        machine_type: str | None = None,
        provisioning_model: str = "SPOT",
        *,
        obtainability: float | None = None,
        estimated_uptime: str | None = None,
        preemption_rate: float | list[float] | None = None,
        price: float | list[float] | None = None,
        available: bool | None = None,
    ) -> Json:
        """Set the scores of one zone's machine type (a keyword left None keeps its value), and/or
        whether the project may use the advisor (`available=False`: HTTP 400 "not available")."""
        if not isinstance(project, str) or not project:
            raise TypeError("project: a project id")
        if available is not None and not isinstance(available, bool):
            raise TypeError(f"available: true or false, not {available!r}")
        if zone is not None:
            if zone not in catalog.ZONES:
                raise ValueError(f"zone: {zone!r} is not a zone of the emulated cloud")
            if not machine_type or machine_type not in catalog.MACHINE_TYPES:
                raise ValueError(f"machine_type: {machine_type!r} is not a served machine type")
            if provisioning_model not in MODELS:
                raise ValueError(
                    f"provisioning_model: one of {', '.join(MODELS)}, not {provisioning_model!r}")
            changes: dict[str, Any] = {}
            if obtainability is not None:
                changes["obtainability"] = _floats(obtainability, "obtainability", 0.0, 1.0)[0]
            if estimated_uptime is not None:
                if estimated_uptime not in UPTIMES:
                    raise ValueError(
                        f"estimated_uptime: one of {', '.join(UPTIMES)}, not {estimated_uptime!r}")
                changes["estimated_uptime"] = estimated_uptime
            if preemption_rate is not None:
                changes["preemption_rates"] = _floats(preemption_rate, "preemption_rate", 0.0, 1.0)
            if price is not None:
                changes["prices"] = _floats(price, "price", 0.0)
        elif any(v is not None
                 for v in (machine_type, obtainability, estimated_uptime, preemption_rate, price)):
            raise ValueError("zone: scores are set per zone; name it")
        with self.lock:
            if available is not None:
                (self.unavailable.discard if available else self.unavailable.add)(project)
            if zone is not None:
                key = (project, zone, str(machine_type), provisioning_model)
                self.scores[key] = dataclasses.replace(self.scores.get(key, DEFAULT_SCORE), **changes)
        return self.snapshot(project)

    def clear(self) -> None:
        with self.lock:
            self.scores.clear()
            self.unavailable.clear()

    def score(self, project: str, zone: str, machine_type: str, model: str) -> Score:
        with self.lock:
            return self.scores.get((project, zone, machine_type, model), DEFAULT_SCORE)

    def require_available(self, project: str) -> None:
        with self.lock:
            if project in self.unavailable:
                raise ApiError(400, NOT_AVAILABLE, "badRequest")

    def snapshot(self, project: str) -> Json:
        with self.lock:
            return {
                "project": project,
                "available": project not in self.unavailable,
                "scores": [
                    {"zone": z, "machineType": m, "provisioningModel": p, "obtainability": s.obtainability,
                     "estimatedUptime": s.estimated_uptime, "preemptionRate": list(s.preemption_rates),
                     "price": list(s.prices)}
                    for (proj, z, m, p), s in sorted(self.scores.items()) if proj == project
                ],
            }


def _short(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _zones_of(region: str) -> list[str]:
    return sorted(z for z, r in catalog.ZONES.items() if r == region)


def _offered(zone: str, machine_type: str) -> bool:
    return any(m.name == machine_type for m in catalog.machine_types_in(zone))


def _model(body: Json, required_spot: bool = False) -> str:
    scheduling = (body.get("instanceProperties") or {}).get("scheduling") or {}
    model = scheduling.get("provisioningModel") or "STANDARD"
    if required_spot and model != "SPOT":
        raise ApiError(400, "Invalid value for field "
                       "'resource.instanceProperties.scheduling.provisioningModel': "
                       f"'{model}'. Capacity history supports only SPOT.", "invalid")
    return model


def _list_price(machine_type: str, region: str, spot: bool) -> float:
    """forja's price table's hourly rate (what an untouched emulator answers); 0 when unpriced."""
    from forja.cost.prices import PriceError, load_prices

    try:
        return float(load_prices(None).machine_rate(machine_type, region, spot=spot).usd_per_hour)
    except (PriceError, KeyError, ValueError):
        return 0.0


class AdviceMethods:
    """The advice methods of `ComputeApi` (its `advice`: the AdviceSettings the emulator holds)."""

    advice: AdviceSettings
    base: str

    def _zone_url(self, project: str, zone: str) -> str:
        return f"{self.base}projects/{project}/zones/{zone}"

    def advice_capacity(self, call: Call) -> Json:
        body = call.body or {}
        self.advice.require_available(call.project)
        region = call.params["region"]
        size = body.get("size")
        if not isinstance(size, int) or not 1 <= size <= 1000:
            raise ApiError(400, f"Invalid value for field 'resource.size': '{size}'. Must be 1 to 1000.",
                           "invalid")
        selections = (body.get("instanceFlexibilityPolicy") or {}).get("instanceSelections") or {}
        machine_types = list(dict.fromkeys(
            m for s in selections.values() for m in s.get("machineTypes") or ()))
        if not machine_types:
            raise ApiError(400, "Required field 'resource.instanceFlexibilityPolicy.instanceSelections' "
                           "(with machineTypes) not specified", "required")
        distribution = (body.get("distributionPolicy") or {}).get("zones") or ()
        asked = [_short(z.get("zone") or "") for z in distribution]
        for zone in asked:
            if catalog.ZONES.get(zone) != region:
                raise ApiError(400, f"Invalid value for field 'resource.distributionPolicy.zones': '{zone}'. "
                               f"The zone is not in region {region}.", "invalid")
        model = _model(body)
        recommendations = []
        for zone in asked or _zones_of(region):
            for machine_type in machine_types:
                if not _offered(zone, machine_type):
                    continue
                score = self.advice.score(call.project, zone, machine_type, model)
                scores: Json = {"obtainability": score.obtainability}
                if model == "SPOT":
                    scores["estimatedUptime"] = score.estimated_uptime
                recommendations.append({
                    "scores": scores,
                    "shards": [{"zone": self._zone_url(call.project, zone), "machineType": machine_type,
                                "instanceCount": size, "provisioningModel": model}],
                })
        recommendations.sort(key=lambda r: -r["scores"]["obtainability"])
        return {"recommendations": recommendations}

    def advice_capacity_history(self, call: Call) -> Json:
        body = call.body or {}
        self.advice.require_available(call.project)
        region = call.params["region"]
        _model(body, required_spot=True)
        machine_type = (body.get("instanceProperties") or {}).get("machineType") or ""
        machine_type = _short(machine_type)
        if machine_type not in catalog.MACHINE_TYPES:
            raise ApiError(400, f"Invalid value for field 'resource.instanceProperties.machineType': "
                           f"'{machine_type}'.", "invalid")
        location = _short((body.get("locationPolicy") or {}).get("location") or region)
        if location == region:
            zones, url = _zones_of(region), f"{self.base}projects/{call.project}/regions/{region}"
        elif catalog.ZONES.get(location) == region:
            zones, url = [location], self._zone_url(call.project, location)
        else:
            raise ApiError(400, f"Invalid value for field 'resource.locationPolicy.location': '{location}'. "
                           f"Not region {region} or one of its zones.", "invalid")
        zones = [z for z in zones if _offered(z, machine_type)]
        scores = [self.advice.score(call.project, z, machine_type, "SPOT") for z in zones]
        types = body.get("types") or ["PREEMPTION", "PRICE"]
        answer: Json = {"location": url, "machineType": machine_type}
        if not scores:
            return answer
        today = dt.datetime.now(_PACIFIC).replace(hour=0, minute=0, second=0, microsecond=0)
        days = [today - dt.timedelta(days=HISTORY_DAYS - i) for i in range(HISTORY_DAYS)]

        def interval(start: dt.datetime) -> Json:
            end = start + dt.timedelta(days=1)
            return {"startTime": start.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "endTime": end.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}

        if "PREEMPTION" in types:
            answer["preemptionHistory"] = [
                {"interval": interval(day),
                 "preemptionRate": sum(s.day_rate(i) for s in scores) / len(scores)}
                for i, day in enumerate(days)
            ]
        if "PRICE" in types:
            fallback = _list_price(machine_type, region, spot=True)
            history = []
            for i, day in enumerate(days):
                priced = [
                    (s.prices[i] if len(s.prices) == HISTORY_DAYS else s.prices[-1]) if s.prices else fallback
                    for s in scores
                ]
                usd = sum(priced) / len(priced)
                units = int(usd)
                history.append({"interval": interval(day), "listPrice": {
                    "currencyCode": "USD", "units": str(units), "nanos": round((usd - units) * 1e9)}})
            answer["priceHistory"] = history
        return answer

    def advice_calendar_mode(self, call: Call) -> Json:
        body = call.body or {}
        self.advice.require_available(call.project)
        region = call.params["region"]
        specs = body.get("futureResourcesSpecs") or {}
        if not specs:
            raise ApiError(400, "Required field 'resource.futureResourcesSpecs' not specified", "required")
        per_spec: Json = {}
        for name, spec in specs.items():
            sku = (spec.get("targetResources") or {}).get("specificSkuResources") or {}
            machine_type = _short(sku.get("machineType") or "")
            locations = (spec.get("locationPolicy") or {}).get("locations") or {}
            allowed = [
                _short(loc) for loc, pref in locations.items()
                if (pref or {}).get("preference", "ALLOW") != "DENY"
            ] or _zones_of(region)
            zones = [z for z in allowed if catalog.ZONES.get(z) == region and _offered(z, machine_type)]
            if not zones:
                per_spec[name] = {"recommendationType": "RECOMMENDATION_TYPE_UNSPECIFIED"}
                continue
            best = max(zones, key=lambda z, mt=machine_type: self.advice.score(
                call.project, z, mt, "STANDARD").obtainability)
            window = spec.get("timeRangeSpec") or {}
            start = window.get("startTimeNotEarlierThan") or (
                dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).strftime("%Y-%m-%dT00:00:00Z")
            end = window.get("endTimeNotLaterThan") or start
            digest = hashlib.sha256(f"{call.project}/{name}/{best}/{start}".encode()).hexdigest()[:16]
            per_spec[name] = {
                "recommendationId": digest, "recommendationType": "FUTURE_RESERVATION",
                "location": f"zones/{best}", "startTime": start, "endTime": end,
            }
        return {"recommendations": [{"recommendationsPerSpec": per_spec}]}
