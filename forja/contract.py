"""What forja's roles publish for Python, read typed: the one data contract between them.

Python never matches a task's display name: renaming a task for wording must not change what
forja reads. Roles hand facts over in three documented ways, and this module is their one reader.

**1. Published facts (`set_stats`), contract version 1.** ansible-runner 2.4 hands only the
*aggregate* custom stats over (`stats.custom['_run']`, the `artifact_data` of the
`playbook_on_stats` event; `per_host: true` stats never reach it), and aggregating adds numbers
and lists across hosts. So every role publishes under one key, `forja`, one dict per host, which
Ansible's aggregation merges recursively (`merge_hash`) without mixing hosts::

    forja:                              # set_stats key (per_host: false, aggregate: true)
      <inventory_hostname>:
        contract_version: 1             # CONTRACT_VERSION; a newer major is refused, not guessed
        runs:                           # trainer_run (entry points status, main/wait)
          - {forja_train_state: 1, run: ..., status: ..., last: {...}, summary: {...}, ...}
        jupyter:                        # jupyter_colab (entry points main, publish)
          port: 8888                    # the port Jupyter serves on the host's loopback
          tunnel_command: "ssh -N ..."  # shell-quoted; run on the computer with the browser
          colab_url_template: "http://localhost:8888/?token=<token>"
          token_file: /var/lib/forja/jupyter/token      # on the host
          local_token_file: ~/.config/forja/tokens/h.jupyter-token   # copy on the controller, or ""
          metrics_ports: [8890, ..., 8899]   # the runs' live metrics ports the tunnel forwards too
        instance:                       # gcp_instance (entry point observe), keyed by the VM's name
          exists: true
          zone: us-east1-d              # where it is now ("" when it exists nowhere)
          status: TERMINATED            # Compute Engine's status
          spot: true
          preempted_at: "2026-...Z"     # set only while it is stopped BECAUSE Google preempted it
          preemptions: ["2026-...Z"]    # every preemption the zone's operations still list
          cluster: team                 # a cluster's member: its cluster and rank ("" and 0 alone)
          rank: 1
        prune:                          # playbooks/prune.yml (module gcp_gpu_prune): the stopped-disk prune
          {vm: ..., action: keep, reason: ..., deleted: false, warning: ..., disk_usd_per_month: 12.0, ...}
        price_record:                   # playbooks/train.yml (filter forja_price_record): what prices the VM
          {name: forja-l4, machine_type: g2-standard-8, zone: us-east1-d, provisioning_model: SPOT, ...}
      localhost:
        preflight:                      # gcp_instance (entry point check): the project's preflight
          project: my-project
          blocking: true                # a finding failed: forja up stops before creating anything
          elapsed_s: 1.4
          findings:                     # in order; status ok, warn, fail or skip
            - {check: quota, subject: NVIDIA_L4_GPUS (us-east1), status: fail, detail: ..., fix: ...}

    The token itself is never published (nor logged): only where it is.

**2. A run's state while a play follows it.** Each poll of the wait task prints one
forja-train-state document (`forja.runstate`, recognised by its schema key `forja_train_state`)
in its stdout; `forja.events` turns it into a `TrainProgress`.

**3. Announcements** people should see as they happen (what is sent, which PyTorch, the result):
a task result that carries one of `ANNOUNCEMENT_KEYS` (the role prints it with
`ansible.builtin.debug: var: trainer_run_announcement`); `forja.events` makes it an `Announcement`.

The roles' side is `roles/trainer_run/tasks/publish.yml` and `roles/jupyter_colab/tasks/publish.yml`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from forja import runstate
from forja.errors import ConfigError, ForjaError
from forja.tunnel import TunnelPlan

#: The set_stats key every forja role publishes under ({host: HostFacts}).
STATS_KEY = "forja"
#: The contract version this reader understands; roles publish it with each host's facts.
CONTRACT_VERSION = 1
#: Task result keys whose value is a line for people, shown while the play runs.
ANNOUNCEMENT_KEYS = ("trainer_run_announcement",)
#: What the Colab URL template holds where the token goes.
TOKEN_PLACEHOLDER = "<token>"


class ContractError(ForjaError):
    """The roles published something this forja cannot read (a newer contract, a malformed fact)."""

    def __init__(self, host: str, detail: str) -> None:
        super().__init__(f"{host}: the facts the roles published cannot be read: {detail}")
        self.host = host


class JupyterConnection(BaseModel):
    """How to reach one host's Jupyter from Colab, as the jupyter_colab role rendered it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    port: int = Field(ge=1, le=65535)
    tunnel_command: str = Field(min_length=1)
    colab_url_template: str
    token_file: str
    local_token_file: str = ""
    #: The runs' live metrics ports (host contract) the tunnel command also forwards, to equal ports.
    metrics_ports: list[int] = Field(default_factory=list)

    @property
    def argv(self) -> list[str]:
        """The tunnel command as an argv (the role shell-quotes each word)."""
        return shlex.split(self.tunnel_command)

    @property
    def local_token_path(self) -> Path | None:
        return Path(self.local_token_file).expanduser() if self.local_token_file else None

    def colab_url(self, show_token: bool = False) -> str:
        """The URL to paste into Colab; the real token only when asked and copied to this machine."""
        path = self.local_token_path
        if show_token and path is not None and path.is_file():
            return self.colab_url_template.replace(TOKEN_PLACEHOLDER, path.read_text().strip())
        return self.colab_url_template

    def plan(self, host: str, local_port: int | None = None, show_token: bool = False) -> TunnelPlan:
        """The role's tunnel command and Colab URL as a `TunnelPlan`; Colab needs equal ports."""
        if local_port is not None and local_port != self.port:
            raise ConfigError(
                "--local-port", f"{local_port} is not the Jupyter port {self.port}; Colab needs them equal"
            )
        token_file = str(self.local_token_path or f"{self.token_file} on {host}")
        return TunnelPlan(host, self.argv, self.port, self.port, self.colab_url(show_token), token_file,
                          tuple(self.metrics_ports))


