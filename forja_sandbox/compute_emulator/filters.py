"""The `filter` query parameter of Compute list methods.

Two grammars exist and cannot be mixed in one expression, as on the real API:
- AIP-160 comparisons: `status = RUNNING`, `name != "a*"`, `labels.env = prod`, `labels.env:*`,
  `creationTimestamp > "2026-01-01"`, joined by AND / OR / NOT, parentheses and juxtaposition
  (`(status = RUNNING) (labels.env = prod)` means AND);
- the older regular-expression form: `name eq ^gpu-.*`, `status ne TERMINATED`, full-match RE2.
Fields are dotted paths into the resource; a literal without "/" compared with a URL-valued
field (zone, machineType) matches the URL's last segment, as `zone = us-east1-d` does in gcloud.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import re
from collections.abc import Callable, Iterable
from typing import Any

from .errors import invalid_field

Predicate = Callable[[dict[str, Any]], bool]
_COMPARATORS = ("!=", ">=", "<=", "=", ">", "<", ":")
_WORD_OPS = ("eq", "ne")
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


class FilterError(ValueError):
    """The expression cannot be parsed."""


@functools.lru_cache(maxsize=512)
def compile_filter(expression: str) -> Predicate:
    """Parse a filter once into a predicate; a bad expression is a 400 naming `filter`."""
    if not expression.strip():
        return lambda _resource: True
    try:
        parser = _Parser(expression)
        predicate = parser.parse()
    except FilterError as exc:
        raise invalid_field("filter", expression, f"Invalid list filter expression: {exc}") from None
    return predicate


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.forms: set[str] = set()

    # -- lexical helpers ---------------------------------------------------------------------
    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def _peek_word(self) -> str:
        self._skip()
        match = re.compile(r"[A-Za-z]+(?=[\s(]|$)").match(self.text, self.pos)
        return match.group(0) if match else ""

    def _at_end(self) -> bool:
        self._skip()
        return self.pos >= len(self.text)

    # -- grammar -----------------------------------------------------------------------------
    def parse(self) -> Predicate:
        predicate = self._or()
        if not self._at_end():
            raise FilterError(f"unexpected text at position {self.pos}: {self.text[self.pos :]!r}")
        if len(self.forms) > 1:
            raise FilterError("cannot mix the 'eq'/'ne' regular-expression form with '=' comparisons")
        return predicate

    def _or(self) -> Predicate:
        parts = [self._and()]
        while self._peek_word() == "OR":
            self.pos += 2
            parts.append(self._and())
        return _joined(parts, any)

    def _and(self) -> Predicate:
        parts = [self._unary()]
        while not self._at_end() and self.text[self.pos] != ")" and self._peek_word() != "OR":
            if self._peek_word() == "AND":
                self.pos += 3
            parts.append(self._unary())
        return _joined(parts, all)

    def _unary(self) -> Predicate:
        self._skip()
        if self._peek_word() == "NOT" or self.text.startswith("-", self.pos):
            self.pos += 3 if self._peek_word() == "NOT" else 1
            inner = self._unary()
            return lambda r: not inner(r)
        if self.text.startswith("(", self.pos):
            self.pos += 1
            inner = self._or()
            self._skip()
            if not self.text.startswith(")", self.pos):
                raise FilterError("missing ')'")
            self.pos += 1
            return inner
        return self._comparison()

    def _comparison(self) -> Predicate:
        self._skip()
        match = _FIELD.match(self.text, self.pos)
        if not match:
            raise FilterError(f"expected a field name at position {self.pos}")
        field = match.group(0)
        self.pos = match.end()
        self._skip()
        op = self._operator()
        value = self._value(regex=op in _WORD_OPS)
        self.forms.add("regex" if op in _WORD_OPS else "aip")
        return _comparison(field, op, value)

    def _operator(self) -> str:
        for word in _WORD_OPS:
            if re.compile(rf"{word}\s").match(self.text, self.pos):
                self.pos += len(word)
                return word
        for op in _COMPARATORS:
            if self.text.startswith(op, self.pos):
                self.pos += len(op)
                return op
        raise FilterError(f"expected an operator (=, !=, >, <, >=, <=, :, eq, ne) at position {self.pos}")

    def _value(self, regex: bool) -> str:
        self._skip()
        if self.pos >= len(self.text):
            raise FilterError("missing value")
        quote = self.text[self.pos]
        if quote in "\"'":
            end = self.text.find(quote, self.pos + 1)
            if end < 0:
                raise FilterError("unterminated quoted value")
            value = self.text[self.pos + 1 : end]
            self.pos = end + 1
            return value
        start = self.pos
        while self.pos < len(self.text) and not self.text[self.pos].isspace():
            self.pos += 1
        value = self.text[start : self.pos]
        # A bare value may be followed by the ')' closing the enclosing group: give back the
        # closing parentheses the value itself did not open (regexes may hold groups).
        excess = value.count(")") - (value.count("(") if regex else 0)
        while excess > 0 and value.endswith(")"):
            value = value[:-1]
            self.pos -= 1
            excess -= 1
        if not value:
            raise FilterError("missing value")
        return value


# ---------------------------------------------------------------------------------------------
# Evaluation


def _joined(parts: list[Predicate], combine: Callable[[Iterable[bool]], bool]) -> Predicate:
    """`parts` joined by OR (`combine`: any) or AND (all); one part is itself."""
    if len(parts) == 1:
        return parts[0]
    return lambda r: combine(p(r) for p in parts)


def _lookup(resource: Any, path: list[str]) -> list[Any]:
    """All values at a dotted path; lists fan out, so `disks.type = SCRATCH` means "any disk"."""
    values = [resource]
    for key in path:
        nxt: list[Any] = []
        for value in values:
            if isinstance(value, list):
                nxt.extend(item.get(key) for item in value if isinstance(item, dict) and key in item)
            elif isinstance(value, dict) and key in value:
                nxt.append(value[key])
        values = nxt
    flat: list[Any] = []
    for value in values:
        flat.extend(value if isinstance(value, list) else [value])
    return flat


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _matcher(literal: str) -> Callable[[Any], bool]:
    """Equality with `*` wildcards, precompiled once per comparison (filters run per instance)."""
    if "*" in literal:
        pattern = re.compile(fnmatch.translate(literal))

        def test(text: str) -> bool:
            return pattern.match(text) is not None
    else:
        test = literal.__eq__
    strip_url = "/" not in literal

    def match(actual: Any) -> bool:
        text = actual if isinstance(actual, str) else _text(actual)
        if strip_url and text.startswith("http") and "/" in text:
            text = text.rsplit("/", 1)[1]
        return bool(test(text))

    return match


def _getter(path: list[str]) -> Callable[[dict[str, Any]], Any]:
    """Fast paths for `status` and `labels.env`, the general walk for anything deeper."""
    if len(path) == 1:
        key = path[0]

        def get_one(resource: dict[str, Any]) -> Any:
            value = resource.get(key)
            if value is None:
                return ()
            return value if isinstance(value, list) else (value,)

        return get_one
    if len(path) == 2:
        outer, inner = path

        def get_two(resource: dict[str, Any]) -> Any:
            value = resource.get(outer)
            if isinstance(value, dict):
                found = value.get(inner)
                if found is None:
                    return ()
                return found if isinstance(found, list) else (found,)
            return _lookup(resource, path) if isinstance(value, list) else ()

        return get_two
    return lambda resource: _lookup(resource, path)


def _ordered(actual: Any, literal: str, op: str) -> bool:
    left: Any = _text(actual)
    right: Any = literal
    with contextlib.suppress(ValueError):
        left, right = float(left), float(right)
    return {">": left > right, "<": left < right, ">=": left >= right, "<=": left <= right}[op]


def _comparison(field: str, op: str, literal: str) -> Predicate:
    values = _getter(field.split("."))
    if op in _WORD_OPS:
        try:
            pattern = re.compile(literal)
        except re.error as exc:
            raise FilterError(f"bad regular expression {literal!r}: {exc}") from None

        def matches(r: dict[str, Any]) -> bool:
            return any(pattern.fullmatch(_text(v)) for v in values(r))

        return matches if op == "eq" else (lambda r: not matches(r))
    if op == ":" and literal == "*":
        return lambda r: any(v not in (None, "") for v in values(r))
    if op in ("=", ":", "!="):
        match = _matcher(literal)
        if op == "!=":
            return lambda r: not any(match(v) for v in values(r))
        return lambda r: any(match(v) for v in values(r))
    return lambda r: any(_ordered(v, literal, op) for v in values(r))
