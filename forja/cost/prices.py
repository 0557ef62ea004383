"""The price table: what a machine type, an attached GPU and a persistent disk cost.

The figures and the rules that read them live in forja's Ansible content, in standard-library-only
module_utils: the table in ``plugins/module_utils/forja_gcp_prices.json`` (dated, every figure with
its source, so a price change is a data edit) and its loader and lookups in
``plugins/module_utils/forja_cost.py``. The ``forja.gpu.forja_hourly_rate`` filter imports that file
the Ansible way, so an installed collection prices a host with no forja package beside it; forja
loads the same file by path (``forja/module_utils.py``, the one place that does) and this module
re-exports its names, so ``forja cost`` and a playbook never disagree about a rate and every caller
of ``forja.cost.prices`` keeps its imports. A user with a negotiated or newer price list still
merges their own YAML over ours (``--prices FILE`` or ``FORJA_PRICES``) without touching the code.
"""

from __future__ import annotations

from forja import machines, module_utils

machines.catalog()  # forja_cost.py's sibling, loaded first under its own name (forja/module_utils.py)
#: plugins/module_utils/forja_cost.py as forja loads it: the names below, and forja.cost.spend's rate rule.
RULES = module_utils.load("forja_cost", "forja._cost_rules")

#: forja's own table (JSON; its comments are its ``_about`` lines).
DEFAULT_TABLE = RULES.DEFAULT_TABLE
ENV_OVERRIDE: str = RULES.ENV_OVERRIDE
OVERRIDE_HINT: str = RULES.OVERRIDE_HINT

PriceError = RULES.PriceError
Rate = RULES.Rate
DiskPrice = RULES.DiskPrice
PriceTable = RULES.PriceTable
region_of = RULES.region_of
load_prices = RULES.load_prices

__all__ = ["DEFAULT_TABLE", "ENV_OVERRIDE", "OVERRIDE_HINT", "RULES", "DiskPrice", "PriceError", "PriceTable",
           "Rate", "load_prices", "region_of"]
