"""Google's own Compute v1 discovery document as the contract for requests.

The emulator validates paths, query parameters and request bodies against the document that
ships inside the pinned `google-api-python-client` wheel, so a field name, type or enum value
that forja gets wrong fails here exactly as it would fail against the real API, instead of
passing against a hand-written copy of the schema that drifts.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import Any

from .errors import ApiError, invalid_field, required_field, unknown_field

# Query parameters the real API accepts and ignores although this revision of v1 does not
# document them (still documented in beta; older clients send them).
EXTRA_QUERY_PARAMS = {"returnPartialSuccess": {"type": "boolean", "location": "query"}}
MAX_RESULTS_LIMIT = 500


def discovery_path() -> Path:
    """The compute.v1.json file of the installed (pinned) google-api-python-client."""
    import googleapiclient

    return Path(googleapiclient.__file__).parent / "discovery_cache" / "documents" / "compute.v1.json"


@functools.lru_cache(maxsize=1)
def discovery() -> dict[str, Any]:
    with discovery_path().open(encoding="utf-8") as handle:
        return json.load(handle)


def revision() -> str:
    return str(discovery()["revision"])


@dataclasses.dataclass(frozen=True)
class Method:
    """One REST method of the discovery document (`compute.instances.insert`, ...)."""

    id: str
    http_method: str
    flat_path: str
    parameters: dict[str, dict[str, Any]]
    request_schema: str | None
    # The OAuth scopes that allow this method (reads also allow `compute.readonly`).
    scopes: frozenset[str] = frozenset()

    @property
    def short_id(self) -> str:
        """`instances.insert`: the name tests and fault rules use."""
        return self.id.removeprefix("compute.")


@functools.lru_cache(maxsize=1)
def methods() -> dict[str, Method]:
    found: dict[str, Method] = {}

    def walk(resources: dict[str, Any]) -> None:
        for resource in resources.values():
            for method in resource.get("methods", {}).values():
                found[method["id"]] = Method(
                    id=method["id"],
                    http_method=method["httpMethod"],
                    flat_path=method.get("flatPath", method["path"]),
                    parameters=method.get("parameters", {}),
                    request_schema=(method.get("request") or {}).get("$ref"),
                    scopes=frozenset(method.get("scopes", ())),
                )
            walk(resource.get("resources", {}))

    walk(discovery()["resources"])
    return found


def schema(name: str) -> dict[str, Any]:
    return discovery()["schemas"][name]


# ---------------------------------------------------------------------------------------------
# Query parameters


def parse_query(method: Method, query: dict[str, list[str]]) -> dict[str, Any]:
    """Type-check the query string against the method; unknown names fail like Google's ESF."""
    known = {**discovery()["parameters"], **EXTRA_QUERY_PARAMS, **method.parameters}
    parsed: dict[str, Any] = {}
    for name, values in query.items():
        spec = known.get(name)
        if spec is None or spec.get("location") == "path":
            raise ApiError(
                400,
                f'Invalid JSON payload received. Unknown name "{name}": Cannot bind query parameter. '
                f"Field '{name}' could not be found in request message.",
                "invalid",
            )
        parsed[name] = _query_value(name, values[-1], spec)
    if "maxResults" in parsed and parsed["maxResults"] > MAX_RESULTS_LIMIT:
        raise invalid_field("maxResults", str(parsed["maxResults"]), "Must be less than or equal to 500")
    return parsed


def _query_value(name: str, raw: str, spec: dict[str, Any]) -> Any:
    kind = spec.get("type", "string")
    if kind == "boolean":
        if raw.lower() not in ("true", "false", "1", "0"):
            raise invalid_field(name, raw, "Expected a boolean (true or false).")
        return raw.lower() in ("true", "1")
    if kind == "integer":
        try:
            value = int(raw)
        except ValueError:
            raise invalid_field(name, raw, "Expected an integer.") from None
        if "minimum" in spec and value < int(spec["minimum"]):
            raise invalid_field(name, raw, f"Must be greater than or equal to {spec['minimum']}")
        if "maximum" in spec and value > int(spec["maximum"]):
            raise invalid_field(name, raw, f"Must be less than or equal to {spec['maximum']}")
        return value
    if "enum" in spec and raw not in spec["enum"]:
        raise invalid_field(name, raw, f"Value must be one of {spec['enum']}.")
    return raw


