"""Command line: ``python -m trainer {train,find-batch,estimate,plan,benchmark,report,export}``.

Exit codes are the contract with systemd (the trainer_run role), defined once in
:mod:`trainer.exit_codes`: 0 completed, 3 stopped by SIGTERM after a clean checkpoint (restart to
resume), 1 a failure a restart may fix; every code in ``exit_codes.NO_RESTART`` (bad config, an
error in the user's code or data, no valid checkpoint, a full disk) means a restart would fail the
same way. :mod:`trainer.errors` decides which one an exception gets.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from trainer.exit_codes import BAD_CONFIG, COMPLETED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(name: str, help_text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("--config", required=True, help="YAML file, or a built-in name: digits, mnist")
        cmd.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config key (dotted for nested keys), repeatable",
        )
        return cmd

    train = with_config("train", "Train, resuming from the newest valid checkpoint in OUT/checkpoints.")
    train.add_argument("--out", help="run folder (default: the config's out_dir)")
    find = with_config("find-batch", "Find the largest micro-batch that fits and the effective-batch plan.")
    find.add_argument("--no-cache", action="store_true", help="search again even if a result is cached")
    find.add_argument("--json", action="store_true", help="print JSON instead of a table")
    est = with_config("estimate", "Predict training memory and the largest model/batch that fits.")
    est.add_argument(
        "--memory-gb", type=float, help="device memory to plan for (default: this GPU, else 24 = L4)"
    )
    est.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan = sub.add_parser(
        "plan",
        help="Predict on this CPU the peak memory, largest micro-batch and step time on a GPU.",
        description="Trace one training step under fake tensors (no memory, no GPU) and add the GPU's "
        "constants (trainer/gpus.yaml): peak per micro-batch, the largest that fits, the accumulation "
        "that keeps the global batch, the step time. Example: python -m trainer plan "
        "trainer/configs/gpt.yaml --gpu L4",
    )
    plan.add_argument("config", help="YAML file, or a built-in name: digits, mnist")
    plan.add_argument(
        "--gpu", default="L4", help="L4 (default), T4, A100, A100-80GB, H100, H200, cpu, or a YAML file"
    )
    plan.add_argument("--gpus", type=int, default=1, help="GPUs (processes) on the machine (default 1)")
    plan.add_argument(
        "--vcpus", type=int, help="the machine's vCPUs, for data-loading workers (default: this one's)"
    )
    plan.add_argument("--measured", metavar="JSON",
                      help="what an earlier run of this model measured on that GPU, to calibrate the plan: "
                      '{"micro_batch": 8, "accum_steps": 8, "peak_reserved_mib": 9800, "step_s": 2.1, '
                      '"source": "run gpt-3"}')
    plan.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config key (dotted for nested keys), repeatable")
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bench = sub.add_parser("benchmark", help="Matmul throughput, CPU vs GPU, and the fraction of peak.")
    bench.add_argument("--sizes", default="1024,2048,4096", help="square matrix sizes, comma-separated")
    bench.add_argument("--repeats", type=int, default=5, help="timed repetitions per size")
    bench.add_argument("--json", action="store_true", help="print JSON instead of a table")
    report = sub.add_parser("report", help="Render plots/*.png and summary.json for a run folder.")
    report.add_argument("--run", required=True, help="the run folder (out_dir)")
    export = sub.add_parser(
        "export", help="Write RUN/model/ (safetensors + model.json) from the newest verified checkpoint."
    )
    export.add_argument("run", help="the run folder (out_dir)")
    export.add_argument("--out", help="the model folder to write (default: RUN/model)")
    export.add_argument(
        "--step", type=int, help="export the checkpoint of this step (e.g. from before a divergence)"
    )
    export.add_argument(
        "--bucket", help="also upload to gs://BUCKET/PREFIX/<run>/model/ (default: $FORJA_CHECKPOINT_BUCKET)"
    )
    return parser


def _setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(message)s"
        if "RANK" in os.environ
        else "%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )


def _print(data: dict[str, Any], as_json: bool, table: str) -> None:
    if int(os.environ.get("RANK", "0")) != 0:
        return
    print(json.dumps(data, indent=2, default=str) if as_json else table, flush=True)


def _run(args: argparse.Namespace) -> int:
    if args.command == "report":
        from trainer.finite import dumps
        from trainer.report import RunFolderError, render

        try:
            summary = render(args.run)
        except (FileNotFoundError, NotADirectoryError, PermissionError, RunFolderError) as exc:
            # not a run folder, or one with lines report cannot read: the user's to fix, never a traceback
            print(f"error: --run {args.run}: {exc}", file=sys.stderr, flush=True)
            return BAD_CONFIG
        print(dumps(summary, indent=2, default=str))
        return COMPLETED
    if args.command == "export":
        return _export(args)
    if args.command == "benchmark":
        from trainer.benchmark import format_table, run_benchmark

        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        rows = run_benchmark(sizes, args.repeats)
        _print({"rows": rows}, args.json, format_table(rows))
        return COMPLETED

    from trainer.config import load

    if args.command == "plan":
        from trainer.plan import plan
        from trainer.plan_format import format_plan

        measured = json.loads(args.measured) if args.measured else None
        config = load(args.config, args.overrides)
        report = plan(config, args.gpu, args.gpus, vcpus=args.vcpus, measured=measured)
        _print(report, args.json, format_plan(report))
        return COMPLETED
    config = load(args.config, args.overrides)
    if args.command == "train":
        from trainer.finite import dumps
        from trainer.metrics import process_started_monotonic
        from trainer.summary import HEADLINE
        from trainer.train import train

        result = train(config, args.out, started_at=process_started_monotonic())
        if result.summary:
            print(dumps({k: result.summary.get(k) for k in HEADLINE}), flush=True)
        return result.exit_code
    if args.command == "find-batch":
        from trainer.batch_finder import find_batch, format_result
        from trainer.runtime import prepare

        rt = prepare(config)
        from trainer.distributed import teardown

        try:
            result = find_batch(
                config,
                rt.world,
                rt.model_fn,
                rt.loss_fn,
                rt.train_data,
                rt.precision,
                rt.channels_last,
                use_cache=not args.no_cache,
            )
        except BaseException:
            teardown()
            raise
        teardown(rt.world)
        _print(result.to_dict(), args.json, format_result(result))
        return COMPLETED
    if args.command == "estimate":
        from trainer.estimate import estimate, format_estimate
        from trainer.runtime import prepare

        rt = prepare(config)
        report = estimate(rt, args.memory_gb)
        _print(report, args.json, format_estimate(report))
        return COMPLETED
    raise AssertionError(args.command)


def _export(args: argparse.Namespace) -> int:
    """``export RUN``: the newest verified checkpoint as RUN/model/, then to the bucket when one is set."""
    from pathlib import Path

    from trainer.export import ExportError, export_run, upload_model
    from trainer.mirror import bucket_url

    try:
        exported = export_run(args.run, args.out, args.step)
    except ExportError as exc:  # a missing run, no checkpoint: the user's to fix, exit 2
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return BAD_CONFIG
    result = {"folder": str(exported.folder), **exported.info}
    url = bucket_url(args.bucket)
    if url is not None:
        result["bucket"] = upload_model(exported.folder, url, exported.info["run"] or Path(args.run).name)
    print(json.dumps(result, indent=2), flush=True)
    return COMPLETED


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _setup_logging()
    try:
        return _run(args)
    except Exception as exc:
        from trainer import errors, exit_codes

        code = errors.exit_code_for(exc)
        if code == exit_codes.USER_ERROR:  # the traceback into the user's own code is what they need
            logging.getLogger("trainer").error("the user's code raised", exc_info=exc.__cause__ or exc)
        elif code == exit_codes.FAILED:
            logging.getLogger("trainer").error("failed", exc_info=exc)
        print(errors.describe(exc), file=sys.stderr, flush=True)
        return code
