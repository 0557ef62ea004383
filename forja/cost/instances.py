"""Instances to price given as a file: offline reports and tests, shaped like the inventory's records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml


def instances_from_file(path: Path) -> list[dict[str, Any]]:
    """A list of instance dicts, or {"instances": [...]}, in JSON or YAML."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise typer.BadParameter(f"{path} does not exist", param_hint="--instances") from exc
    if isinstance(data, dict) and "instances" in data:
        data = data["instances"]
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise typer.BadParameter(f"{path} must hold a list of instance mappings", param_hint="--instances")
    return data