class InstanceState(BaseModel):
    """One VM as Compute Engine reports it (gcp_instance's `observe`): what a watcher acts on."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    exists: bool
    zone: str = ""
    status: str = ""
    spot: bool = False
    machine_type: str = ""
    last_start: str = ""
    last_stop: str = ""
    boot_disk_size_gb: int = 0
    preempted_at: str = ""
    preemptions: list[str] = Field(default_factory=list)
    #: STANDARD, SPOT or FLEX_START; a Flex-start VM ends at `ends_at` (its max run duration).
    provisioning_model: str = ""
    ends_at: str = ""
    #: A cluster's member (gcp_instance_count > 1): its cluster and its rank; "" and 0 for a lone VM.
    cluster: str = ""
    rank: int = 0

    @property
    def running(self) -> bool:
        return self.exists and self.status == "RUNNING"


class Finding(BaseModel):
    """One line of the preflight (gcp_instance's `check`): what was checked, found, and the fix."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    check: str
    subject: str
    status: str  # ok, warn, fail or skip
    detail: str
    fix: str = ""
    link: str = ""


class PreflightReport(BaseModel):
    """The preflight of one project: every finding, and whether one blocks creating the VMs."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    project: str
    findings: list[Finding] = Field(default_factory=list)
    blocking: bool = False
    #: Each failed finding as one line for people (the module's wording, its one home).
    problems: list[str] = Field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "fail"]


class ZoneRank(BaseModel):
    """One candidate zone as gcp_gpu_zones ranked it (None: the advisor or the table said nothing)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    zone: str
    region: str = ""
    offered: bool | None = None
    obtainability: float | None = None
    estimated_uptime_s: int | None = None
    preemption_rate_30d: float | None = None
    usd_per_hour: float | None = None
    list_price_usd_hour: float | None = None
    #: Why the advisor said nothing of this zone ("" when it did).
    no_signal: str = ""
    #: The zone's place in the order the user gave (0: the VM's zone).
    given: int = 0


class ZoneReport(BaseModel):
    """The candidate zones for the VM, in the order to try them (gcp_instance's `zones`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    project: str
    machine_type: str
    provisioning_model: str
    #: "advice" when the advisor scored a zone; otherwise why not ("no signal: ...").
    signal: str
    zones: list[ZoneRank] = Field(default_factory=list)
    #: For a Spot VM that even its best zone can hardly get: a line suggesting Flex-start; else "".
    suggestion: str = ""
    elapsed_s: float = 0.0

    @property
    def advised(self) -> bool:
        return self.signal == "advice"

    @property
    def order(self) -> list[str]:
        return [z.zone for z in self.zones]


class PruneVerdict(BaseModel):
    """What the stopped-disk prune decided for one VM (playbooks/prune.yml, module gcp_gpu_prune)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    vm: str
    #: delete, keep (due but in doubt: `warning` says why and the fix), wait, not-stopped, off, absent.
    action: str
    reason: str = ""
    deleted: bool = False
    warning: str = ""
    status: str = ""
    last_stop: str = ""
    stopped_for_s: float | None = None
    delete_after_s: float | None = None
    boot_disk_size_gb: int | None = None
    disk_usd_per_month: float | None = None
    checked: list[str] = Field(default_factory=list)


class PriceRecord(BaseModel):
    """What prices one VM of a run, as the train playbook read it from the host's inventory record
    (filter forja_price_record: the fields `forja cost` reads, no connection settings or secrets).

    Published when the run is sent so forja records the run's rate then (forja.cost_report.price_run)
    and settles its cost at the end without reading the inventory again. Fields the filter adds later
    are kept (`extra`), for forja.cost reads them by name."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(min_length=1)
    machine_type: str = Field(min_length=1)
    zone: str = Field(min_length=1)
    gpu_type: str | None = None
    gpu_count: int | None = None
    #: STANDARD, SPOT or FLEX_START; older records say Spot with `preemptible`.
    provisioning_model: str | None = None
    preemptible: bool | None = None
    boot_disk_size_gb: float | None = None
    boot_disk_type: str | None = None
    disk_size_gb: float | None = None
    disk_type: str | None = None
    #: A cluster's member: its cluster and rank (every member is kept up for the run, and priced).
    forja_cluster: str | None = None
    forja_node_rank: int | None = None

    def as_instance(self) -> dict[str, Any]:
        """The record as forja.cost reads an instance (the inventory's hostvars): the fields given."""
        return self.model_dump(exclude_none=True)


class HostFacts(BaseModel):
    """Everything one host published in one play (each part only when its role ran)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    contract_version: int
    runs: list[runstate.RunState] = Field(default_factory=list)
    jupyter: JupyterConnection | None = None
    instance: InstanceState | None = None
    preflight: PreflightReport | None = None
    zones: ZoneReport | None = None
    prune: PruneVerdict | None = None
    price_record: PriceRecord | None = None

    @field_validator("contract_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value > CONTRACT_VERSION:
            raise ValueError(f"version {value} is newer than this forja's {CONTRACT_VERSION}: upgrade forja")
        return value

    @field_validator("runs", mode="before")
    @classmethod
    def _state_documents(cls, value: Any) -> list[runstate.RunState]:
        # forja-train-state's one reader; a poll of an unknown run publishes {} and is left out.
        docs = value if isinstance(value, list) else [value]
        return [s for s in (runstate.parse(d) for d in docs) if s is not None]


class Published(BaseModel):
    """The facts of one play, by host: what forja's status, follow, fetch, history and tunnel read."""

    model_config = ConfigDict(frozen=True)

    hosts: dict[str, HostFacts] = Field(default_factory=dict)

    @property
    def runs(self) -> list[tuple[str, runstate.RunState]]:
        """(host, state) pairs, hosts in name order."""
        return [(host, state) for host in sorted(self.hosts) for state in self.hosts[host].runs]

    @property
    def jupyter(self) -> dict[str, JupyterConnection]:
        return {host: facts.jupyter for host, facts in sorted(self.hosts.items()) if facts.jupyter}

    @property
    def instances(self) -> dict[str, InstanceState]:
        return {host: facts.instance for host, facts in sorted(self.hosts.items()) if facts.instance}

    @property
    def preflight(self) -> PreflightReport | None:
        return next((facts.preflight for facts in self.hosts.values() if facts.preflight), None)

    @property
    def zones(self) -> ZoneReport | None:
        return next((facts.zones for facts in self.hosts.values() if facts.zones), None)

    @property
    def prune(self) -> dict[str, PruneVerdict]:
        return {host: facts.prune for host, facts in sorted(self.hosts.items()) if facts.prune}

    @property
    def price_records(self) -> list[dict[str, Any]]:
        """The VMs' price records as instance records (forja.cost's input), hosts in name order."""
        return [facts.price_record.as_instance() for _, facts in sorted(self.hosts.items())
                if facts.price_record]


def read_stats(artifact_data: Mapping[str, Any]) -> Published:
    """The typed facts from a play's artifact data (`RunResult.artifact_data`); {} reads as nothing."""
    per_host = artifact_data.get(STATS_KEY) or {}
    if not isinstance(per_host, Mapping):
        raise ContractError("all", f"'{STATS_KEY}' is {type(per_host).__name__}, not a mapping of hosts")
    hosts: dict[str, HostFacts] = {}
    for host, facts in per_host.items():
        try:
            hosts[str(host)] = HostFacts.model_validate(facts)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ContractError(str(host), problems) from exc
    return Published(hosts=hosts)


def announcement(result: Mapping[str, Any]) -> str | None:
    """The line for people a task result carries under one of `ANNOUNCEMENT_KEYS`, if any."""
    for key in ANNOUNCEMENT_KEYS:
        value = result.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None
