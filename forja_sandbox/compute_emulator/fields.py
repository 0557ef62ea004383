"""The standard `fields` parameter: partial responses (`items/*/instances(name,status)`).

Listing thousands of instances is cheaper when a client asks only for what it uses; Google
honours `fields` on every method, so the emulator does too. Grammar: comma-separated
selections; `a/b` descends, `a(b,c)` selects several sub-fields, `*` matches every key of a
map (the zone keys of an aggregated listing). Fields absent from the resource are omitted.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from .errors import ApiError

Tree = dict[str, Any]  # field name -> subtree, None: the whole value
_TOKEN = re.compile(r"\s*([A-Za-z0-9_$.\-*]+|[(),/])")


@functools.lru_cache(maxsize=256)
def parse_fields(expression: str) -> Tree:
    tokens = _tokens(expression)
    tree, position = _selections(tokens, 0)
    if position != len(tokens):
        raise _invalid(expression)
    return tree


def project(value: Any, tree: Tree | None) -> Any:
    """Keep only the selected parts of a response."""
    if tree is None:
        return value
    if isinstance(value, list):
        return [project(item, tree) for item in value]
    if not isinstance(value, dict):
        return value
    result: dict[str, Any] = {}
    for key, subtree in tree.items():
        if key == "*":
            for name, item in value.items():
                result[name] = project(item, subtree)
        elif key in value:
            result[key] = project(value[key], subtree)
    return result


def _invalid(expression: str) -> ApiError:
    return ApiError(400, f"Invalid field selection {expression}", "invalidParameter")


def _tokens(expression: str) -> list[str]:
    tokens: list[str] = []
    position = 0
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if not match:
            if expression[position:].strip():
                raise _invalid(expression)
            break
        tokens.append(match.group(1))
        position = match.end()
    if not tokens:
        raise _invalid(expression)
    return tokens


def _selections(tokens: list[str], position: int) -> tuple[Tree, int]:
    tree: Tree = {}
    while True:
        path, position = _path(tokens, position)
        subtree: Tree | None = None
        if position < len(tokens) and tokens[position] == "(":
            subtree, position = _selections(tokens, position + 1)
            if position >= len(tokens) or tokens[position] != ")":
                raise _invalid("".join(tokens))
            position += 1
        _merge(tree, path, subtree)
        if position < len(tokens) and tokens[position] == ",":
            position += 1
            continue
        return tree, position


def _path(tokens: list[str], position: int) -> tuple[list[str], int]:
    names: list[str] = []
    while True:
        if position >= len(tokens) or tokens[position] in "(),/":
            raise _invalid("".join(tokens))
        names.append(tokens[position])
        position += 1
        if position < len(tokens) and tokens[position] == "/":
            position += 1
            continue
        return names, position


def _merge(tree: Tree, path: list[str], leaf: Tree | None) -> None:
    node = tree
    for name in path[:-1]:
        child = node.get(name, {})
        if child is None:  # the whole value was already selected
            return
        node = node.setdefault(name, child)
    last = path[-1]
    if leaf is None or node.get(last, {}) is None:
        node[last] = None
    else:
        existing = node.setdefault(last, {})
        for key, value in leaf.items():
            _merge(existing, [key], value)
