"""A Flex-start VM is priced by its own rule: G2 at the on-demand rate (Google gives it no DWS
discount), A2/A3 at on-demand as a marked upper bound until a sourced figure is added, and an
override's `flex_start` figure wins over both."""

from __future__ import annotations

from forja.cost.prices import load_prices
from forja.cost.spend import Instance, machine_rate


def flex_vm(machine_type: str) -> Instance:
    """A Flex-start VM as the Compute API returns it."""
    return Instance.from_mapping({
        "name": "forja-flex", "zone": "projects/p/zones/us-east1-d", "status": "RUNNING",
        "machineType": f"projects/p/zones/us-east1-d/machineTypes/{machine_type}",
        "scheduling": {"provisioningModel": "FLEX_START", "maxRunDuration": {"seconds": "259200"}},
    })


def test_a_g2_flex_start_vm_is_billed_at_the_on_demand_rate():
    table = load_prices(env={})
    rate = machine_rate(flex_vm("g2-standard-8"), table)
    assert rate.usd_per_hour == table.machine_rate("g2-standard-8", "us-east1").usd_per_hour
    assert rate.usd_per_hour > table.machine_rate("g2-standard-8", "us-east1", spot=True).usd_per_hour
    assert "flex_start" in rate.what and "no DWS discount" in rate.what


def test_an_a2_flex_start_vm_is_an_upper_bound_marked_as_an_estimate():
    table = load_prices(env={})
    rate = machine_rate(flex_vm("a2-highgpu-1g"), table)
    assert rate.usd_per_hour == table.machine_rate("a2-highgpu-1g", "us-east1").usd_per_hour
    assert rate.basis == "estimate" and "machine_types.a2-highgpu-1g.us-east1.flex_start" in rate.what


def test_a_flex_start_figure_of_the_users_overrides_the_rule(tmp_path):
    override = tmp_path / "prices.yaml"
    override.write_text("machine_types:\n  a2-highgpu-1g:\n    us-east1:\n      flex_start: 2.5\n"
                        "      basis: my invoice\n")
    rate = machine_rate(flex_vm("a2-highgpu-1g"), load_prices(override, env={}))
    assert (rate.usd_per_hour, rate.basis) == (2.5, "my invoice")
