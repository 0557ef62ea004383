"""The price table: dated, sourced, complete for the machine types forja offers, overridable."""

from __future__ import annotations

import pytest

from forja.cost.prices import PriceError, load_prices, region_of

REGIONS = ("us-east1", "us-central1", "europe-west4", "asia-east1")
MACHINES = (
    [f"g2-standard-{n}" for n in (4, 8, 12, 16, 24, 32, 48, 96)]
    + [f"a2-highgpu-{n}g" for n in (1, 2, 4, 8)]
    + [f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8)]
    + ["n1-standard-4", "n1-standard-8", "n1-standard-16"]
)


@pytest.fixture(scope="module")
def table():
    return load_prices(env={})


def test_table_is_dated_and_names_its_source(table):
    assert table.date == "2026-09-17"
    assert "nvidia-gcp-facts.md" in table.data["source"]
    assert table.hours_per_month == 730


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("region", REGIONS)
def test_every_offered_machine_has_on_demand_and_spot_in_every_region(table, machine, region):
    on_demand = table.machine_rate(machine, region)
    spot = table.machine_rate(machine, region, spot=True)
    assert 0 < spot.usd_per_hour < on_demand.usd_per_hour
    assert on_demand.basis  # "note ..." or "estimate"


@pytest.mark.parametrize("disk", ["pd-balanced", "pd-ssd", "pd-standard"])
@pytest.mark.parametrize("region", REGIONS)
def test_every_disk_type_has_a_monthly_price_per_gb(table, disk, region):
    assert 0 < table.disk_price(disk, region).usd_per_gb_month < 1


def test_figures_from_the_note_are_marked_as_such(table):
    l4 = table.machine_rate("g2-standard-8", "us-east1")
    assert l4.usd_per_hour == pytest.approx(0.8536)
    assert l4.basis.startswith("note")
    assert table.disk_price("pd-balanced", "us-east1").usd_per_gb_month == 0.10
    assert table.machine_rate("a2-highgpu-1g", "us-east1").basis == "estimate"


def test_n1_with_t4_adds_the_attached_gpus(table):
    rate = table.instance_rate("n1-standard-8", "us-east1-c", accelerators={"nvidia-tesla-t4": 2})
    assert rate.usd_per_hour == pytest.approx(0.38 + 2 * 0.35)
    assert "2 x nvidia-tesla-t4" in rate.what
    assert rate.basis == "estimate"


def test_a_user_file_overrides_and_extends_the_table(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text(
        "machine_types:\n"
        "  g2-standard-8:\n"
        "    us-east1: {on_demand: 0.70, spot: 0.25, basis: my invoice}\n"
        "  g2-standard-8x:\n"
        "    us-east1: {on_demand: 1.0}\n"
    )
    table = load_prices(own, env={})
    assert table.machine_rate("g2-standard-8", "us-east1", spot=True).usd_per_hour == 0.25
    assert table.machine_rate("g2-standard-8", "europe-west4").usd_per_hour == pytest.approx(0.9390)  # kept
    assert table.machine_rate("g2-standard-8x", "us-east1").usd_per_hour == 1.0


def test_the_override_can_come_from_the_environment(tmp_path):
    own = tmp_path / "env.yaml"
    own.write_text("disks:\n  pd-balanced:\n    us-east1: {per_gb_month: 0.08}\n")
    table = load_prices(env={"FORJA_PRICES": str(own)})
    assert table.disk_price("pd-balanced", "us-east1").usd_per_gb_month == 0.08


def test_an_unknown_machine_type_names_the_entry_to_add(table):
    with pytest.raises(PriceError) as err:
        table.machine_rate("g2-standard-9", "us-east1")
    assert "machine_types.g2-standard-9.us-east1.on_demand" in str(err.value)
    assert "--prices" in str(err.value)


def test_an_unknown_region_lists_the_known_ones(table):
    with pytest.raises(PriceError, match=r"region 'me-west1'.*us-central1"):
        table.machine_rate("g2-standard-8", "me-west1", spot=True)


@pytest.mark.parametrize(
    "text, field",
    [
        (
            "machine_types:\n  g2-standard-8:\n    us-east1: {on_demand: cheap}\n",
            "machine_types.g2-standard-8.us-east1.on_demand",
        ),
        ("disks:\n  pd-ssd:\n    us-east1: {per_gb_month: -1}\n", "disks.pd-ssd.us-east1.per_gb_month"),
    ],
)
def test_a_bad_figure_in_the_override_is_refused_by_its_path(tmp_path, text, field):
    own = tmp_path / "bad.yaml"
    own.write_text(text)
    with pytest.raises(PriceError, match=field.replace(".", r"\.")):
        load_prices(own, env={})


def test_a_missing_override_file_says_which_path(tmp_path):
    with pytest.raises(PriceError, match="does not exist"):
        load_prices(tmp_path / "nope.yaml", env={})


@pytest.mark.parametrize(
    "zone, region",
    [
        ("us-east1-d", "us-east1"),
        ("projects/p/zones/europe-west4-a", "europe-west4"),
        ("asia-east1", "asia-east1"),
    ],
)
def test_region_of_a_zone(zone, region):
    assert region_of(zone) == region


def test_region_of_garbage_is_refused():
    with pytest.raises(PriceError, match="not a GCP zone"):
        region_of("nowhere")
