"""The dashboard's vendored chart library is the pinned release, with its licence, and ships in the wheel."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

from forja.ui import vendor
from forja.ui.server import STATIC

REPO = Path(__file__).resolve().parents[2]


def test_the_vendored_files_are_the_pinned_release_with_its_licence() -> None:
    kept = vendor.TARGET / "VERSION"
    assert kept.read_text().split() == [f"{vendor.PACKAGE}@{vendor.VERSION}", vendor.INTEGRITY]
    for name in vendor.FILES:
        assert (vendor.TARGET / Path(name).name).stat().st_size > 0, name
    assert "MIT License" in (vendor.TARGET / "LICENSE").read_text()
    assert f"/static/vendor/uplot/{Path(vendor.FILES[0]).name}" in (STATIC / "index.html").read_text()


def test_integrity_is_the_npm_registrys_form() -> None:
    empty = "z4PhNX7vuL3xVChQ1m2AB9Yg5AULVxXcg/SpIdNs6c5H0NE8XYXysP+DGNKHfuwvY7kxvUdBeoGlODJ6+SfaPg=="
    assert vendor.integrity(b"") == f"sha512-{empty}"  # SHA-512 of nothing, as SRI writes it


def test_every_file_the_page_serves_ships_in_the_wheel() -> None:
    line = re.search(r'^"forja\.ui" = (\[.*\])$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert line, "pyproject.toml's [tool.setuptools.package-data] lists forja.ui's files"
    patterns = json.loads(line.group(1))  # a TOML array of strings is JSON too
    root = STATIC.parent
    served = [p.relative_to(root).as_posix() for p in STATIC.rglob("*") if p.is_file()]
    missing = [name for name in served if not any(fnmatch.fnmatch(name, pattern) for pattern in patterns)]
    assert served and not missing, missing
