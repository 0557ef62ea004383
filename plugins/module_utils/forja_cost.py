# Copyright: forja contributors
# Apache-2.0
"""forja's price table and the rules that turn a VM's record into its hourly rate.

This file is the one home of those rules; ``forja_gcp_prices.json`` beside it is the one home of the
figures. Both sides read them here, so a playbook and ``forja cost`` never disagree about a rate:

- the ``forja.gpu.forja_hourly_rate`` filter imports this file the Ansible way
  (``ansible_collections.forja.gpu.plugins.module_utils.forja_cost``), so an installed collection
  prices a host with no forja package beside it;
- forja's Python loads this same file by path (``forja/module_utils.py``) and ``forja.cost.prices``
  and ``forja.cost.spend`` re-export its names; forja adds what only its reports need (spend over
  running intervals, disks so far, budgets).

What lives here: the table (ours, with the user's override merged over it, checked at load time),
its lookups that name the entry to add on a miss, and how a VM's record (inventory hostvars in
snake_case or the Compute API's JSON in camelCase) reads as machine type, zone, Spot and attached
GPUs. Which types come with their GPUs (G2/A2/A3, priced as one figure) is the machine catalog's
fact (``forja_gcp_machines.py``), so only GPUs attached to other types (N1 + T4) are added per GPU.

Standard library only, with no Ansible and no forja import, for forja loads it as a plain module.
One exception, taken only when a user gives an override file: that file is YAML (``forja cost
--prices FILE``, ``FORJA_PRICES``, the filter's ``prices`` option; it was always documented so), the
standard library reads no YAML, and so PyYAML is imported then; it is there wherever this runs,
since ansible-core (the controller) and forja both depend on it. Our own table is JSON (JSON is YAML
too, so an override may be JSON as well), read with the standard library; its comments are its
``_about`` lines. Controller side only: no module imports this file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

try:  # Ansible: a sibling in the collection
    from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_machines import (
        FLEX_START_DISCOUNT_SERIES,
        MACHINE_TYPES,
    )
except ImportError:  # forja's Python loads this file by path (forja/module_utils.py), and the sibling first
    from forja_gcp_machines import FLEX_START_DISCOUNT_SERIES, MACHINE_TYPES  # type: ignore[no-redef]

#: forja's price table: dated, every figure with its basis, keyed by the catalog's price keys.
DEFAULT_TABLE = Path(__file__).with_name("forja_gcp_prices.json")
ENV_OVERRIDE = "FORJA_PRICES"
OVERRIDE_HINT = "add it to a prices override file (forja cost --prices FILE, or FORJA_PRICES=FILE)"
DEFAULT_DISK_TYPE = "pd-balanced"


class PriceError(ValueError):
    """A price is missing or malformed; the message names the entry and how to supply it."""


@dataclasses.dataclass(frozen=True)
class Rate:
    """An hourly rate and where it came from, so a report can say which figures are estimates."""

    usd_per_hour: float
    basis: str
    what: str


@dataclasses.dataclass(frozen=True)
class DiskPrice:
    """Disks are priced per GB-month, billed by the second whether the VM runs or not."""

    usd_per_gb_month: float
    basis: str
    what: str


def region_of(zone: str) -> str:
    """Regions are zones minus their last dash part ("us-east1-d" -> "us-east1")."""
    name = zone.rsplit("/", 1)[-1]
    parts = name.split("-")
    if len(parts) == 3:
        return "-".join(parts[:2])
    if len(parts) == 2:  # already a region
        return name
    raise PriceError(f"zone {zone!r} is not a GCP zone like 'us-east1-d'")


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _check_numbers(table: Mapping[str, Any], origin: str) -> None:
    """Reject a non-numeric or negative price at load time, naming its path in the file."""
    for section in ("machine_types", "accelerators", "disks"):
        entries = table.get(section) or {}
        if not isinstance(entries, Mapping):
            raise PriceError(f"{origin}: '{section}' must be a mapping of names to regions")
        for name, regions in entries.items():
            if not isinstance(regions, Mapping):
                raise PriceError(f"{origin}: '{section}.{name}' must be a mapping of regions")
            for region, prices in regions.items():
                if region == "gpu":
                    raise PriceError(
                        f"{origin}: '{section}.{name}.gpu': the price table holds prices only; which GPUs a "
                        "machine type carries is forja's machine catalog "
                        "(plugins/module_utils/forja_gcp_machines.py). Remove the gpu entry"
                    )
                if not isinstance(prices, Mapping):
                    continue
                for field in ("on_demand", "spot", "flex_start", "per_gb_month"):
                    if field not in prices:
                        continue
                    value = prices[field]
                    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                        raise PriceError(
                            f"{origin}: '{section}.{name}.{region}.{field}' is {value!r}; "
                            "it must be a number of USD >= 0"
                        )


def _as_table(data: Any, path: Path) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PriceError(f"prices file {path} must hold a mapping (machine_types/accelerators/disks)")
    return data


def _read_ours(path: Path) -> dict[str, Any]:
    """forja's own table: JSON, read with the standard library."""
    try:
        return _as_table(json.loads(path.read_text(encoding="utf-8")), path)
    except FileNotFoundError as exc:
        raise PriceError(f"forja's price table {path} does not exist; reinstall forja.gpu") from exc
    except ValueError as exc:
        raise PriceError(f"forja's price table {path} is not valid JSON: {exc}") from exc


