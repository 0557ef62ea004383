"""One step of torch.distributed on CPU (gloo), set up only from what Vertex puts in the environment.

Each replica joins the process group through PyTorch's env:// rendezvous (MASTER_ADDR, MASTER_PORT,
WORLD_SIZE, RANK), all-reduces its rank + 1, and writes what it saw under AIP_MODEL_DIR, so a test
can check the replicas really met and got Vertex's variables.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    cluster = json.loads(os.environ["CLUSTER_SPEC"])
    record = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "sum": total.item(),
        "task": cluster["task"],
        "cluster": cluster["cluster"],
        "checkpoint_dir": os.environ["AIP_CHECKPOINT_DIR"],
        "tensorboard_dir": os.environ["AIP_TENSORBOARD_LOG_DIR"],
        "job_id": os.environ["CLOUD_ML_JOB_ID"],
        "run_name": os.environ.get("RUN_NAME", ""),
    }
    Path(os.environ["AIP_MODEL_DIR"], f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
