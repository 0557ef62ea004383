"""The inventory plugin's pure parts: filters sent to the server, group names, hostnames, hostvars."""

from __future__ import annotations

import pytest
from ansible_collections.forja.gpu.plugins.inventory import gcp_gpu

INSTANCE = {
    "name": "forja-l4",
    "zone": "https://compute.googleapis.com/compute/v1/projects/p/zones/us-east1-d",
    "machineType": "https://compute.googleapis.com/compute/v1/projects/p/zones/us-east1-d/machineTypes/g2-standard-8",
    "status": "RUNNING",
    "selfLink": "https://compute.googleapis.com/compute/v1/projects/p/zones/us-east1-d/instances/forja-l4",
    "networkInterfaces": [{"networkIP": "10.142.0.2", "accessConfigs": [{"natIP": "34.1.2.3"}]}],
    "metadata": {"items": [{"key": "startup-script", "value": "export TOKEN=s3cret"}]},
    "tags": {"items": ["forja-ssh"]},
}


@pytest.mark.parametrize(
    ("filters", "labels", "expected"),
    [
        ([], {}, None),
        (["status = RUNNING"], {}, "(status = RUNNING)"),
        ([], {"forja": "managed", "a": "b"}, "(labels.a = b) (labels.forja = managed)"),
        (["name = forja-*"], {"forja": "managed"}, "(name = forja-*) (labels.forja = managed)"),
    ],
)
def test_filters_and_labels_are_anded_for_the_server(filters, labels, expected):
    assert gcp_gpu.build_filter(filters, labels) == expected


@pytest.mark.parametrize(
    ("text", "group"),
    [("nvidia-l4", "nvidia_l4"), ("RUNNING", "running"), ("nvidia-h100-mega-80gb", "nvidia_h100_mega_80gb")],
)
def test_group_names_are_lowercase_and_sanitized(text, group):
    assert gcp_gpu.sanitize(text) == group


@pytest.mark.parametrize(
    ("sources", "expected"),
    [(["name"], "forja-l4"), (["public_ip", "name"], "34.1.2.3"), (["private_ip"], "10.142.0.2")],
)
def test_hostnames_take_the_first_source_that_is_set(sources, expected):
    record = gcp_gpu.host_record(INSTANCE, ("public_ip", "private_ip"), expose_metadata=False)
    assert gcp_gpu.hostname_of(record, sources) == expected


def test_hostvars_avoid_reserved_names_and_hide_metadata_values():
    record = gcp_gpu.host_record(INSTANCE, ("private_ip", "public_ip"), expose_metadata=False)
    assert "name" not in record and "tags" not in record
    assert record["instance_name"] == "forja-l4" and record["network_tags"] == ["forja-ssh"]
    assert record["ansible_host"] == "10.142.0.2"
    assert record["metadata_keys"] == ["startup-script"] and "s3cret" not in repr(record)
    shown = gcp_gpu.host_record(INSTANCE, ("public_ip",), expose_metadata=True)
    assert shown["metadata"] == {"startup-script": "export TOKEN=s3cret"}


KNOWN = ["zones", "filters", "credentials_file", "projects", "labels", "managed_only", "plugin"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["plugin", "zones", "filters"], []),
        (["zone"], ["'zone' is not an option of forja.gpu.gcp_gpu; did you mean 'zones'?"]),
        (["filter"], ["'filter' is not an option of forja.gpu.gcp_gpu; did you mean 'filters'?"]),
        (
            ["credential_file"],
            ["'credential_file' is not an option of forja.gpu.gcp_gpu; did you mean 'credentials_file'?"],
        ),
        (["managed"], ["'managed' is not an option of forja.gpu.gcp_gpu; did you mean 'managed_only'?"]),
        (
            ["xyzzy"],
            [
                "'xyzzy' is not an option of forja.gpu.gcp_gpu; the options are: credentials_file, filters, "
                "labels, managed_only, plugin, projects, zones"
            ],
        ),
    ],
)
def test_unknown_options_name_the_closest_known_one(given, expected):
    assert gcp_gpu.unknown_options(given, KNOWN) == expected


@pytest.mark.parametrize(
    ("zones", "all_zones", "filter_expr", "sentence"),
    [
        (
            ["us-central1-a", "us-east1-d"],
            True,
            "(labels.forja = managed)",
            "inv/gcp_gpu.yml listed project 'p' in every zone (2: us-central1-a, us-east1-d) "
            "with filter (labels.forja = managed)",
        ),
        (["us-east1-d"], False, None, "inv/gcp_gpu.yml listed project 'p' in zones us-east1-d"),
    ],
)
def test_what_a_listing_looked_at_is_one_sentence(zones, all_zones, filter_expr, sentence):
    looked = gcp_gpu.searched("inv/gcp_gpu.yml", "p", zones, all_zones, filter_expr)
    assert looked["summary"] == sentence
    assert (looked["zones"], looked["all_zones"], looked["filter"]) == (zones, all_zones, filter_expr or "")
