# Copyright: forja contributors
# Apache-2.0
"""Shell words of a string, as ssh's options are given to Ansible (ansible_ssh_common_args).

The jupyter_colab role builds the tunnel command from the host's own connection settings, so the
tunnel takes the path Ansible takes (e.g. a ProxyCommand through IAP). Those settings are one shell
string, and a ProxyCommand holds spaces inside quotes: splitting on spaces would break it, so this
splits as a POSIX shell (and Ansible's ssh plugin) does.
"""

from __future__ import annotations

import shlex
from typing import Any


def shell_words(text: str | None) -> list[str]:
    """``"-o 'ProxyCommand=a b'"`` -> ``['-o', 'ProxyCommand=a b']``; empty or None -> ``[]``."""
    return shlex.split(str(text or ""))


class FilterModule:
    """forja's shell filter."""

    def filters(self) -> dict[str, Any]:
        return {"forja_shell_words": shell_words}
