"""The trainer's one way to a Cloud Storage client, whose requests leave the run's randomness alone.

google-cloud-storage draws every multipart boundary from Python's global generator
(``random.randrange`` in ``google.cloud.storage._media._upload``), and google-api-core and
google-auth draw their retry jitter from it too. The checkpoint mirror uploads from its own
thread at moments set by the network, so those draws landed in the run's Python random state at
no fixed step: the state a checkpoint saved (and a resume restores for the user's own
``random`` calls) depended on upload timing, and a resume from the bucket differed from a resume
from disk. A boundary or a jitter only has to be unpredictable, not drawn from the run's stream:
the modules that draw them get a generator of their own, seeded from the OS.
"""

from __future__ import annotations

import importlib
import random
import re
from typing import Any

# Modules that call ``random.<draw>()`` on the module-level generator during requests.
DRAWING_MODULES = (
    "google.cloud.storage._media._upload",  # the multipart boundary of every small upload
    "google.api_core.retry.retry_base",  # retry jitter of reads, lists and deletes
    "google.auth._exponential_backoff",  # retry jitter of token refreshes on a VM
)


def isolate_library_randomness() -> list[str]:
    """Give each of :data:`DRAWING_MODULES` a private ``random.Random``; the modules it changed."""
    changed = []
    for name in DRAWING_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "random", None) is random:
            module.random = random.Random()  # type: ignore[attr-defined]
            changed.append(name)
    return changed


def storage_client() -> Any:
    """A ``google.cloud.storage.Client`` (``STORAGE_EMULATOR_HOST`` is honoured by the client itself).

    ImportError, as the caller's import would, when google-cloud-storage is not installed.
    """
    from google.cloud import storage

    isolate_library_randomness()
    return storage.Client()


# Cloud Storage bucket names: 3-63 characters, lower-case letters, digits, '-', '_' and '.'.
BUCKET_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


def parse_bucket_url(url: str) -> tuple[str, str]:
    """``gs://BUCKET/PREFIX`` -> (bucket, prefix without slashes); ValueError naming the fix."""
    if not url.startswith("gs://"):
        raise ValueError(f"must be gs://BUCKET or gs://BUCKET/PREFIX (got {url!r})")
    bucket, _, prefix = url[len("gs://") :].partition("/")
    if not BUCKET_NAME_RE.match(bucket) or ".." in bucket:
        raise ValueError(
            f"{bucket!r} is not a Cloud Storage bucket name (3-63 characters: lower-case letters, "
            f"digits, '-', '_', '.'; got {url!r})"
        )
    return bucket, prefix.strip("/")


def run_prefix(url: str, run: str) -> tuple[str, str]:
    """(bucket, ``PREFIX/<run>/``): one run's folder under ``gs://BUCKET/PREFIX``, which holds its
    ``checkpoints/`` and ``logs/`` (trainer/mirror.py). One home, because forja's ``--replace`` moves
    exactly what a resume would read. ValueError for a bad URL or a run name that is no folder name."""
    bucket, base = parse_bucket_url(url)
    if not run or "/" in run:
        raise ValueError(f"run name {run!r} cannot name a bucket prefix (no '/', not empty)")
    return bucket, f"{base}/{run}/" if base else f"{run}/"
