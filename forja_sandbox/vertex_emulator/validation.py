"""Read a CustomJob request body with Google's own types, then check what Vertex checks.

The body is parsed by ``google.cloud.aiplatform_v1.types.CustomJob`` (proto-plus over the real
aiplatform v1 protos, unknown fields refused), so the emulator accepts exactly the fields and
types Google's API defines, not a hand-written schema. What the protos cannot say (a required
field, a worker pool that runs nothing, a GPU the machine or region lacks) is checked after, and
reported the way Vertex does: ``List of found errors:`` with each field's path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from google.cloud.aiplatform_v1.types import CustomJob
from google.protobuf import json_format

from ..http_limits import parse_json
from . import catalog
from .errors import VertexError, bad_payload, found_errors

#: The request field that holds the body of CreateCustomJob (Google names paths from it).
BODY_FIELD = "custom_job"
#: google-cloud-storage's own setting for an emulator's endpoint: where gs:// packages are read.
STORAGE_ENV = "STORAGE_EMULATOR_HOST"
_UNKNOWN = re.compile(r'has no field named "(?P<name>[^"]+)" at "CustomJob(?P<path>[^"]*)"')
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def snake_path(path: str) -> str:
    """``.jobSpec.workerPoolSpecs[0]`` -> ``custom_job.job_spec.worker_pool_specs[0]``."""
    return BODY_FIELD + _CAMEL.sub("_", path).lower()


def parse_custom_job(raw: bytes) -> CustomJob:
    """The body as a CustomJob, or the 400 Google's JSON transcoder answers for it."""
    try:
        text = raw.decode("utf-8")
        parse_json(raw)  # within the emulators' limits (forja_sandbox/http_limits.py)
    except ValueError as exc:  # not UTF-8, not JSON, or too deep / too long
        raise bad_payload(f"Unexpected token. ({exc})", BODY_FIELD) from exc
    try:
        return CustomJob.from_json(text, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        first = str(exc).splitlines()[0]
        unknown = _UNKNOWN.search(first)
        if unknown:
            at = snake_path(unknown["path"])
            message = f"Unknown name \"{unknown['name']}\" at '{at}': Cannot find field."
            raise bad_payload(message, at) from exc
        raise bad_payload(first, BODY_FIELD) from exc


def check_custom_job(job: CustomJob, region: str) -> None:
    """Refuse what Vertex refuses at create time; every problem found is reported at once."""
    problems: list[tuple[str, str]] = []
    if not job.display_name:
        problems.append(("display_name", "Required field is not set."))
    pools = list(job.job_spec.worker_pool_specs)
    if not pools:
        problems.append(("job_spec.worker_pool_specs", "At least one worker pool should be specified."))
    for i, pool in enumerate(pools):
        where = f"job_spec.worker_pool_specs[{i}]"
        if i == 0 and pool.replica_count < 1:
            problems.append((f"{where}.replica_count", "The first worker pool must have one replica."))
        if pool.replica_count == 0:
            continue  # an empty pool (a placeholder before pool 2 or 3) runs nothing and is not checked
        has_container = "container_spec" in pool
        has_package = "python_package_spec" in pool
        if has_container == has_package:
            problems.append((f"{where}.task", "One of container_spec or python_package_spec is required."))
        if has_container and not pool.container_spec.image_uri:
            problems.append((f"{where}.container_spec.image_uri", "Required field is not set."))
        if has_package:
            spec = pool.python_package_spec
            for name in ("executor_image_uri", "python_module"):
                if not getattr(spec, name):
                    problems.append((f"{where}.python_package_spec.{name}", "Required field is not set."))
            if not spec.package_uris:
                problems.append((f"{where}.python_package_spec.package_uris", "Required field is not set."))
        machine = pool.machine_spec
        accelerator = machine.accelerator_type.name if machine.accelerator_type else None
        if not machine.machine_type:
            problems.append((f"{where}.machine_spec.machine_type", "Required field is not set."))
            continue
        if bool(accelerator) != bool(machine.accelerator_count):
            problems.append(
                (
                    f"{where}.machine_spec.accelerator_type",
                    "Both `accelerator_type` and `accelerator_count` should be specified or none.",
                )
            )
            continue
        try:
            catalog.check_machine(
                region, f"{where}.machine_spec", machine.machine_type, accelerator, machine.accelerator_count
            )
        except catalog.MachineRefused as exc:
            raise VertexError(400, exc.message, violations=[(exc.field, exc.message)]) from exc
    if problems:
        raise found_errors(problems)


def check_packages(job: CustomJob) -> None:
    """A package is a ``gs://BUCKET/OBJECT`` of the sandbox's Cloud Storage (STORAGE_EMULATOR_HOST,
    google-cloud-storage's own setting) or a path on this machine; anything else, a missing path,
    or gs:// without a storage emulator is refused at create time, naming the field, rather than
    failing the job later. A gs:// object that is not there fails the job when it starts (Vertex's
    order: its replicas fetch the packages)."""
    problems = []
    for i, pool in enumerate(job.job_spec.worker_pool_specs):
        if "python_package_spec" not in pool:
            continue
        for j, uri in enumerate(pool.python_package_spec.package_uris):
            where = f"job_spec.worker_pool_specs[{i}].python_package_spec.package_uris[{j}]"
            path = uri.removeprefix("file://")
            if uri.startswith("gs://"):
                bucket, _, name = uri.removeprefix("gs://").partition("/")
                if not bucket or not name or name.endswith("/"):
                    problems.append((where, f"{uri}: give a package object, gs://BUCKET/PATH/NAME.tar.gz."))
                elif not os.environ.get(STORAGE_ENV):
                    why = f"gs:// packages come from the sandbox's Cloud Storage; set {STORAGE_ENV}"
                    problems.append((where, f"{uri}: {why}."))
            elif "://" in path:
                problems.append(
                    (where, f"{uri}: the sandbox runs gs:// or local packages; give one of those.")
                )
            elif not Path(path).exists():
                problems.append((where, f"{uri}: no such file or folder on this machine."))
    if problems:
        raise found_errors(problems)
