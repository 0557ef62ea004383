"""Exporting a trained model and pushing it to the Hub stand-in: seconds and MB/s per model size.

Run on demand (not a test): ``python bench/model_export_bench.py [--params-m 10 100]``.
Per size, a state_dict of float32 linear layers (one weight tied, as a language model ties its
embedding and head) goes through what a finished run and ``forja model push`` do:

- ``export s``: trainer.export.export_state (safetensors write, fsync, sha256, model.json);
- ``load s``: trainer.export.load_state (sha256 check, safetensors read);
- ``push s`` / ``MB/s``: forja.hub.push_model with huggingface_hub's own client to the local Hub
  stand-in (forja_sandbox/hub_standin.py: whoami, create, preupload, LFS PUT, verify, commit).
  The stand-in is on this machine: the number is the client's and forja's overhead, not a network.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from forja.hub import push_model  # noqa: E402
from forja_sandbox.hub_standin import HubStandIn, Token  # noqa: E402
from trainer.export import export_state, load_state  # noqa: E402


def state_of(params_m: int) -> dict[str, torch.Tensor]:
    """Square 1024-wide layers until about ``params_m`` million parameters; the last one tied."""
    width, layers = 1024, max(1, round(params_m * 1e6 / 1024**2))
    state = {f"layer{i}.weight": torch.randn(width, width) for i in range(layers)}
    state["head.weight"] = state["layer0.weight"]
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params-m", type=int, nargs="+", default=[10, 100])
    args = parser.parse_args()
    rows = []
    with HubStandIn({"hf_bench": Token("bench")}) as hub, tempfile.TemporaryDirectory() as tmp:
        for params_m in args.params_m:
            state = state_of(params_m)
            folder = Path(tmp) / f"m{params_m}"
            began = time.perf_counter()
            exported = export_state(state, {"model": "bench:model"}, folder, step=1, run="bench")
            export_s = time.perf_counter() - began
            began = time.perf_counter()
            load_state(folder)
            load_s = time.perf_counter() - began
            began = time.perf_counter()
            push_model(folder, f"bench/m{params_m}", token="hf_bench", endpoint=hub.url)
            push_s = time.perf_counter() - began
            size_mb = exported.info["size"] / 1e6
            rows.append((params_m, size_mb, export_s, load_s, push_s, size_mb / push_s))
    print(f"{'params M':>9} {'MB':>8} {'export s':>9} {'load s':>7} {'push s':>7} {'push MB/s':>10}")
    for params_m, size_mb, export_s, load_s, push_s, rate in rows:
        print(f"{params_m:>9} {size_mb:>8.1f} {export_s:>9.2f} {load_s:>7.2f} {push_s:>7.2f} {rate:>10.1f}")


if __name__ == "__main__":
    main()
