"""Mitogen's `linear` strategy under forja's plugin path, for runs about twice as fast.

Opt in with `ANSIBLE_STRATEGY=mitogen_linear ansible-playbook site.yml`. Mitogen keeps one Python
interpreter per host alive for the whole play and sends it each module's code once, instead of
Ansible's new SSH session, temporary files and Python start for every task. forja re-exports
the strategy here so that ansible.cfg needs no path into the virtualenv (where `mitogen`, a pinned
dependency, installs it). bench/sandbox_bench.py measures it next to Ansible's own linear strategy.
"""

from __future__ import annotations

from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule

__all__ = ["StrategyModule"]
