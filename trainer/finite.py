"""Non-finite numbers (NaN, +Inf, -Inf): kept out of the run's JSON files and out of exported weights.

Why one module: a diverged run produces NaN losses, and ``json.dumps`` writes them as the bare
tokens ``NaN`` and ``Infinity``, which are not JSON: jq, browsers and most JSON libraries refuse
the whole file, so one bad step broke metrics.jsonl, summary.json and the dashboard for the run.
Every writer of the run's JSON goes through :func:`dumps`, which writes such a number as ``null``
and names it under :data:`FLAG` (``{"loss": null, "nonfinite": {"loss": "nan"}}``): one way,
everywhere, and a reader can still tell "not measured" (null, no flag) from "measured NaN".

The weights side (:func:`nonfinite_tensors`) reads a safetensors file without torch or numpy,
so the controller (``forja model push``, which has neither) refuses a model whose weights are
NaN or infinite, as ``load_model`` does on a machine with torch.

Standard library only: forja imports it from the product install.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

#: The key under which a record names its non-finite fields: field path -> "nan", "inf" or "-inf".
FLAG = "nonfinite"


def word(value: float) -> str:
    """How a non-finite float is named in :data:`FLAG`: ``nan``, ``inf`` or ``-inf``."""
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _value(value: Any, found: dict[str, str], path: str) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        found[path] = word(value)
        return None
    if isinstance(value, Mapping):
        return finite_record(value)
    if isinstance(value, list | tuple):
        return [_value(v, found, f"{path}.{i}") for i, v in enumerate(value)]
    return value


def finite_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a JSON object with every non-finite number as null, each named under :data:`FLAG` of
    the object that holds it (``{"loss": null, "nonfinite": {"loss": "nan"}}``; in a list,
    ``"points.3"``). Nested objects get flags of their own; a flag the record carries is kept."""
    carried = record.get(FLAG)
    found: dict[str, str] = dict(carried) if isinstance(carried, Mapping) else {}
    cleaned = {k: _value(v, found, str(k)) for k, v in record.items() if k != FLAG}
    if found:
        cleaned[FLAG] = found
    return cleaned


def finite_value(value: Any) -> Any:
    """:func:`finite_record` for any JSON value: an object gets its flags, each object in a list
    its own; a bare non-finite number (no object to name it in) is null."""
    if isinstance(value, Mapping):
        return finite_record(value)
    if isinstance(value, list | tuple):
        return [finite_value(v) for v in value]
    return _value(value, {}, "")


def dumps(record: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite_value`: always valid JSON (never ``NaN`` or ``Infinity``)."""
    return json.dumps(finite_value(record), allow_nan=False, **kwargs)


# -- weights ---------------------------------------------------------------------------------------

#: safetensors dtype -> (bytes per element, the byte positions and masks that are all ones exactly
#: when the exponent is all ones: NaN or infinity). Little-endian, as safetensors stores them.
#: F8_E4M3 (e4m3fn) has no infinity; its NaN is S.1111.111.
_EXPONENT: dict[str, tuple[int, tuple[tuple[int, int], ...]]] = {
    "F64": (8, ((7, 0x7F), (6, 0xF0))),
    "F32": (4, ((3, 0x7F), (2, 0x80))),
    "BF16": (2, ((1, 0x7F), (0, 0x80))),
    "F16": (2, ((1, 0x7C),)),
    "F8_E5M2": (1, ((0, 0x7C),)),
    "F8_E4M3": (1, ((0, 0x7F),)),
}
_CHUNK = 64 << 20


def _flags(mask: int) -> bytes:
    """A 256-byte translation table: 1 where a byte has every bit of ``mask`` set, else 0."""
    return bytes(1 if byte & mask == mask else 0 for byte in range(256))


_TABLES = {mask: _flags(mask) for _, parts in _EXPONENT.values() for _, mask in parts}


def _chunk_has_nonfinite(data: bytes, width: int, parts: tuple[tuple[int, int], ...]) -> bool:
    """Whether any element of ``data`` (whole elements of ``width`` bytes) has an all-ones exponent.

    Bytes sliced by stride and translated to 0/1 flags, then ANDed as big integers: every step runs
    in C, so a 500 MB file is checked in about a second with neither torch nor numpy.
    """
    combined = -1
    for offset, mask in parts:
        flags = data[offset::width].translate(_TABLES[mask])
        if b"\x01" not in flags:
            return False
        combined &= int.from_bytes(flags, "little")
        if not combined:
            return False
    return combined != 0


def _header(handle: BinaryIO, path: Path) -> tuple[dict[str, Any], int]:
    raw = handle.read(8)
    if len(raw) != 8:
        raise ValueError(f"{path} is not a safetensors file (shorter than its 8-byte header length)")
    (size,) = struct.unpack("<Q", raw)
    try:
        header = json.loads(handle.read(size))
    except ValueError as exc:
        raise ValueError(f"{path} is not a safetensors file (its header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a safetensors file (its header is not an object)")
    return header, 8 + size


def _tensors(header: Mapping[str, Any]) -> Iterator[tuple[str, str, int, int]]:
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, Mapping):
            continue
        begin, end = entry.get("data_offsets", (0, 0))
        yield name, str(entry.get("dtype")), int(begin), int(end)


def nonfinite_tensors(path: str | Path) -> list[str]:
    """The names of the tensors in a safetensors file with any NaN or infinite element (file order).

    Integer and boolean tensors cannot hold either and are skipped.
    """
    path = Path(path)
    bad: list[str] = []
    with open(path, "rb") as handle:
        header, data_start = _header(handle, path)
        for name, dtype, begin, end in sorted(_tensors(header), key=lambda t: t[2]):
            if dtype not in _EXPONENT:
                continue
            width, parts = _EXPONENT[dtype]
            handle.seek(data_start + begin)
            left = end - begin
            step = _CHUNK - _CHUNK % width
            while left > 0:
                data = handle.read(min(step, left))
                if not data:
                    break
                left -= len(data)
                if _chunk_has_nonfinite(data[: len(data) - len(data) % width], width, parts):
                    bad.append(name)
                    break
    return bad


def describe_tensors(names: list[str], limit: int = 5) -> str:
    """``a, b, c and 4 more``: the tensors a refusal names."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
