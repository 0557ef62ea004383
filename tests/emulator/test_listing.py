"""aggregatedList and list: pages of at most 500, NO_RESULTS_ON_PAGE warnings, filters."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from emulator_helpers import PROJECT, ZONE, Client

from forja_sandbox.compute_emulator import ComputeEmulator
from forja_sandbox.compute_emulator.catalog import ZONES

TWENTY_ZONES = sorted(ZONES)[:20]
NAMES_ONLY = "items/*/instances/name,nextPageToken"  # small pages: these tests count, not inspect


def all_pages(client: Client, path: str, **params: Any) -> list[dict[str, Any]]:
    pages = []
    token = None
    while True:
        query = dict(params, **({"pageToken": token} if token else {}))
        page = client.ok(client.get(path, **query))
        pages.append(page)
        token = page.get("nextPageToken")
        if not token:
            return pages


def instances_of(page: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for scope in page["items"].values() for i in scope.get("instances", [])]


@pytest.fixture(scope="module")
def crowded() -> Iterator[ComputeEmulator]:
    """5,000 instances spread over 20 zones (250 each), a tenth of them stopped; read-only tests."""
    with ComputeEmulator() as emu:
        for zone in TWENTY_ZONES:
            emu.seed_instances(PROJECT, zone, 225, name_prefix=f"{zone}-run", labels={"env": "prod"})
            emu.seed_instances(
                PROJECT, zone, 25, name_prefix=f"{zone}-off", labels={"env": "dev"}, status="TERMINATED"
            )
        yield emu


@pytest.fixture
def reader(crowded: ComputeEmulator) -> Client:
    return Client(crowded, crowded.issue_token())


def test_5000_instances_in_20_zones_come_in_ceil_n_over_500_pages(
    crowded: ComputeEmulator, reader: Client
) -> None:
    crowded.stats_reset()
    pages = all_pages(reader, "aggregated/instances")
    assert len(pages) == math.ceil(5000 / 500)
    assert all(len(instances_of(p)) == 500 for p in pages)
    names = [i["name"] for p in pages for i in instances_of(p)]
    assert len(names) == len(set(names)) == 5000
    assert "nextPageToken" not in pages[-1]
    assert crowded.stats["by_method"]["compute.instances.aggregatedList"] == 10


def test_every_zone_appears_on_every_page_with_instances_or_a_warning(
    crowded: ComputeEmulator, reader: Client
) -> None:
    page = reader.ok(reader.get("aggregated/instances", maxResults=300))
    assert page["kind"] == "compute#instanceAggregatedList"
    assert page["id"] == f"projects/{PROJECT}/aggregated/instances"
    assert set(page["items"]) == {f"zones/{z}" for z in ZONES}
    empty = [scope for scope, value in page["items"].items() if "instances" not in value]
    assert len(empty) == len(ZONES) - 2  # 300 instances span the first 250 + 50 of the next zone
    for scope in empty:
        assert page["items"][scope] == {
            "warning": {
                "code": "NO_RESULTS_ON_PAGE",
                "message": f"There are no results for scope '{scope}' on this page.",
                "data": [{"key": "scope", "value": scope}],
            }
        }


def test_max_results_sets_the_page_size(crowded: ComputeEmulator, reader: Client) -> None:
    pages = all_pages(
        reader, "aggregated/instances", maxResults=7, filter=f"zone = {ZONE}", fields=NAMES_ONLY
    )
    assert [len(instances_of(p)) for p in pages] == [7] * 35 + [5]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("status = RUNNING", 4500),
        ("status != RUNNING", 500),
        ("labels.env = dev", 500),
        ("name = us-east1-d-run-7", 1),
        ("name eq ^us-east1-.*-off-.*", 75),
        ("name eq us-central1-a-run-1.*", 111),
        ("(status = RUNNING) (labels.env = prod)", 4500),
        ("status = RUNNING AND labels.env = dev", 0),
        ("(zone = us-east1-d) AND (status = TERMINATED)", 25),
        ("labels.env = dev OR name = us-east1-d-run-0", 501),
        ("NOT labels.env:*", 0),
        ('name = "us-east1-b-off-*"', 25),
    ],
)
def test_filters_select_what_google_would(
    crowded: ComputeEmulator, reader: Client, expression: str, expected: int
) -> None:
    pages = all_pages(reader, "aggregated/instances", filter=expression, fields=NAMES_ONLY)
    assert sum(len(instances_of(p)) for p in pages) == expected


def test_a_filter_matching_nothing_still_lists_every_zone_as_a_warning(
    crowded: ComputeEmulator, reader: Client
) -> None:
    page = reader.ok(reader.get("aggregated/instances", filter="name = nobody"))
    assert all(value["warning"]["code"] == "NO_RESULTS_ON_PAGE" for value in page["items"].values())
    assert "nextPageToken" not in page


def test_zone_list_pages_and_filters(crowded: ComputeEmulator, reader: Client) -> None:
    pages = all_pages(reader, f"zones/{ZONE}/instances", maxResults=100)
    assert [len(p["items"]) for p in pages] == [100, 100, 50]
    assert pages[0]["kind"] == "compute#instanceList"
    stopped = reader.ok(reader.get(f"zones/{ZONE}/instances", filter="status = TERMINATED"))
    assert len(stopped["items"]) == 25 and all(i["status"] == "TERMINATED" for i in stopped["items"])


def test_an_empty_zone_list_has_no_items_key(client: Client) -> None:
    page = client.ok(client.get(f"zones/{ZONE}/instances"))
    assert "items" not in page and "nextPageToken" not in page


def test_a_page_token_only_works_with_its_own_filter(crowded: ComputeEmulator, reader: Client) -> None:
    token = reader.ok(reader.get("aggregated/instances", filter="status = RUNNING"))["nextPageToken"]
    response = reader.get("aggregated/instances", filter="status = TERMINATED", pageToken=token)
    assert response.status_code == 400 and "'pageToken'" in response.json()["error"]["message"]


def test_order_by_creation_timestamp_descending(client: Client, emu: ComputeEmulator) -> None:
    emu.seed_instances(PROJECT, ZONE, 3, name_prefix="a")
    emu.seed_instances(PROJECT, ZONE, 1, name_prefix="z")
    names = [
        i["name"] for i in client.ok(client.get(f"zones/{ZONE}/instances", orderBy="name desc"))["items"]
    ]
    assert names == ["z-0", "a-2", "a-1", "a-0"]


def test_fields_returns_a_partial_response(crowded: ComputeEmulator, reader: Client) -> None:
    page = reader.ok(
        reader.get(
            "aggregated/instances", maxResults=3, fields="items/*/instances(name,status),nextPageToken"
        )
    )
    assert set(page) == {"items", "nextPageToken"}
    listed = [i for scope in page["items"].values() for i in scope.get("instances", [])]
    assert [set(i) for i in listed] == [{"name", "status"}] * 3
    one = reader.ok(
        reader.get(f"zones/{ZONE}/instances/{ZONE}-run-0", fields="name,networkInterfaces/networkIP")
    )
    assert set(one) == {"name", "networkInterfaces"} and set(one["networkInterfaces"][0]) == {"networkIP"}


def test_a_malformed_field_selection_is_400(reader: Client) -> None:
    response = reader.get("aggregated/instances", fields="items(name")
    assert response.status_code == 400 and "Invalid field selection" in response.json()["error"]["message"]
