# Copyright: forja contributors
# Apache-2.0
"""What "installed" and "held" mean to forja, read from dpkg-query's Status-Abbrev.

One home for the query's format and its parsing: the forja_dpkg filters (roles that run
dpkg-query themselves) and the host_state module (which runs it on the host) read it from here, so
they cannot disagree. dpkg's state letter (the second of Status-Abbrev) is `i` for an installed
package, whatever is wanted of it, so a held package ("hi") counts as installed, as in the
nvidia_facts module; the want letter (the first) is `h` for a held one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Status-Abbrev is three letters (want, state, error; the last is a space when there is no error).
SHOW_FORMAT = "${db:Status-Abbrev} ${Package}\n"
INSTALLED = re.compile(r"^(?P<want>[a-z])i\S* +(?P<name>\S+)$")


def dpkg_query(packages: Iterable[str]) -> list[str]:
    """The dpkg-query argv that reports each of `packages` in the format `dpkg_installed` reads.

    It exits 1 when dpkg has never heard of one of them; the caller ignores that (not installed).
    """
    return ["dpkg-query", "--show", f"--showformat={SHOW_FORMAT}", *packages]


def dpkg_installed(lines: Iterable[str]) -> list[str]:
    """The names of the installed packages among dpkg_query's output lines, in their order."""
    return [match["name"] for line in lines if (match := INSTALLED.match(line))]


def dpkg_held(lines: Iterable[str]) -> list[str]:
    """The names of the installed packages that are on hold, among dpkg_query's output lines."""
    return [match["name"] for line in lines if (match := INSTALLED.match(line)) and match["want"] == "h"]
