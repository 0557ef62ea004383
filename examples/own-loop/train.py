"""An own training loop that survives Spot preemption through forja's library API (trainer.runlib).

Two optimizers (SGD with momentum for the body, AdamW for the head) and a schedule written here
(linear warm-up, then halving every ``--decay-every`` steps). Run it:

    python train.py --steps 200                                              # one process, ./forja-run
    python -m torch.distributed.run --standalone --nproc_per_node=2 train.py # two (gloo on CPU)
    forja train --script train.py -- --steps 2000                            # on the VM, one per GPU
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from model import Net, make_batch
from tabulate import tabulate  # the project's own dependency (requirements.txt)
from torch.nn.parallel import DistributedDataParallel

from trainer import runlib
from trainer.run_folder import MODEL_DIR


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64, help="samples per process per step")
    p.add_argument("--lr-body", type=float, default=0.05)
    p.add_argument("--lr-head", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--decay-every", type=int, default=100)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pause-s", type=float, default=0.0, help="sleep after each step (to watch a run)")
    return p.parse_args(argv)


def factor(step: int, warmup: int, decay_every: int) -> float:
    """Our own schedule: linear warm-up, then halve every ``decay_every`` steps."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 ** ((step - warmup) // decay_every)


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.steps < 1 or args.batch < 1:
        print("error: --steps and --batch must be >= 1", file=sys.stderr)
        return runlib.BAD_CONFIG  # a restart would fail the same way
    world = runlib.setup()
    torch.manual_seed(args.seed)
    net = Net().to(world.device)
    model = DistributedDataParallel(net) if world.distributed else net
    opt_body = torch.optim.SGD(net.body.parameters(), lr=args.lr_body, momentum=0.9)
    opt_head = torch.optim.AdamW(net.head.parameters(), lr=args.lr_head)

    with runlib.Run(total_steps=args.steps, config=vars(args), world=world) as run:
        state = run.resume()
        if state is not None:
            net.load_state_dict(state["model"])
            opt_body.load_state_dict(state["opt_body"])
            opt_head.load_state_dict(state["opt_head"])
            if run.is_main:
                print(f"resumed from step {run.start_step}", flush=True)
        for step in range(run.start_step, args.steps):
            f = factor(step, args.warmup, args.decay_every)
            for opt, base in ((opt_body, args.lr_body), (opt_head, args.lr_head)):
                for group in opt.param_groups:
                    group["lr"] = base * f
            x, y = make_batch(args.seed, step, world.rank, world.size, args.batch)
            loss = torch.nn.functional.mse_loss(model(x.to(world.device)), y.to(world.device))
            opt_body.zero_grad(set_to_none=True)
            opt_head.zero_grad(set_to_none=True)
            loss.backward()
            opt_body.step()
            opt_head.step()
            done = step + 1
            if args.pause_s:
                time.sleep(args.pause_s)
            if done % args.log_every == 0 or done == args.steps:
                samples = args.batch * world.size * args.log_every
                run.log(done, loss=loss.item(), lr=args.lr_head * f, samples=samples, mean_over_ranks=True,
                        lr_body=args.lr_body * f)  # fmt: skip
            stop = run.should_stop()
            if stop or done % args.save_every == 0 or done == args.steps:
                state = {"model": net.state_dict(), "opt_body": opt_body.state_dict()}
                run.save({**state, "opt_head": opt_head.state_dict()}, done)
            if stop:
                break
    if run.is_main and run.status == "completed":
        # The model where forja fetches it from (on Vertex AI, the launcher uploads it to the bucket).
        (run.run_dir / MODEL_DIR).mkdir(exist_ok=True)
        torch.save(net.state_dict(), run.run_dir / MODEL_DIR / "model.pt")
        rows = [["steps", run.step], ["final loss", f"{run.final_loss:.5f}"], ["processes", world.size]]
        print(tabulate(rows, headers=["own-loop", ""]), flush=True)
    return run.exit_code


if __name__ == "__main__":
    sys.exit(runlib.main(main))  # exceptions become forja's exit codes (a full disk is not retried)
