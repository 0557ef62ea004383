"""The survival kit for your own training loop: forja's run contract, checkpoints, metrics, preemption.

Why: the built-in trainer resumes after a Spot preemption, logs metrics that ``forja status``,
the plots and the history read, and exits with codes systemd understands. A script with its own
loop (several optimizers, its own schedule) gets the same by using this module; it reuses the
trainer's own parts (:mod:`trainer.checkpoint`, :mod:`trainer.metrics`, :mod:`trainer.preemption`,
:mod:`trainer.exit_codes`), so both write the same files.

forja launches a script (``trainer_run_command``, ``forja train --script``) under torchrun, one
process per GPU (or ``trainer_run_cpu_procs`` gloo processes on a host without one), with the run
contract in the environment; :func:`contract` reads it:

=========================  ===========================================================================
``FORJA_RUN``              the run's name
``FORJA_RUN_DIR``          run folder: metrics.jsonl, events.jsonl, summary.json, config.yaml, plots/
``FORJA_CHECKPOINT_DIR``   where checkpoints go (``$FORJA_RUN_DIR/checkpoints``)
``FORJA_RESUME_FROM``      newest valid checkpoint when the process started, or empty (a fresh run)
``FORJA_PRICE_PER_HOUR``   USD per hour of the VM, for ``cost_usd``
``FORJA_WORLD_SIZE``       processes in the run (``FORJA_NNODES`` x ``FORJA_NPROC_PER_NODE``)
``FORJA_NNODES``           hosts in the run; ``FORJA_NODE_RANK`` is this host's position
``FORJA_NPROC_PER_NODE``   processes on this host (one per GPU)
``FORJA_CONFIG``           the run spec YAML on the host (your config, with ``command:``)
``FORJA_PROJECT_DIR``      your project as sent (read-only; the process starts there)
``RANK`` ``LOCAL_RANK``    torchrun's own: this process's global and per-host rank,
``WORLD_SIZE``             and the number of processes (``MASTER_ADDR``/``MASTER_PORT`` too)
=========================  ===========================================================================

Run locally without forja, the same script writes to ``./forja-run`` (or ``FORJA_RUN_DIR``).

With ``FORJA_CHECKPOINT_BUCKET=gs://BUCKET/PREFIX`` (or ``Run(checkpoint_bucket=...)``) every
checkpoint :meth:`Run.save` writes is also uploaded to ``PREFIX/<run>/checkpoints/`` in the
background, and :class:`Run` resumes from the bucket when its checkpoint is newer than the disk's
(:mod:`trainer.mirror`).

Example (every rank runs the same lines; only rank 0 writes files)::

    import sys
    from trainer import runlib

    world = runlib.setup()                      # joins the process group under torchrun
    model = Net().to(world.device)
    opt = torch.optim.AdamW(model.parameters())
    with runlib.Run(total_steps=1000, config={"lr": 3e-4}, world=world) as run:
        state = run.resume()                    # newest valid checkpoint, or None
        if state:
            model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
        for step in range(run.start_step + 1, 1001):
            loss = train_step(model, opt)
            run.log(step, loss=loss.item(), lr=3e-4, samples=64)
            stop = run.should_stop()            # SIGTERM on any rank stops every rank here
            if stop or step % 100 == 0 or step == 1000:
                run.save({"model": model.state_dict(), "opt": opt.state_dict()}, step)
            if stop:
                break
    sys.exit(run.exit_code)                     # 0 completed, 3 preempted: systemd restarts and resumes

``should_stop``, ``save`` and ``log``'s optional averaging talk to every rank: call them at the
same steps on all ranks. Checkpoint contents must be tensors and plain Python values (they are
loaded with ``weights_only=True``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch.distributed as dist
import yaml

from trainer import distributed, metrics
from trainer.checkpoint import (
    CheckpointManager,
    CorruptCheckpoint,
    rng_state,
    set_rng_state,
    verify_checkpoint,
)
from trainer.config import ConfigError
from trainer.divergence import Diverged, Judge
from trainer.errors import UserCodeError
from trainer.exit_codes import (
    BAD_CONFIG,
    COMPLETED,
    DISK_FULL,
    DIVERGED,
    FAILED,
    NO_VALID_CHECKPOINT,
    PREEMPTED,
    USER_ERROR,
)
from trainer.folder_lock import folder_lock
from trainer.mirror import (
    BUCKET_ENV,
    PREEMPTED_UPLOAD_WAIT_S,
    CheckpointMirror,
    MirrorUnavailable,
    bucket_url,
)
from trainer.preemption import StopRequest, forget_stop_request, stopped_by
from trainer.run_folder import CHECKPOINTS_DIR, CONFIG, EVENTS, METRICS

__all__ = [
    "BAD_CONFIG",
    "COMPLETED",
    "DISK_FULL",
    "DIVERGED",
    "FAILED",
    "NO_VALID_CHECKPOINT",
    "PREEMPTED",
    "USER_ERROR",
    "Contract",
    "Diverged",
    "Run",
    "UserCodeError",
    "contract",
    "main",
    "resume_point",
    "setup",
]

log = logging.getLogger(__name__)

DEFAULT_RUN_DIR = "forja-run"


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    value = env.get(key, "")
    try:
        return int(value) if value.strip() else default
    except ValueError as exc:
        raise ValueError(f"{key}={value!r} is not an integer (forja's launcher sets it)") from exc


@dataclass(frozen=True)
class Contract:
    """What forja tells a process about its run, read from the environment (see the module doc)."""

    run: str
    run_dir: Path
    checkpoint_dir: Path
    resume_from: Path | None
    price_per_hour: float
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    nnodes: int
    nproc_per_node: int
    config: Path | None
    project_dir: Path | None
    launched_by_forja: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Contract:
        env = os.environ if env is None else env
        run_dir = Path(env.get("FORJA_RUN_DIR") or DEFAULT_RUN_DIR).expanduser().resolve()
        resume = env.get("FORJA_RESUME_FROM", "")
        price = env.get("FORJA_PRICE_PER_HOUR", "") or "0"
        try:
            price_per_hour = float(price)
        except ValueError as exc:
            raise ValueError(f"FORJA_PRICE_PER_HOUR={price!r} is not a number of USD per hour") from exc
        world_size = _int(env, "WORLD_SIZE", _int(env, "FORJA_WORLD_SIZE", 1))
        return cls(
            run=env.get("FORJA_RUN") or run_dir.name,
            run_dir=run_dir,
            checkpoint_dir=Path(env.get("FORJA_CHECKPOINT_DIR") or run_dir / CHECKPOINTS_DIR),
            resume_from=Path(resume) if resume else None,
            price_per_hour=price_per_hour,
            rank=_int(env, "RANK", 0),
            local_rank=_int(env, "LOCAL_RANK", 0),
            world_size=world_size,
            node_rank=_int(env, "FORJA_NODE_RANK", 0),
            nnodes=_int(env, "FORJA_NNODES", 1),
            nproc_per_node=_int(env, "FORJA_NPROC_PER_NODE", world_size),
            config=Path(env["FORJA_CONFIG"]) if env.get("FORJA_CONFIG") else None,
            project_dir=Path(env["FORJA_PROJECT_DIR"]) if env.get("FORJA_PROJECT_DIR") else None,
            launched_by_forja=bool(env.get("FORJA_RUN")),
        )


def contract() -> Contract:
    """The run contract of this process (defaults for a local run without forja)."""
    return Contract.from_env()


def setup(device: str = "auto", timeout_s: float = 600.0) -> distributed.World:
    """Join torchrun's process group (nccl on GPU, gloo on CPU); each rank drives GPU ``LOCAL_RANK``.

    The timeout makes a rank whose peer died fail instead of waiting forever (a paid GPU idling).
    Without torchrun, one process on ``device`` (``auto``: cuda when visible, else cpu).
    """
    return distributed.setup(distributed.pick_device(device), timeout_s)


def resume_point(checkpoint_dir: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint in the folder whose checksum verifies (read only: nothing is set aside).

    Hashes files instead of loading them, so the launcher can tell any script where to resume
    without unpickling a large state twice.
    """
    for path in reversed(CheckpointManager(Path(checkpoint_dir)).list()):
        try:
            verify_checkpoint(path)
        except CorruptCheckpoint as exc:
            log.warning("not a resume point: %s", exc)
            continue
        return path
    return None


