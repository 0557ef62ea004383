"""The dashboard's one vendored library, uPlot, pinned here; `python -m forja.ui.vendor` refreshes it.

Why uPlot: a small (about 50 KB), well-kept MIT chart library made for time series that grow, which
is what live metrics are; it draws on a canvas and needs no other package. Why vendored: the page
must work with no internet (a laptop on a train, a controller behind a proxy), so its files ship in
forja (``static/vendor/uplot/``) with their licence, and the page loads nothing from elsewhere.

Refresh (or move the pin): edit VERSION and INTEGRITY (``npm view uplot@X dist.integrity``), then
run ``python -m forja.ui.vendor``: npm's own client fetches the package from the npm registry and
checks it, this module checks the tarball's integrity against INTEGRITY again, and copies FILES.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "uplot"
VERSION = "1.6.32"
#: The npm registry's `dist.integrity` of that version (Subresource Integrity form, sha512).
INTEGRITY = "sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
#: What the page uses, from the package tarball, and the licence that must go with it.
FILES = ("package/dist/uPlot.iife.min.js", "package/dist/uPlot.min.css", "package/LICENSE")
TARGET = Path(__file__).with_name("static") / "vendor" / "uplot"


def integrity(data: bytes) -> str:
    """The Subresource Integrity string of `data` (what npm's registry publishes)."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def refresh(target: Path = TARGET) -> list[Path]:
    """Fetch PACKAGE@VERSION with npm, check it against INTEGRITY, copy FILES (and VERSION) to `target`."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(["npm", "pack", f"{PACKAGE}@{VERSION}", "--silent"], cwd=tmp, check=True,
                              capture_output=True, text=True)  # fmt: skip
        tarball = Path(tmp) / done.stdout.strip().splitlines()[-1]
        found = integrity(tarball.read_bytes())
        if found != INTEGRITY:
            raise SystemExit(f"{tarball.name}: integrity {found} is not the pinned {INTEGRITY}")
        target.mkdir(parents=True, exist_ok=True)
        written = []
        with tarfile.open(tarball) as archive:
            for name in FILES:
                member = archive.extractfile(name)
                if member is None:
                    raise SystemExit(f"{tarball.name} has no {name}")
                path = target / Path(name).name
                with open(path, "wb") as out:
                    shutil.copyfileobj(member, out)
                written.append(path)
        (target / "VERSION").write_text(f"{PACKAGE}@{VERSION} {INTEGRITY}\n")
        return [*written, target / "VERSION"]


if __name__ == "__main__":
    for path in refresh():
        print(path)
    sys.exit(0)
