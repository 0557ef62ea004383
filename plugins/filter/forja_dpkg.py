# Copyright: forja contributors
# Apache-2.0
"""Which Debian packages are installed, asked of dpkg-query, for the roles that act on the answer.

dpkg-query answers in a tenth of a second; the apt module opens the whole package cache (about 2 s
on a host with Ubuntu's lists), and dpkg_selections can only hold what is installed. The query's
format and the parsing of its lines live in module_utils/forja_dpkg.py, which the host_state module
uses too, so that the roles cannot disagree on what "installed" means.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.forja.gpu.plugins.module_utils.forja_dpkg import dpkg_installed, dpkg_query


class FilterModule:
    """forja's dpkg filters."""

    def filters(self) -> dict[str, Any]:
        return {"forja_dpkg_query": dpkg_query, "forja_dpkg_installed": dpkg_installed}
