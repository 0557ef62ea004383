"""Paging, ordering and list bodies shared by every Compute list method.

Page tokens are opaque to clients but carry the offset and the query they belong to, so a
token replayed with another filter is refused (400) instead of silently skipping results.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from .errors import invalid_field
from .filters import compile_filter

Json = dict[str, Any]
DEFAULT_MAX_RESULTS = 500


def page_bounds(query: Json, total: int) -> tuple[int, int, str | None]:
    """(start, end, nextPageToken) of the page that `maxResults` and `pageToken` ask for."""
    limit = query.get("maxResults", DEFAULT_MAX_RESULTS) or DEFAULT_MAX_RESULTS
    bound_to = f"{query.get('filter', '')}|{query.get('orderBy', '')}"
    offset = 0
    token = query.get("pageToken")
    if token:
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
            offset = int(decoded["o"])
            if decoded["f"] != bound_to or offset < 0:
                raise ValueError
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise invalid_field(
                "pageToken", token, "Invalid page token (it belongs to another query)."
            ) from None
    end = min(offset + limit, total)
    next_token = None
    if end < total:
        next_token = base64.urlsafe_b64encode(json.dumps({"o": end, "f": bound_to}).encode()).decode()
    return offset, end, next_token


def ordered(query: Json, items: list[Any], key: Callable[[Any], Json]) -> list[Any]:
    """Apply `orderBy` (`name` or `creationTimestamp`, optionally `desc`), as the API allows."""
    order = (query.get("orderBy") or "").strip()
    if not order:
        return items
    field, _, direction = order.partition(" ")
    if field not in ("name", "creationTimestamp") or direction.strip() not in ("", "asc", "desc"):
        raise invalid_field("orderBy", order, "Supported: 'name' or 'creationTimestamp', optionally 'desc'.")
    return sorted(items, key=lambda item: str(key(item).get(field, "")), reverse=direction.strip() == "desc")


def list_response(base: str, query: Json, kind: str, list_id: str, resources: list[Json]) -> Json:
    """A `compute#xxxList` page: filtered, ordered, paged; no `items` key when empty, like Google."""
    predicate = compile_filter(query.get("filter", ""))
    matching = ordered(query, [r for r in resources if predicate(r)], lambda r: r)
    start, end, token = page_bounds(query, len(matching))
    result: Json = {"kind": kind, "id": list_id, "selfLink": f"{base}{list_id}"}
    if matching[start:end]:
        result["items"] = matching[start:end]
    if token:
        result["nextPageToken"] = token
    return result
