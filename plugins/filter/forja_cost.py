# Copyright: forja contributors
# Apache-2.0
"""Cost filters: what a host costs per hour, from forja's price table (``forja.cost``).

The figures and the rules (a G2 machine type includes its L4, N1 VMs add their attached T4s, Spot
vs on-demand, the user's override file) live in ``forja.cost``; this plugin only adapts a host's
inventory record to it, so a playbook and ``forja cost`` can never disagree about a rate.
Documentation: ``forja_hourly_rate.yml`` beside this file (``ansible-doc -t filter forja_hourly_rate``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

_IMPORT_ERROR: ImportError | None = None
try:
    from forja.cost.prices import PriceError, load_prices
    from forja.cost.spend import Instance, machine_rate
except ImportError:  # Ansible run by a Python without forja installed: use the checkout it lives in
    _REPO = Path(__file__).resolve().parents[2]
    if (_REPO / "forja" / "cost" / "prices.py").is_file() and str(_REPO) not in sys.path:
        sys.path.append(str(_REPO))
    try:
        from forja.cost.prices import PriceError, load_prices
        from forja.cost.spend import Instance, machine_rate
    except ImportError as exc:  # reported when the filter is used, so ansible-doc still renders
        _IMPORT_ERROR = exc

# The hostvars of the gcp_gpu inventory plugin that decide a VM's price.
_PRICED_FIELDS = ("machine_type", "zone", "gpu_type", "gpu_count", "provisioning_model")
_NAME_FIELDS = ("instance_name", "name", "inventory_hostname")
_FIX = (
    "list the host with the gcp_gpu inventory plugin (it sets machine_type and zone), "
    "or give the rate yourself (for the trainer_run role: trainer_run_price_per_hour)"
)


def _pick(record: Mapping[str, Any], key: str) -> Any:
    value = record.get(key)
    return None if value in (None, "") else value


def hourly_rate(record: Mapping[str, Any], prices: str | None = None, whole_cluster: bool = False) -> float:
    """USD per hour of the VM a host's inventory record describes (machine type, GPUs, Spot).

    With ``whole_cluster``, of every VM of the host's cluster (its ``forja_node_count``): the members
    are made alike and run together, so what one member's run or spend cap must count is the sum.
    """
    if _IMPORT_ERROR is not None:
        raise AnsibleFilterError(
            f"forja_hourly_rate: forja's cost package cannot be imported ({_IMPORT_ERROR}); "
            "run Ansible from forja's virtualenv (source .venv/bin/activate)"
        )
    if not isinstance(record, Mapping):
        raise AnsibleFilterError(
            "forja_hourly_rate: expected a host's inventory record such as hostvars[inventory_hostname], "
            f"got {type(record).__name__}"
        )
    names = (_pick(record, key) for key in _NAME_FIELDS)
    name = str(next((value for value in names if value is not None), "the host"))
    fields: dict[str, Any] = {"name": name}
    for key in _PRICED_FIELDS:
        value = _pick(record, key)
        if value is not None:
            fields[key] = value
    for key in ("machine_type", "zone"):
        if key not in fields:
            raise AnsibleFilterError(
                f"forja_hourly_rate: {name} has no '{key}' in its inventory record, "
                f"so its price cannot be looked up; {_FIX}"
            )
    # Spot shows as provisioning_model SPOT, or as the older preemptible flag ("false" is no).
    fields["preemptible"] = boolean(_pick(record, "preemptible") or False, strict=False)
    try:
        instance = Instance.from_mapping(fields)
        rate = machine_rate(instance, load_prices(os.path.expanduser(prices) if prices else None))
    except (PriceError, ValueError) as exc:
        # Ansible appends the cause (which names the table entry to add) after this message.
        raise AnsibleFilterError(
            f"forja_hourly_rate: cannot price {name} (machine_type {fields['machine_type']!r}, "
            f"zone {fields['zone']!r}); give its rate yourself "
            "(for the trainer_run role: trainer_run_price_per_hour), or fix the price table"
        ) from exc
    if not whole_cluster:
        return rate.usd_per_hour
    count = _pick(record, "forja_node_count") or 1
    try:
        members = int(count)
    except (TypeError, ValueError):
        members = 0
    if members < 1:
        raise AnsibleFilterError(
            f"forja_hourly_rate: {name} has forja_node_count {count!r}; expected a whole number from 1 "
            "(the gcp_gpu inventory plugin sets it for a cluster's members)"
        )
    return rate.usd_per_hour * members


class FilterModule:
    """forja's cost filters."""

    def filters(self) -> dict[str, Any]:
        return {"forja_hourly_rate": hourly_rate}