def read_override(path: Path) -> dict[str, Any]:
    """The user's override file: YAML (or JSON, which is YAML too), so PyYAML reads it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise PriceError(
            f"prices file {path} does not exist; fix the path given to --prices/FORJA_PRICES"
        ) from exc
    import yaml  # only for a user's file; ansible-core and forja both depend on PyYAML (docstring)

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PriceError(f"prices file {path} is not valid YAML: {exc}") from exc
    return _as_table(data, path)


@dataclasses.dataclass(frozen=True)
class PriceTable:
    """The merged table (ours plus the user's override) with lookups that explain a miss."""

    data: Mapping[str, Any]

    @property
    def date(self) -> str:
        return str(self.data.get("date", "undated"))

    @property
    def hours_per_month(self) -> float:
        return float(self.data.get("hours_per_month", 730))

    def _entry(self, section: str, name: str, region: str, field: str) -> tuple[float, str]:
        entries = self.data.get(section) or {}
        if name not in entries:
            known = ", ".join(sorted(entries)) or "none"
            raise PriceError(
                f"no price for {section[:-1].replace('_', ' ')} {name!r} (known: {known}); "
                f"{OVERRIDE_HINT} under {section}.{name}.{region}.{field}"
            )
        prices = entries[name].get(region)
        if not isinstance(prices, Mapping) or field not in prices:
            known = ", ".join(sorted(entries[name])) or "none"
            raise PriceError(
                f"no {field} price for {name!r} in region {region!r} (regions known: {known}); "
                f"{OVERRIDE_HINT} under {section}.{name}.{region}.{field}"
            )
        return float(prices[field]), str(prices.get("basis", "unknown"))

    def machine_rate(
        self, machine_type: str, region: str, spot: bool = False, flex_start: bool = False
    ) -> Rate:
        if flex_start:
            return self.flex_start_rate(machine_type, region)
        field = "spot" if spot else "on_demand"
        usd, basis = self._entry("machine_types", machine_type, region, field)
        return Rate(usd, basis, f"{machine_type} {field} in {region}")

    def flex_start_rate(self, machine_type: str, region: str) -> Rate:
        """A Flex-start VM's rate: the entry's own `flex_start` figure when the table has one; else the
        on-demand rate, which is what G2 is billed (no DWS discount for it) and an upper bound for the
        series that get one (A2, A3, A4, H4D), said so in the basis until a sourced figure is added."""
        prices = ((self.data.get("machine_types") or {}).get(machine_type) or {}).get(region)
        what = f"{machine_type} flex_start in {region}"
        if isinstance(prices, Mapping) and "flex_start" in prices:
            return Rate(float(prices["flex_start"]), str(prices.get("basis", "unknown")), what)
        usd, basis = self._entry("machine_types", machine_type, region, "on_demand")
        if machine_type.split("-", 1)[0] in FLEX_START_DISCOUNT_SERIES:
            where = f"machine_types.{machine_type}.{region}.flex_start"
            return Rate(usd, "estimate", f"{what} at on-demand, an upper bound (Google discounts this "
                        f"series' Flex-start VMs; {OVERRIDE_HINT} under {where})")
        return Rate(usd, basis, f"{what} at on-demand (no DWS discount for this series)")

    def accelerator_rate(self, accelerator: str, region: str, spot: bool = False) -> Rate:
        field = "spot" if spot else "on_demand"
        usd, basis = self._entry("accelerators", accelerator, region, field)
        return Rate(usd, basis, f"{accelerator} {field} in {region}")

    def disk_price(self, disk_type: str, region: str) -> DiskPrice:
        usd, basis = self._entry("disks", disk_type, region, "per_gb_month")
        return DiskPrice(usd, basis, f"{disk_type} per GB-month in {region}")

    def instance_rate(
        self,
        machine_type: str,
        zone: str,
        spot: bool = False,
        accelerators: Mapping[str, int] | None = None,
        flex_start: bool = False,
    ) -> Rate:
        """The VM's hourly rate: its machine type plus any GPUs attached to it (N1 + T4; never Flex-start)."""
        region = region_of(zone)
        machine = self.machine_rate(machine_type, region, spot, flex_start)
        usd, bases = machine.usd_per_hour, [machine.basis]
        what = [machine.what]
        for name, count in (accelerators or {}).items():
            if count <= 0:
                continue
            gpu = self.accelerator_rate(name, region, spot)
            usd += gpu.usd_per_hour * count
            bases.append(gpu.basis)
            what.append(f"{count} x {gpu.what}")
        basis = "estimate" if any("estimate" in b for b in bases) else bases[0]
        return Rate(round(usd, 6), basis, " + ".join(what))


def load_prices(
    override: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> PriceTable:
    """Our table, with the user's file (argument first, then $FORJA_PRICES) merged over it."""
    env = os.environ if env is None else env
    data = _read_ours(DEFAULT_TABLE)
    data.pop("_about", None)  # the table's comments
    _check_numbers(data, str(DEFAULT_TABLE))
    path = override or env.get(ENV_OVERRIDE)
    if path:
        extra = read_override(Path(path))
        _check_numbers(extra, str(path))
        data = _merge(data, extra)
    return PriceTable(data)


# --- A VM's record, read as what decides its rate ------------------------------------------------


def short(value: Any) -> str:
    """The last part of a Compute API URL (".../zones/us-east1-d" -> "us-east1-d"); "" for nothing."""
    return str(value).rsplit("/", 1)[-1] if value else ""


def _picker(data: Mapping[str, Any]) -> Any:
    def pick(*keys: str) -> Any:
        for key in keys:
            if data.get(key) not in (None, ""):
                return data[key]
        return None

    return pick


@dataclasses.dataclass(frozen=True)
class PricedVm:
    """What a VM's hourly rate depends on: its machine type, zone, provisioning model and attached GPUs."""

    name: str
    zone: str
    machine_type: str
    spot: bool = False
    accelerators: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: STANDARD, SPOT or FLEX_START ("" reads as `spot` says).
    provisioning_model: str = ""

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PricedVm:
        """Accept inventory hostvars (snake_case) or the Compute API's JSON (camelCase)."""
        pick = _picker(data)
        name = pick("name", "inventory_hostname")
        if not name:
            raise ValueError("instance has no 'name'")
        zone = short(pick("zone", "gcp_zone"))
        machine_type = short(pick("machine_type", "machineType"))
        for field, value in (("zone", zone), ("machine_type", machine_type)):
            if not value:
                raise ValueError(f"instance {name!r} has no '{field}'; it is needed to look its price up")
        scheduling = data.get("scheduling") or {}
        model = pick("provisioning_model") or scheduling.get("provisioningModel") or "STANDARD"
        spot = str(model).upper() == "SPOT" or bool(pick("preemptible") or scheduling.get("preemptible"))
        accelerators: dict[str, int] = {}
        for acc in data.get("guestAccelerators") or data.get("accelerators") or []:
            kind = short(acc.get("acceleratorType") or acc.get("type"))
            count = int(acc.get("acceleratorCount") or acc.get("count") or 0)
            accelerators[kind] = accelerators.get(kind, 0) + count
        if not accelerators and pick("gpu_type") and pick("gpu_count"):  # forja's gcp_gpu hostvars
            accelerators[short(pick("gpu_type"))] = int(pick("gpu_count"))
        return cls(str(name), zone, machine_type, spot, accelerators, str(model).upper())


def machine_rate(vm: Any, prices: PriceTable) -> Rate:
    """The VM's hourly rate, priced under its machine type's price key.

    ``vm`` is a ``PricedVm`` or anything with its fields (forja's ``Instance``). Which types come
    with their GPUs (G2/A2/A3, priced as one figure) is the machine catalog's fact, not the price
    table's: only GPUs attached to other types (N1 + T4) are added. A type the catalog does not
    know is priced under its own name, as a user's price file may add it.
    """
    known = MACHINE_TYPES.get(vm.machine_type)
    key = known.key if known is not None else vm.machine_type
    extra = {} if known is not None and known.gpu_count else dict(vm.accelerators)
    flex_start = str(getattr(vm, "provisioning_model", "") or "").upper() == "FLEX_START"
    return prices.instance_rate(key, vm.zone, vm.spot, extra, flex_start)
