#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""Rank the zones a GPU VM could be made in by Google's capacity advice, creating nothing."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gcp_gpu_zones
short_description: Rank candidate zones for a GPU VM by Google's capacity advice
description:
  - Asks Google's Capacity Advisor, read-only, about each candidate zone for the VM that
    M(forja.gpu.gcp_gpu_instance) would make (its machine type, GPU and provisioning model), and
    returns the zones in the order to try them.
  - "The candidates: O(zone), O(fallback_zones), then every other zone of their regions and of
    O(regions) (regions.get)."
  - "Per zone: obtainability (0 to 1, C(advice.capacity)), estimated uptime of a Spot VM (60, 600 or
    3600 seconds), the mean of the last 30 days' daily Spot preemption rates
    (C(advice.capacityHistory), Spot only), the hourly price (forja's price table; for Spot also
    Google's newest list price), and whether the machine type is offered there (machineTypes.get)."
  - "The order: zones that offer the machine type and have scores first, by obtainability, then
    estimated uptime, then 30-day preemption rate; then zones without a score, then zones that do not
    offer it, each in the given order."
  - An advisor that has no answer (HTTP 400 "The service is not available for this project.", 403,
    5xx, unreachable) is no signal, reported in RV(signal) and each zone's C(no_signal); never a
    failure. The module fails only on bad options or credentials.
  - Runs on the controller (C(delegate_to=localhost)); needs C(google-auth) and C(requests) there.
version_added: "0.4.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - forja.gpu.gcp_auth
  - forja.gpu.gcp_auth.modules
options:
  zone:
    description: The zone the VM is made in (the first candidate).
    type: str
    required: true
  fallback_zones:
    description: Zones tried on a stock-out (candidates after O(zone)).
    type: list
    elements: str
    default: []
  regions:
    description: More regions whose zones are candidates too.
    type: list
    elements: str
    default: []
  machine_type:
    description: The machine type.
    type: str
    default: g2-standard-8
  gpu_type:
    description: A GPU to attach (N1 machine types); empty for machine types whose GPUs come with them.
    type: str
    default: ""
  gpu_count:
    description: How many of O(gpu_type); 0 for machine types whose GPUs come with them.
    type: int
    default: 0
  spot:
    description: Rank for a Spot VM (provisioning model SPOT, with the preemption history); else STANDARD.
    type: bool
    default: false
  provisioning_model:
    description:
      - The provisioning model to rank for; replaces O(spot) when set (C(flex_start) asks the advisor
        about FLEX_START, for which it gives no preemption history).
    type: str
    choices: [standard, spot, flex_start]
  flex_start_below:
    description:
      - For a Spot VM, when even the best candidate zone's obtainability is below this, RV(suggestion)
        suggests a Flex-start VM instead (0 to 1; 0 never suggests).
    type: float
    default: 0.4
notes:
  - Google's Capacity Advisor is in Public Preview and needs the C(compute.advice.capacity) permission
    (in C(roles/compute.viewer)). It ignores quota, and covers no N1 VM with attached GPUs.
"""

EXAMPLES = r"""
- name: Rank the zones for a Spot L4 VM in two regions
  forja.gpu.gcp_gpu_zones:
    zone: us-east1-d
    fallback_zones: [us-east1-b]
    regions: [us-central1]
    machine_type: g2-standard-8
    spot: true
  delegate_to: localhost
  register: ranked

- name: Show the best zone
  ansible.builtin.debug:
    msg: "{{ ranked.zones[0].zone }}"

- name: Say when Spot is so scarce that a Flex-start VM is the better bet
  ansible.builtin.debug:
    msg: "{{ ranked.suggestion }}"
  when: ranked.suggestion | length > 0
"""

RETURN = r"""
zones:
  description: The candidate zones in the order to try them.
  returned: always
  type: list
  elements: dict
  contains:
    zone: {description: The zone., type: str}
    region: {description: Its region., type: str}
    offered:
      description: Whether the machine type is offered there (null when it could not be asked).
      type: bool
    obtainability:
      description: Likelihood of obtaining the VM, 0 to 1 (null without a signal).
      type: float
    estimated_uptime_s:
      description: Estimated run time of a Spot VM in seconds (null without one).
      type: int
    preemption_rate_30d:
      description: Mean daily Spot preemption rate of the last 30 days, 0 to 1.
      type: float
    usd_per_hour: {description: The VM's hourly price from forja's table (null when unpriced)., type: float}
    list_price_usd_hour:
      description: Google's newest daily Spot list price of the machine type.
      type: float
    no_signal: {description: Why the advisor said nothing of this zone; empty when it did., type: str}
    given: {description: The zone's place in the given order (0 is O(zone))., type: int}
  sample:
    - {zone: us-central1-a, region: us-central1, offered: true, obtainability: 0.9, estimated_uptime_s: 3600,
       preemption_rate_30d: 0.05, usd_per_hour: 0.35, list_price_usd_hour: 0.35, no_signal: "", given: 2}
signal:
  description:
    - C(advice) when the advisor scored at least one zone; otherwise why not (the order is then the
      given one).
  returned: always
  type: str
  sample: advice
provisioning_model:
  description: SPOT, STANDARD or FLEX_START.
  returned: always
  type: str
suggestion:
  description:
    - For a Spot VM whose best zone scores below O(flex_start_below), a line suggesting a Flex-start VM
      (how to ask for one included); empty otherwise, and when the advisor gave no score.
  returned: always
  type: str
machine_type:
  description: The machine type ranked for.
  returned: always
  type: str
project:
  description: The project asked.
  returned: always
  type: str
elapsed_s:
  description: Seconds the ranking took.
  returned: always
  type: float
"""

import concurrent.futures
import time
from typing import Any

from ansible_collections.forja.gpu.plugins.module_utils.forja_call import Call, ModuleFailure, run_as_module
from ansible_collections.forja.gpu.plugins.module_utils.forja_cost import (
    PricedVm,
    PriceError,
    load_prices,
    machine_rate,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    AUTH_ARGUMENT_SPEC,
    ENV_PROJECT,
    GcpClient,
    GcpError,
    config_from_params,
    region_of,
    short_name,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_advice import (
    FLEX_START_BELOW,
    advise,
    flex_start_suggestion,
    provisioning_model,
    sort_key,
)

SPEC: dict[str, Any] = {
    "argument_spec": {
        "zone": {"type": "str", "required": True},
        "fallback_zones": {"type": "list", "elements": "str", "default": []},
        "regions": {"type": "list", "elements": "str", "default": []},
        "machine_type": {"type": "str", "default": "g2-standard-8"},
        "gpu_type": {"type": "str", "default": ""},
        "gpu_count": {"type": "int", "default": 0},
        "spot": {"type": "bool", "default": False},
        "provisioning_model": {"type": "str", "choices": ["standard", "spot", "flex_start"]},
        "flex_start_below": {"type": "float", "default": FLEX_START_BELOW},
        **AUTH_ARGUMENT_SPEC,
    },
    "mutually_exclusive": [("credentials_file", "credentials_json")],
}


def candidates(client: GcpClient, project: str, given: list[str], regions: list[str], pool: Any) -> list[str]:
    """The given zones, then the other zones of their regions and of `regions` (name order)."""
    wanted = list(dict.fromkeys([*map(region_of, given), *regions]))

    def zones_of(region: str) -> list[str]:
        try:
            found = client.get(f"projects/{project}/regions/{region}", allow_404=True)
        except GcpError:
            return []
        if found is None:
            raise ModuleFailure(f"regions: '{region}' is not a region of project '{project}'")
        return sorted(short_name(z) for z in found.get("zones") or [])

    zones = list(dict.fromkeys(given))
    for found in pool.map(zones_of, wanted):
        zones.extend(z for z in found if z not in zones)
    return zones


def run(call: Call) -> dict[str, Any]:
    params = call.params
    started = time.monotonic()
    config = config_from_params(params, "forja-gcp-gpu-zones/0.4")
    project = config.resolved_project()
    if not project:
        raise ModuleFailure(
            f"project: not set; set gcp_instance_project (or {ENV_PROJECT}) to the GCP project ID")
    machine_type = params["machine_type"]
    model = provisioning_model(params["provisioning_model"] or bool(params["spot"]))
    spot = model == "SPOT"
    if not 0.0 <= params["flex_start_below"] <= 1.0:
        raise ModuleFailure(
            f"flex_start_below: {params['flex_start_below']} must be from 0 to 1 (an obtainability)")
    gpu_type, gpu_count = params["gpu_type"] or "", params["gpu_count"] or 0
    try:
        client = GcpClient(config)
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            zones = candidates(client, project, [params["zone"], *params["fallback_zones"]],
                               params["regions"], pool)

            def offered(zone: str) -> bool | None:
                try:
                    path = f"projects/{project}/zones/{zone}/machineTypes/{machine_type}"
                    return client.get(path, allow_404=True) is not None
                except GcpError:
                    return None

            offers = dict(zip(zones, pool.map(offered, zones), strict=True))
        advice = advise(client, project, zones, machine_type, model, gpu_type, gpu_count)
    except GcpError as exc:  # bad credentials, an unreachable API: the task's own failure
        raise ModuleFailure(exc.message, http_status=exc.status, reason=exc.reason) from None
    try:
        prices: Any = load_prices()
    except (PriceError, OSError, ValueError):
        prices = None
    gpus = {gpu_type: gpu_count} if gpu_type and gpu_count else {}
    rows = []
    for index, zone_advice in enumerate(advice):
        usd = None
        if prices is not None:
            try:
                vm = PricedVm(machine_type, zone_advice.zone, machine_type, spot, gpus, model)
                usd = round(machine_rate(vm, prices).usd_per_hour, 6)
            except (PriceError, KeyError, ValueError):
                usd = None
        row = {**zone_advice.as_dict(), "region": region_of(zone_advice.zone),
               "offered": offers[zone_advice.zone], "usd_per_hour": usd, "given": index}
        if row["offered"] is False:
            row["no_signal"] = f"{machine_type} is not offered here"
        rows.append((zone_advice, row))
    rows.sort(key=lambda pair: (pair[1]["offered"] is False, sort_key(pair[0])))
    ranked = [advised for advised, _row in rows]
    scored = [a for a in ranked if a.scored]
    reasons = sorted({a.no_signal for a in ranked if a.no_signal})
    signal = "advice" if scored else ("no signal: " + "; ".join(reasons) if reasons else "no signal")
    return {
        "changed": False, "project": project, "machine_type": machine_type,
        "provisioning_model": model, "signal": signal,
        "suggestion": flex_start_suggestion(
            [a for a, row in rows if row["offered"] is not False], machine_type, params["flex_start_below"]
        ) if spot else "",
        "zones": [row for _advised, row in rows], "elapsed_s": round(time.monotonic() - started, 3),
    }


def main() -> None:
    run_as_module(SPEC, run)


if __name__ == "__main__":
    main()