# ---------------------------------------------------------------------------------------------
# Request bodies


def validate_body(method: Method, body: Any) -> None:
    """Check a request body against the method's request schema, naming the failing field path.

    Paths read like Google's: `resource.scheduling.provisioningModel`, `resource.disks[0].type`.
    Output-only fields are accepted (the real API ignores them on input).
    """
    if method.request_schema is None:
        return
    if not isinstance(body, dict):
        raise ApiError(400, "Invalid JSON payload received. Expected an object for 'resource'.", "parseError")
    _check(body, {"$ref": method.request_schema}, "resource", method.id)


def _resolve(spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in spec:
        spec = schema(spec["$ref"])
    return spec


def _check(value: Any, spec: dict[str, Any], path: str, method_id: str) -> None:
    if value is None:
        return
    spec = _resolve(spec)
    kind = spec.get("type", "any")
    if kind == "object":
        _check_object(value, spec, path, method_id)
    elif kind == "array":
        if not isinstance(value, list):
            raise invalid_field(path, value, "Expected a list.")
        for index, item in enumerate(value):
            if item is None:  # protobuf's JSON parser refuses it, so Google's front end does
                raise invalid_field(f"{path}[{index}]", item, "Repeated field elements cannot be null.")
            _check(item, spec.get("items", {}), f"{path}[{index}]", method_id)
    elif kind == "string":
        _check_string(value, spec, path)
    elif kind == "integer":
        _check_integer(value, spec, path)
    elif kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise invalid_field(path, value, "Expected a number.")
        try:
            float(value)
        except ValueError:
            raise invalid_field(path, value, "Expected a number.") from None
    elif kind == "boolean" and not isinstance(value, bool):
        raise invalid_field(path, value, "Expected a boolean.")


def _check_object(value: Any, spec: dict[str, Any], path: str, method_id: str) -> None:
    if not isinstance(value, dict):
        raise invalid_field(path, value, "Expected an object.")
    properties = spec.get("properties")
    extra = spec.get("additionalProperties")
    for key, item in value.items():
        if properties and key in properties:
            _check(item, properties[key], f"{path}.{key}", method_id)
        elif extra is not None:
            _check(item, extra, f"{path}.{key}", method_id)
        elif properties is not None:
            raise unknown_field(key, path)
    for key, prop in (properties or {}).items():
        required = (prop.get("annotations") or {}).get("required", [])
        if method_id in required and value.get(key) in (None, ""):
            raise required_field(f"{path}.{key}")


def _check_string(value: Any, spec: dict[str, Any], path: str) -> None:
    fmt = spec.get("format")
    if fmt in ("int64", "uint64"):
        if isinstance(value, bool) or not isinstance(value, (int, str)) or not _is_integer(value):
            raise invalid_field(path, value, "Expected an integer (int64, may be given as a string).")
        if fmt == "uint64" and int(value) < 0:
            raise invalid_field(path, value, "Expected a non-negative integer.")
        return
    if not isinstance(value, str):
        raise invalid_field(path, value, "Expected a string.")
    if "enum" in spec and value not in spec["enum"]:
        choices = ", ".join(v for v in spec["enum"] if not v.endswith("_UNSPECIFIED"))
        raise invalid_field(path, value, f"Value must be one of [{choices}].")
    pattern = spec.get("pattern")
    if pattern and not _full_match(pattern, value):
        raise invalid_field(path, value, f"Must be a match of regex '{pattern}'")


def _check_integer(value: Any, spec: dict[str, Any], path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not _is_integer(value):
        raise invalid_field(path, value, "Expected an integer.")
    number = int(value)
    if "minimum" in spec and number < int(spec["minimum"]):
        raise invalid_field(path, value, f"Must be greater than or equal to {spec['minimum']}")
    if "maximum" in spec and number > int(spec["maximum"]):
        raise invalid_field(path, value, f"Must be less than or equal to {spec['maximum']}")
    if spec.get("format") in ("uint32", "uint64") and number < 0:
        raise invalid_field(path, value, "Expected a non-negative integer.")


def _is_integer(value: int | str) -> bool:
    if isinstance(value, int):
        return True
    return re.fullmatch(r"-?\d+", value) is not None


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _full_match(pattern: str, value: str) -> bool:
    compiled = _compiled(pattern)
    return compiled is None or compiled.fullmatch(value) is not None
