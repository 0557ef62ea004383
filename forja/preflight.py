"""`forja check`: whether the project can take the GPU VM, asked before a cent is spent.

Why a feature of its own: a new Google Cloud project has no GPU quota, Compute Engine off and
nobody holding the IAP role, and each would otherwise surface as a failed `forja up`, one per run.
The checks themselves are the collection's (the gcp_gpu_preflight module, run by the gcp_instance
role's `check` entry point through playbooks/check.yml), so `ansible-playbook` users get the same
ones; this module runs that play, reads the published findings (forja/contract.py) and turns them
into a report, and `forja up` into CheckFailed when one blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forja import contract, errors
from forja.contract import PreflightReport
from forja.session import Session

#: How a finding's status reads in the report (and sorts: what blocks first).
STATUS_WORDS = {"fail": "FAIL", "warn": "warn", "ok": "ok", "skip": "-"}


def check(
    session: Session, vertex: bool = False, extravars: Mapping[str, Any] | None = None
) -> PreflightReport:
    """Check the project for the VM that `forja up` would make, creating nothing.

    Asks Google, read-only: the credentials and whose they are, the project and its billing, the
    APIs forja needs (Compute Engine; IAP for the iap SSH path; Cloud Storage with a bucket; Vertex
    AI when asked), the permissions, each zone's machine type, the image, the region's GPU, CPU
    and disk quota and the project's GPUS_ALL_REGIONS, this machine's SSH key and IAP command, and
    the price. For a Spot VM it also asks Google's capacity advice, and warns (never blocks) when
    even the best zone's obtainability is below 0.4, suggesting a Flex-start VM instead
    (gcp_instance_provisioning_model: flex_start). Every problem comes with its fix; nothing is
    created or changed. `forja up` runs the
    same check first and stops when something blocks.
    """
    result = session.run("check.yml", {**(extravars or {}), "forja_check_vertex": vertex}, check=False)
    report = contract.read_stats(result.artifact_data).preflight
    if report is None:  # the play stopped before the checks reported (bad options, API unreachable)
        result.raise_for_status()
        raise errors.ForjaError("the check published no findings; run it with ansible-playbook -v to see why")
    return report


def raise_if_blocking(report: PreflightReport | None) -> None:
    """CheckFailed naming each blocking finding and its fix; nothing when none blocks."""
    if report is not None and report.blocking:
        raise errors.CheckFailed(report, report.problems)
