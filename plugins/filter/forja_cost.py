# Copyright: forja contributors
# Apache-2.0
"""Cost filters: what a host costs per hour, from forja's price table.

The figures (module_utils/forja_gcp_prices.json) and the rules (a G2 machine type includes its L4,
N1 VMs add their attached T4s, Spot vs on-demand, the user's override file) live in
module_utils/forja_cost.py, which ``forja cost`` reads too (``forja.cost``, loading that file by
path); this plugin only adapts a host's inventory record to it, so a playbook and ``forja cost``
can never disagree about a rate. It imports nothing of forja: the installed collection works alone.
Documentation: ``forja_hourly_rate.yml`` beside this file (``ansible-doc -t filter forja_hourly_rate``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.forja.gpu.plugins.module_utils.forja_cost import (
    PricedVm,
    PriceError,
    load_prices,
    machine_rate,
)

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
        vm = PricedVm.from_mapping(fields)
        rate = machine_rate(vm, load_prices(os.path.expanduser(prices) if prices else None))
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


# What else prices a run: its disks (billed all along) and its cluster (every member is kept up).
_RUN_FIELDS = ("preemptible", "boot_disk_size_gb", "boot_disk_type", "disk_size_gb", "disk_type",
               "forja_cluster", "forja_node_rank")


def price_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a host's inventory record that price a run on it, named as ``forja cost`` reads
    them: what the train playbook hands to ``python -m forja.history record --instances`` so the
    controller prices site.yml's run as ``forja cost --run`` does, without the rest of the hostvars
    (connection settings, group variables) on a command line."""
    if not isinstance(record, Mapping):
        raise AnsibleFilterError(
            "forja_price_record: expected a host's inventory record such as hostvars[inventory_hostname], "
            f"got {type(record).__name__}"
        )
    found: dict[str, Any] = {"name": str(_pick(record, "inventory_hostname") or _pick(record, "name") or "")}
    for key in (*_PRICED_FIELDS, *_RUN_FIELDS):
        value = _pick(record, key)
        if value is not None:
            found[key] = value
    return found


class FilterModule:
    """forja's cost filters."""

    def filters(self) -> dict[str, Any]:
        return {"forja_hourly_rate": hourly_rate, "forja_price_record": price_record}