def main(fn: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """Run a script's ``fn(argv)`` and turn what it raised into forja's exit code, with one line for people.

    A full disk, a rejected config, no valid checkpoint, or :class:`UserCodeError` (raise it for
    errors in your data or arguments) end with codes the unit does not restart; anything else is a
    failure (1) that a restart resumes. Use: ``sys.exit(runlib.main(train))``.
    A script that joined a process group leaves it here, and its process ends here with the code
    (distributed.finish: a gloo thread must not live on into the interpreter's finalization).
    """
    from trainer.errors import describe, exit_code_for

    try:
        code = fn(sys.argv[1:] if argv is None else argv)
    except Exception as exc:
        code = exit_code_for(exc)
        if code == FAILED:
            log.exception("failed")
        print(describe(exc), file=sys.stderr, flush=True)
        return distributed.finish(code)  # no barrier after an error: a dead peer would hold it
    # A script that returns without leaving its process group lets the interpreter tear the gloo
    # threads down while a peer is still finishing, and that peer aborts ("terminate called without
    # an active exception"): wait for every rank, then leave (distributed.teardown).
    if dist.is_available() and dist.is_initialized():
        distributed.teardown(distributed.World(rank=dist.get_rank(), size=dist.get_world_size()))
    return distributed.finish(code)


def _current_world() -> distributed.World:
    """A World for a process group the script joined itself (or a single process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return distributed.World()
    control = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
    rank = dist.get_rank()
    return distributed.World(
        rank=rank,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        size=dist.get_world_size(),
        control_group=control,
    )


class Run:
    """One session of a run: resume, log, agree on stopping, save, and leave a summary.

    Rank 0 writes the run files (the same ones the built-in trainer writes); every rank must enter
    the ``with`` block, and call :meth:`should_stop` and :meth:`save` at the same steps.
    """

    def __init__(
        self,
        total_steps: int | None = None,
        config: dict[str, Any] | None = None,
        *,
        world: distributed.World | None = None,
        keep: int = 3,
        run_dir: str | os.PathLike[str] | None = None,
        render_plots: bool = True,
        allow_fresh_start: bool = False,
        checkpoint_bucket: str | None = None,
        upload_wait_s: float = 120.0,
        divergence_loss_bound: float | None = None,
    ) -> None:
        env = dict(os.environ)
        if run_dir is not None:
            env["FORJA_RUN_DIR"] = str(run_dir)
            env.pop("FORJA_CHECKPOINT_DIR", None)
        self.contract = Contract.from_env(env)
        self.total_steps = total_steps
        self.config = dict(config or {})
        self.render_plots = render_plots
        self.allow_fresh_start = allow_fresh_start
        self._world = world
        self.checkpoints = CheckpointManager(self.contract.checkpoint_dir, keep=keep)
        self.bucket_url = bucket_url(checkpoint_bucket, env)
        self.upload_wait_s = upload_wait_s
        #: Rank 0's bucket mirror (trainer.mirror) once the session is entered, when a bucket is set.
        self.mirror: CheckpointMirror | None = None
        self._created = time.monotonic()
        self.start_step = 0
        self.step = 0
        self.status = "running"
        self.final_loss: float | None = None
        #: Judges every logged loss (trainer.divergence): NaN, Inf or over the bound raises Diverged.
        self.judge = Judge(bound=divergence_loss_bound)
        self.divergence: dict[str, Any] | None = None
        self._state: dict[str, Any] | None = None
        self._stop = StopRequest()
        self._lock = contextlib.ExitStack()
        self._stopped_by: str | None = None
        self._metrics: metrics.JsonLines | None = None
        self._events: metrics.JsonLines | None = None
        self._clock = metrics.Clock()
        self._window: tuple[float, int] = (time.perf_counter(), 0)  # when and at which step the last line was
        self._gpu: metrics.GpuProbe | None = None

    # -- properties
    @property
    def world(self) -> distributed.World:
        if self._world is None:
            self._world = _current_world()
        return self._world

    @property
    def is_main(self) -> bool:
        return self.world.is_main

    @property
    def run_dir(self) -> Path:
        return self.contract.run_dir

    @property
    def exit_code(self) -> int:
        """0 completed, 3 preempted after a clean save (systemd restarts it; the next start resumes),
        7 diverged (not restarted)."""
        return {"completed": COMPLETED, "preempted": PREEMPTED, "diverged": DIVERGED}.get(self.status, FAILED)

    # -- session
    def __enter__(self) -> Run:
        self._stop.__enter__()
        try:
            if self.world.is_main:  # one writer per run folder (trainer.folder_lock), released at the end
                self._lock.enter_context(folder_lock(self.run_dir))
            return self._enter()
        except BaseException:
            self._lock.close()
            self._stop.__exit__(None, None, None)
            raise

    def _enter(self) -> Run:
        world = self.world
        found = None
        if world.is_main:
            for stale in self.checkpoints.remove_stale_temporaries():
                log.warning("removed a checkpoint a killed writer left half-written: %s", stale.name)
            if self.bucket_url is not None:  # the bucket's checkpoint first, when newer than the disk's
                try:
                    self.mirror = CheckpointMirror(
                        self.bucket_url, self.contract.run, keep=self.checkpoints.keep, run_dir=self.run_dir
                    )
                except ValueError as exc:
                    raise ConfigError([f"checkpoint_bucket ({BUCKET_ENV}): {exc}"]) from None
                self.mirror.sync_at_start(self.checkpoints)
            found = self.checkpoints.load_for_resume(allow_fresh_start=self.allow_fresh_start)
        state = found.state if found else None
        if world.distributed:  # only rank 0's host holds the checkpoints (several hosts, one writer)
            box = [state]
            dist.broadcast_object_list(box, src=0, group=world.control_group)
            state = box[0]
        step = int(state["step"]) if state else 0
        self._state = state
        self.start_step = self.step = step
        carried = float(self._state.get("wall_s", 0.0)) if self._state else 0.0
        if self._state and "rng" in self._state:
            rngs = self._state["rng"]
            set_rng_state(rngs[world.rank] if len(rngs) == world.size else rngs[0])
        if world.is_main:
            skipped = [p.name for p in found.skipped] if found else []
            carried = self._open_files(found.path if found else None, skipped, carried)
        carried = distributed.agree_max(world, [carried])[0]
        # Under forja the process exists for this run: its cost counts from the process start (setup
        # included). Elsewhere (a notebook) it counts from the Run's creation.
        began = metrics.process_started_monotonic() if self.contract.launched_by_forja else self._created
        self._clock = metrics.Clock(carried, start=began)
        self._window = (time.perf_counter(), step)
        self._gpu = metrics.GpuProbe(world.device)
        metrics.cpu_utilisation()
        return self

    def _open_files(self, path: Path | None, skipped: list[str], carried_s: float) -> float:
        """config.yaml, metrics.jsonl (redone steps dropped), events.jsonl; returns the wall time so far."""
        out = self.run_dir
        out.mkdir(parents=True, exist_ok=True)
        record = dict(self.config)
        if self.total_steps is not None:
            record["steps"] = int(self.total_steps)  # forja's status reads the run's length here
        (out / CONFIG).write_text(yaml.safe_dump(record, sort_keys=False))
        restarted = path is not None or any(True for _ in metrics.read_jsonl(out / EVENTS))
        lost = 0
        if restarted:
            last = metrics.truncate_after(out / METRICS, self.start_step)
            if last is not None:
                lost = max(0, int(last.get("step", self.start_step)) - self.start_step)
                carried_s = max(carried_s, float(last.get("wall_s", 0.0)))
        self._metrics = metrics.JsonLines(out / METRICS)
        self._events = metrics.JsonLines(out / EVENTS)
        if self.world.is_main:
            forget_stop_request(out)
        if restarted:
            self.event(
                "resume",
                resumed_from_step=self.start_step,
                lost_steps=lost,
                skipped_checkpoints=skipped,
                world_size=self.world.size,
            )
        else:
            self.event("start", world_size=self.world.size, script=sys.argv[0])
        return carried_s

    def resume(self) -> dict[str, Any] | None:
        """The newest valid checkpoint (a dict with ``step``), or None for a fresh run; given once."""
        state, self._state = self._state, None
        return state

    def event(self, kind: str, **fields: Any) -> None:
        """A line in events.jsonl (rank 0), e.g. ``run.event("eval", accuracy=0.93)``."""
        if self._events is not None:
            self._events.write({"event": kind, "time": time.time(), "step": self.step, **fields})

    def log(
        self,
        step: int,
        loss: float,
        lr: float | None = None,
        samples: int | None = None,
        mean_over_ranks: bool = False,
        **extra: float | int | str | None,
    ) -> None:
        """One metrics line; ``samples``: samples processed by all ranks since the previous log line.

        A loss that is NaN, infinite or above ``divergence_loss_bound`` raises :class:`Diverged` after
        its line is written: leaving the ``with`` block ends the run as "diverged" (exit 7, not
        restarted), naming the step, the last finite loss and the newest checkpoint before it. Under
        several processes, log with ``mean_over_ranks=True`` so that every rank stops together.
        """
        if mean_over_ranks:
            loss = distributed.sum_over_ranks(self.world, [float(loss)])[0] / self.world.size
        self.step, self.final_loss = step, float(loss)
        if self.judge.judge(step, float(loss)) == "diverged":
            self.divergence = self.judge.stop(step, float(loss), self.checkpoints, self.is_main)
        if self._metrics is None:
            if self.divergence is not None:
                raise Diverged(self.divergence)
            return
        now = time.perf_counter()
        since, since_step = self._window
        steps = max(1, step - since_step)
        elapsed = max(now - since, 1e-9)
        wall = self._clock.total_s()
        gpu = self._gpu
        record: dict[str, Any] = {
            "step": step,
            "loss": float(loss),
            "lr": lr,
            "samples_per_s": samples / elapsed if samples is not None else None,
            "step_time_s": elapsed / steps,
            "data_wait_s": float(extra.pop("data_wait_s", 0.0) or 0.0),
            "gpu_mem_gb": gpu.peak_memory_gb() if gpu else None,
            "gpu_util": gpu.utilisation() if gpu else None,
            "cpu_util": metrics.cpu_utilisation(),
            "cost_usd": metrics.cost_usd(wall, self.contract.price_per_hour),
            "wall_s": wall,
            "time": time.time(),
            **extra,
        }
        self._metrics.write(record)
        self._window = (now, step)
        if self.total_steps and lr is not None and samples is not None:
            print(metrics.progress_line(record, self.total_steps, None), flush=True)
        if self.divergence is not None:
            self.event("diverged", **self.divergence)
            raise Diverged(self.divergence)

    def should_stop(self) -> bool:
        """True on every rank once any rank got SIGTERM/SIGINT: save, then leave the loop."""
        requested = float(self._stop.requested)
        if distributed.agree_max(self.world, [requested])[0] > 0:
            if self._stopped_by is None:
                self._stopped_by = self._stop.signal_name or "peer"
            return True
        return False

    def save(self, state: dict[str, Any], step: int) -> Path | None:
        """Checkpoint ``state`` at ``step`` atomically (rank 0 writes; every rank must call it).

        ``state`` must hold a ``model`` entry (what :meth:`resume` gives back, as saved); forja adds
        ``step``, the wall time so far and every rank's RNG state.
        """
        if "model" not in state:
            raise ValueError(
                "save(state): state needs a 'model' entry, e.g. {'model': model.state_dict(), ...}"
            )
        rngs = distributed.gather_objects(self.world, rng_state())
        self.step = step
        if not self.is_main:
            return None
        path = self.checkpoints.save(
            {**state, "step": int(step), "wall_s": self._clock.total_s(), "rng": rngs}, int(step)
        )
        if self.mirror is not None:  # the upload runs in the background; this only hands it over
            self.mirror.submit(path, int(step))
        reason = "stop" if self._stopped_by else "final" if step == self.total_steps else "interval"
        self.event("checkpoint", reason=reason, path=path.name)
        return path

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.__exit__(exc_type, exc, tb)
        if isinstance(exc, Diverged):
            self.status = "diverged"
        elif exc is not None:
            self.status = "failed"
        elif self._stopped_by is not None:
            self.status = "preempted"
            self.event(
                "preempt",
                signal=self._stopped_by,
                saved_step=self.step,
                seconds_to_save=time.monotonic() - self._stop.received_at if self._stop.received_at else None,
                **stopped_by(self.run_dir),
            )
        else:
            self.status = "completed"
            self.event("finish")
        if self.mirror is not None:
            self._finish_uploads()
        if self.is_main:
            self._finish(exc)
        if self.mirror is not None:  # the logs once more, with the last events (within the same wait)
            self.mirror.close(self.upload_wait_s)
        self._lock.close()
        if self._world is not None and exc is None:
            distributed.barrier(self._world)  # a rank leaving early must not abort a peer still finishing

    def _finish_uploads(self) -> None:
        """Wait (bounded; less when preempted) for the last upload; an event says what reached the bucket."""
        assert self.mirror is not None
        wait_s = (
            self.upload_wait_s
            if self.status == "completed"
            else min(self.upload_wait_s, PREEMPTED_UPLOAD_WAIT_S)
        )
        complete = self.mirror.close(wait_s)
        stats = self.mirror.stats
        self.event("mirror", bucket=self.mirror.url, complete=complete, uploaded_steps=stats.uploaded,
                   superseded_steps=stats.superseded, failed_attempts=stats.failed_attempts,
                   last_error=stats.last_error)  # fmt: skip

    def _finish(self, exc: BaseException | None) -> None:
        from trainer.report import history, record_failure, render, write_summary
        from trainer.summary import Summary

        for handle in (self._metrics, self._events):
            if handle is not None:
                handle.close()
        if exc is not None and not isinstance(exc, Diverged):
            record_failure(self.run_dir, exc)
            return
        past = history(self.run_dir / EVENTS)
        ckpts = self.checkpoints.list()
        wall = self._clock.total_s()
        summary = Summary(
            status=self.status,
            steps=self.step,
            total_steps=self.total_steps,
            final_loss=self.final_loss,
            wall_s=wall,
            cost_usd=metrics.cost_usd(wall, self.contract.price_per_hour),
            resumed_from_step=self.start_step if self.start_step else None,
            lost_steps=past["lost_steps"],
            preemptions=past["preemptions"],
            stops=past["stops"],
            restarts=past["restarts"],
            last_checkpoint=ckpts[-1].name if ckpts else None,
            world_size=self.world.size,
            script=sys.argv[0],
            exit_code=self.exit_code,
            error=str(exc) if exc is not None else None,
            divergence=self.divergence,
            time=time.time(),
        )
        write_summary(self.run_dir, summary.to_dict())
        if self.render_plots and metrics.logged_any(self.run_dir / METRICS):
            try:
                render(self.run_dir)
            except Exception as exc:  # plots are insight; a missing matplotlib must not fail a finished run
                log.warning("plots not rendered (%s); `python -m trainer report --run DIR` draws them", exc)


def _main(argv: list[str]) -> int:
    """``python -m trainer.runlib resume-point DIR``: print the newest valid checkpoint (the launcher's)."""
    if len(argv) != 2 or argv[0] != "resume-point":
        print("usage: python -m trainer.runlib resume-point CHECKPOINT_DIR", file=sys.stderr)
        return BAD_CONFIG
    url = bucket_url(None)
    if url is not None:  # a fresh disk (a new VM): the bucket's newest verified checkpoint comes first
        try:
            CheckpointMirror(url, contract().run).pull_newer(CheckpointManager(Path(argv[1])))
        except (ValueError, MirrorUnavailable) as exc:
            print(f"error: {BUCKET_ENV}: {exc}", file=sys.stderr)
            return FAILED
    path = resume_point(argv[1])
    print(path or "")
    return COMPLETED


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    sys.exit(_main(sys.argv[1:]))
