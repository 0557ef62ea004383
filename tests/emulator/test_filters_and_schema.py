"""Pure parts, tested directly: the filter grammar, the field selection, the pinned schema."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from forja_sandbox.compute_emulator import ApiError
from forja_sandbox.compute_emulator.fields import parse_fields, project
from forja_sandbox.compute_emulator.filters import compile_filter
from forja_sandbox.compute_emulator.schema import methods, revision

INSTANCE = {
    "name": "gpu-1",
    "status": "RUNNING",
    "id": "4000000000000007919",
    "labels": {"env": "prod", "team": "ml"},
    "zone": "http://127.0.0.1:1/compute/v1/projects/p/zones/us-east1-d",
    "scheduling": {"preemptible": True, "provisioningModel": "SPOT"},
    "networkInterfaces": [{"networkIP": "10.142.0.2"}],
    "creationTimestamp": "2026-11-22T04:00:00.000+00:00",
}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("status = RUNNING", True),
        ("status != RUNNING", False),
        ('name = "gpu-1"', True),
        ("name = gpu-*", True),
        ("name = cpu-*", False),
        ("labels.env = prod", True),
        ("labels.env:*", True),
        ("labels.owner:*", False),
        ("zone = us-east1-d", True),
        ("zone = us-east1-c", False),
        ("scheduling.preemptible = true", True),
        ("networkInterfaces.networkIP = 10.142.0.2", True),
        ("creationTimestamp > 2026-01-01", True),
        ("(status = RUNNING) (labels.team = ml)", True),
        ("status = RUNNING AND labels.team = infra", False),
        ("status = TERMINATED OR labels.team = ml", True),
        ("NOT status = RUNNING", False),
        ("-labels.env = prod", False),
        ("((status = RUNNING) AND (NOT (name = x)))", True),
        ("name eq gpu-.*", True),
        ("name eq gpu", False),
        ("name ne gpu-.*", False),
        ("name eq (gpu|cpu)-1", True),
        ("(name eq g.*) (status eq RUN.*)", True),
    ],
)
def test_filter_expressions_match_like_the_api(expression: str, expected: bool) -> None:
    assert compile_filter(expression)(INSTANCE) is expected


@pytest.mark.parametrize(
    "expression",
    ["status", "status =", "(status = RUNNING", "name eq [", "status = RUNNING name eq x", "= x"],
)
def test_malformed_filters_are_a_400_naming_the_filter(expression: str) -> None:
    with pytest.raises(ApiError) as raised:
        compile_filter(expression)
    assert raised.value.code == 400 and "'filter'" in raised.value.message


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        ("name", {"name": "gpu-1"}),
        ("labels/env,status", {"labels": {"env": "prod"}, "status": "RUNNING"}),
        ("networkInterfaces(networkIP)", {"networkInterfaces": [{"networkIP": "10.142.0.2"}]}),
        ("labels(*)", {"labels": {"env": "prod", "team": "ml"}}),
        ("missing,name", {"name": "gpu-1"}),
    ],
)
def test_field_selections_keep_only_what_is_asked(selection: str, expected: dict) -> None:
    assert project(INSTANCE, parse_fields(selection)) == expected


def test_the_schema_is_the_pinned_discovery_document() -> None:
    assert version("google-api-python-client") == "2.202.0"
    assert revision() == "20261106"
    insert = methods()["compute.instances.insert"]
    assert (insert.http_method, insert.flat_path) == ("POST", "projects/{project}/zones/{zone}/instances")
    assert insert.request_schema == "Instance"
