"""The price table: what a machine type, an attached GPU and a persistent disk cost.

The figures live in data (``prices.yaml`` beside this module), dated and with their source, so a
price change is a data edit and a user with a negotiated or newer price list can merge their own
YAML over ours (``--prices FILE`` or ``FORJA_PRICES``) without touching the code.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

DEFAULT_TABLE = Path(__file__).with_name("prices.yaml")
ENV_OVERRIDE = "FORJA_PRICES"
OVERRIDE_HINT = "add it to a prices override file (forja cost --prices FILE, or FORJA_PRICES=FILE)"


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
                for field in ("on_demand", "spot", "per_gb_month"):
                    if field not in prices:
                        continue
                    value = prices[field]
                    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                        raise PriceError(
                            f"{origin}: '{section}.{name}.{region}.{field}' is {value!r}; "
                            "it must be a number of USD >= 0"
                        )


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise PriceError(
            f"prices file {path} does not exist; fix the path given to --prices/FORJA_PRICES"
        ) from exc
    except yaml.YAMLError as exc:
        raise PriceError(f"prices file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PriceError(f"prices file {path} must hold a mapping (machine_types/accelerators/disks)")
    return data


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

    def machine_rate(self, machine_type: str, region: str, spot: bool = False) -> Rate:
        field = "spot" if spot else "on_demand"
        usd, basis = self._entry("machine_types", machine_type, region, field)
        return Rate(usd, basis, f"{machine_type} {field} in {region}")

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
    ) -> Rate:
        """The VM's hourly rate: its machine type plus any GPUs attached to it (N1 + T4)."""
        region = region_of(zone)
        machine = self.machine_rate(machine_type, region, spot)
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
    data = _read_yaml(DEFAULT_TABLE)
    _check_numbers(data, str(DEFAULT_TABLE))
    path = override or env.get(ENV_OVERRIDE)
    if path:
        extra = _read_yaml(Path(path))
        _check_numbers(extra, str(path))
        data = _merge(data, extra)
    return PriceTable(data)
