"""The sandbox's Vertex AI: CustomJob create/get/list/cancel over real HTTP, replicas as local processes.

Bodies are read with Google's own aiplatform v1 types; machines are judged by forja's machine
catalog. README.md lists where it differs from Vertex.
"""

from __future__ import annotations

from .emulator import VertexEmulator

__all__ = ["VertexEmulator"]
