"""A local Compute Engine v1 emulator: real HTTP on loopback, OAuth token endpoint included.

Google publishes no Compute Engine emulator, and forja's GCP code must be tested against the
real network path (auth, paging, operations, errors), so this package serves the subset of
Compute v1 that forja uses, validated against Google's own discovery document.

    from forja_sandbox.compute_emulator import ComputeEmulator
    with ComputeEmulator() as emu:
        key = emu.write_service_account_key(tmp / "key.json")
        ...  # point a client at emu.base_url with that key

Standalone: `python -m forja_sandbox.compute_emulator --port 8780 --state state.json`.
"""

from .api import InstanceBackend
from .emulator import DEFAULT_PROJECT, ComputeEmulator
from .errors import ApiError
from .faults import Fault, Faults

__all__ = ["DEFAULT_PROJECT", "ApiError", "ComputeEmulator", "Fault", "Faults", "InstanceBackend"]
