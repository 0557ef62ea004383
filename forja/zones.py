"""`forja zones`: the zones the VM could be made in, ranked by Google's capacity advice.

The ranking is the collection's (the gcp_gpu_zones module and plugins/module_utils/forja_gcp_advice.py,
run by the gcp_instance role's `zones` entry point through playbooks/zones.yml), so `ansible-playbook`
users and gcp_gpu_instance's stock-out fallback get the same order; this module runs that play and
reads the published ranking (forja/contract.py). The managed watcher asks it before moving a run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from forja import contract, errors
from forja.contract import ZoneReport
from forja.session import Session


def zones(
    session: Session, regions: Sequence[str] = (), extravars: Mapping[str, Any] | None = None
) -> ZoneReport:
    """Rank the zones the VM could be made in by Google's capacity advice, creating nothing.

    For the VM's machine type, GPU and provisioning model (Spot or not), each candidate zone (the
    VM's zone, its fallback zones, the other zones of their regions and of each `--region`) with:
    obtainability (0 to 1: how likely Google can give you the VM now), estimated uptime of a Spot
    VM, the 30-day Spot preemption rate, the price an hour, and whether the machine type is offered
    there. The best zone comes first: by obtainability, then uptime, then preemption rate. When the
    advisor has no answer for the project ("not available for this project", no permission, an
    error) the zones keep your order and the report says why; that is never a failure. `forja up`
    tries its fallback zones in this order, and so does a managed run's watcher when it moves.
    """
    extra: dict[str, Any] = dict(extravars or {})
    if regions:
        extra["gcp_instance_zones_regions"] = list(dict.fromkeys(regions))
    result = session.run("zones.yml", extra, check=False)
    report = contract.read_stats(result.artifact_data).zones
    if report is None:  # the play stopped before it published (bad options, credentials, API unreachable)
        result.raise_for_status()
        raise errors.ForjaError(
            "the zone ranking published nothing; run playbooks/zones.yml with -v to see why")
    return report


def ranked(session: Session, candidates: Sequence[str], extravars: Mapping[str, Any] | None = None
           ) -> tuple[list[str], ZoneReport | None]:
    """`candidates` in the advice's order (the given order when it has no signal, or the ranking
    cannot be run), and the report it came from (None when there is none)."""
    given = list(dict.fromkeys(candidates))
    if len(given) < 2:
        return given, None
    extra = {**(extravars or {}), "gcp_instance_zone": given[0], "gcp_instance_fallback_zones": given[1:]}
    try:
        report = zones(session, extravars=extra)
    except errors.ForjaError:
        return given, None
    if not report.advised:
        return given, report
    order = [z for z in report.order if z in given]
    return order + [z for z in given if z not in order], report


def scores(report: ZoneReport | None, zone_names: Sequence[str]) -> list[dict[str, Any]]:
    """What the advice said of `zone_names`, for a history event: why the watcher chose its zone."""
    if report is None:
        return []
    by_zone = {z.zone: z for z in report.zones}
    return [
        {"zone": z, "obtainability": by_zone[z].obtainability,
         "estimated_uptime_s": by_zone[z].estimated_uptime_s,
         "preemption_rate_30d": by_zone[z].preemption_rate_30d, "no_signal": by_zone[z].no_signal}
        for z in zone_names if z in by_zone
    ]
