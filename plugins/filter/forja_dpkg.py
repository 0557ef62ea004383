"""Which Debian packages are installed, asked of dpkg-query, for the roles that act on the answer.

dpkg-query answers in a tenth of a second; the apt module opens the whole package cache (about 2 s
on a host with Ubuntu's lists), and dpkg_selections can only hold what is installed. The query's
format and the parsing of its lines live together here so that the roles cannot disagree on what
"installed" means: dpkg's state letter (the second of Status-Abbrev) is `i`, whatever is wanted of
the package, so a held package ("hi") counts as installed, as in the nvidia_facts module.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# Status-Abbrev is three letters (want, state, error; the last is a space when there is no error).
SHOW_FORMAT = "${db:Status-Abbrev} ${Package}\n"
INSTALLED = re.compile(r"^[a-z]i\S* +(?P<name>\S+)$")


def dpkg_query(packages: Iterable[str]) -> list[str]:
    """The dpkg-query argv that reports each of `packages` in the format `dpkg_installed` reads.

    It exits 1 when dpkg has never heard of one of them; the caller ignores that (not installed).
    """
    return ["dpkg-query", "--show", f"--showformat={SHOW_FORMAT}", *packages]


def dpkg_installed(lines: Iterable[str]) -> list[str]:
    """The names of the installed packages among dpkg_query's output lines, in their order."""
    return [match["name"] for line in lines if (match := INSTALLED.match(line))]


class FilterModule:
    """forja's dpkg filters."""

    def filters(self) -> dict[str, Any]:
        return {"forja_dpkg_query": dpkg_query, "forja_dpkg_installed": dpkg_installed}
