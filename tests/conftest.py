"""Shared pytest setup: real test hosts need root and the Debian tools the README's setup installs."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

with contextlib.suppress(ImportError):  # without the trainer extra, its tests are not collected either
    # ansible-core replaces sys.intern with a wrapper object when its module_utils are imported
    # (the gcp tests load them in this process); torch._dynamo, imported lazily by the first
    # optimizer step, then refuses to register its polyfill for that object and every later
    # trainer test fails. Loading dynamo first, while sys.intern is still the builtin, keeps one
    # pytest process able to hold both, as the product never has to (they live in different
    # processes there).
    import torch._dynamo  # noqa: F401

from pathlib import Path

from ansible.plugins.loader import init_plugin_loader

# forja's plugins are the collection forja.gpu: tests import and load them as Ansible does
# (ansible_collections.forja.gpu..., filter_loader.get("forja.gpu.forja_hourly_rate")), from the
# clone's link collections/ansible_collections/forja/gpu, the path ansible.cfg names first.
init_plugin_loader([str(Path(__file__).resolve().parents[1] / "collections")])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip host tests only where they cannot run at all (not root, tools missing), saying why.

    In CI (root, tools installed by `make setup`) nothing is skipped; set FORJA_REQUIRE_HOSTS=1
    to turn a would-be skip into a failure.
    """
    missing = [t for t in ("systemd-nspawn", "debootstrap", "nft", "ip") if shutil.which(t) is None]
    reason = ""
    if os.geteuid() != 0:
        reason = "test hosts need root"
    elif missing:
        reason = f"test hosts need {', '.join(missing)} (run `make setup`)"
    if not reason:
        return
    if os.environ.get("FORJA_REQUIRE_HOSTS") == "1" or os.environ.get("CI") == "true":
        raise pytest.UsageError(f"real test hosts are required here but unavailable: {reason}")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "hosts" in item.keywords:
            item.add_marker(skip)
