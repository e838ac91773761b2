"""``python -m trainer [--config FILE.yaml] [key=value ...]`` — the one entrypoint everywhere.

Runbook::

    python -m trainer max_steps=100                                  # one process (CPU or 1 GPU)
    torchrun --nproc-per-node 2 -m trainer task=lm                   # N processes on one machine
    accelerate launch --multi_gpu --num_processes 2 -m trainer       # the same, through accelerate
    # A Kubeflow pod runs exactly `python -m trainer key=value ...`. In a PyTorchJob with
    # nprocPerNode > 1 (or an elastic one) it re-launches itself under torchrun (one process per
    # GPU). In a Trainer v2 TrainJob, which sets only PET_NNODES, PET_NPROC_PER_NODE (a count or
    # auto), PET_NODE_RANK and PET_MASTER_ADDR/PORT and starts no torchrun, it always does.

Exit codes: 0 done, 1 failure (NaN/inf loss, an exception), 2 bad configuration,
138 a peer rank was lost (128 + SIGUSR1: the operator's code for a user-defined retryable
error; this process is fine, the job should be retried),
143 preempted (SIGTERM; a checkpoint was written, so the operator's retry resumes).
Under restartPolicy ExitCode the operator retries 130, 137, 138 and 143 and fails on the rest.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from trainer.config import ConfigError, TrainConfig, load_config
from trainer.contract import (
    COMPLETED,
    DONE,
    ERROR,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_FILE_ENV,
    EXIT_OK,
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    EXIT_STALE_RENDEZVOUS,
    LAUNCHED_AT_ENV,
    LOCAL_RANK,
    PEER_LOST,
    PREEMPTED,
)
from trainer.launch import record_exit

if TYPE_CHECKING:  # this module runs without torch in the re-launching parent
    from trainer.distributed import DistEnv
    from trainer.tasks import Task
    from trainer.telemetry.events import Reporter


def exit_preempted() -> NoReturn:
    """Leave at once with 143 once preempted: the checkpoint is written and fsynced, the group
    torn down and every line flushed. What is left is the interpreter's own teardown of torch,
    which can take seconds on a loaded node; under torchrun the worker and torchrun take theirs
    one after the other, inside the pod's grace period (Kubernetes' default: 30 s), past which
    the kubelet's SIGKILL makes the exit 137."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_PREEMPTED)


def relaunch_exit_code(rc: int, worker_codes: list[int]) -> int:
    """The pod's exit code after torchrun: a worker's real failure beats a retryable one (the
    peers of a crashed rank only lost a peer), and a retryable one beats torchrun's plain 1. A
    rendezvous still stale after the last attempt is a lost peer to the operator."""
    if rc == 0:
        return 0
    permanent = [c for c in worker_codes if c in (EXIT_FAILED, EXIT_CONFIG)]
    if permanent:
        return permanent[0]
    if worker_codes:
        return EXIT_PEER_LOST if worker_codes[0] == EXIT_STALE_RENDEZVOUS else worker_codes[0]
    return rc


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Train with DDP. Precedence: key=value > --config file > defaults.",
    )
    parser.add_argument("--config", help="YAML file with TrainConfig keys")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for config errors")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides, e.g. lr=3e-4 checkpoint.every_steps=50",
    )
    return parser.parse_args(argv)


def relaunch_under_torchrun(argv: list[str]) -> int:
    """Run this same command as ``PET_NPROC_PER_NODE`` processes under the real torchrun.

    SIGTERM/SIGINT are forwarded (torchrun passes them on to the workers, which checkpoint and
    exit 143). torchrun itself reports a signalled shutdown as a plain failure, so a forwarded
    SIGTERM followed by a non-zero exit is reported as 143: retryable, as preemption should be.
    When the workers found the rendezvous they were started from already over
    (``EXIT_STALE_RENDEZVOUS``, see ``trainer.distributed._join_watchdog``), torchrun starts
    again here, at once, instead of the container restarting.
    """
    from trainer.health.ledger import process_started_at
    from trainer.launch import RENDEZVOUS_ATTEMPTS, rendezvous_was_stale, torchrun_argv

    exit_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"ddpjob-exit-{os.getpid()}"
    # The workers' ledger counts start-up from the container's start (this process's), not theirs.
    launched = {LAUNCHED_AT_ENV: repr(process_started_at())}
    received: list[int] = []
    proc: subprocess.Popen | None = None

    def forward(signum: int, frame) -> None:
        received.append(signum)
        if proc is not None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for attempt in range(1, RENDEZVOUS_ATTEMPTS + 1):
        exit_file.unlink(missing_ok=True)
        env = {**os.environ, EXIT_FILE_ENV: str(exit_file), **launched}
        proc = subprocess.Popen(torchrun_argv(argv), env=env)
        rc = proc.wait()
        try:
            codes = [int(line) for line in exit_file.read_text().split()]
            exit_file.unlink()
        except (OSError, ValueError):
            codes = []
        if received or not rendezvous_was_stale(codes) or attempt == RENDEZVOUS_ATTEMPTS:
            break
        print(
            f"torchrun's workers found their rendezvous already over; starting torchrun again "
            f"(attempt {attempt + 1} of {RENDEZVOUS_ATTEMPTS})",
            file=sys.stderr,
            flush=True,
        )
    if rc != 0 and signal.SIGTERM in received:
        exit_preempted()
    rc = rc if rc >= 0 else 128 - rc  # killed by a signal: the shell's convention
    return relaunch_exit_code(rc, codes)


def _fit(cfg: TrainConfig, env: DistEnv, task: Task, reporter: Reporter) -> str:
    """Build the trainer and train. The trainer, whose DDP module holds the process group, is
    garbage once this returns: nothing else may keep it."""
    from trainer.train import Trainer

    trainer = Trainer(cfg, env, task, reporter)
    # From fit on until the group is gone, SIGTERM only asks the trainer to stop (fit restores
    # this handler, its own). A rank whose pod is deleted just after another rank stopped the
    # run waits past fit in the barrier for a rank still writing its checkpoint or its last
    # progress; the default action would kill it there, and that rank would lose its peer in
    # the barrier and report peer_lost after preempted. The handler holds only the stop flag.
    signal.signal(signal.SIGTERM, trainer.stop.on_sigterm)
    return trainer.fit()


def train(cfg: TrainConfig) -> int:
    """Join the job, train, and map the outcome to an exit code. Always leaves the group."""
    from trainer import distributed
    from trainer.tasks import load_task
    from trainer.telemetry.events import Reporter

    task = load_task(cfg.task, cfg.task_args)  # a bad task is a config error: before joining
    env = distributed.setup(cfg.device, cfg.backend, cfg.timeout_s)
    logging.basicConfig(
        level=logging.INFO if env.is_main else logging.WARNING,
        format=f"[rank {env.rank}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if not env.is_main:
        # Rank 0 says who it is in its `start` event; the other ranks print nothing else unless
        # something goes wrong, so one line here tells every rank's log (`logs --all`, `kubectl
        # logs` of a worker) that the rank started, joined and where.
        print(
            f"[rank {env.rank}] joined: rank {env.rank} of {env.world_size} (local rank "
            f"{env.local_rank}) on {socket.gethostname()}, device {env.device}",
            file=sys.stderr,
            flush=True,
        )
    reporter = Reporter(env.is_main, cfg.max_steps, cfg.progress, cfg.tensorboard_dir)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        reason = _fit(cfg, env, task, reporter)
        # Leave together: a rank that destroys its group while a peer is still talking to it
        # can make the peer abort (exit 134) after a run that had finished well.
        distributed.barrier()
    except Exception as e:
        # The traceback's frames hold the trainer, whose DDP module holds the process group:
        # their locals go, so that teardown can free the group (the lines stay printable).
        traceback.clear_frames(e.__traceback__)
        if isinstance(e, ConfigError):
            raise
        lost = distributed.is_peer_lost(e)
        reporter.event(
            DONE,
            step=None,
            max_steps=cfg.max_steps,
            loss=None,
            elapsed_s=None,
            reason=PEER_LOST if lost else ERROR,
            error=f"{type(e).__name__}: {e}",
        )
        if lost:
            print(
                f"[rank {env.rank}] lost a peer ({type(e).__name__}: {str(e)[:200]}); exiting "
                f"{EXIT_PEER_LOST} so the job is retried and resumes from its last checkpoint",
                file=sys.stderr,
                flush=True,
            )
            sys.stdout.flush()
            # Skip the group's teardown: destroying it with a dead peer can hang or abort.
            os._exit(record_exit(EXIT_PEER_LOST))
        raise
    finally:
        distributed.teardown()
        signal.signal(signal.SIGTERM, previous)
    return {COMPLETED: EXIT_OK, PREEMPTED: EXIT_PREEMPTED}.get(reason, EXIT_FAILED)


#: Tasks the trainer ships (``trainer.tasks.load_task``).
BUILTIN_TASKS = ("vision", "lm")


def _check_task_module(name: str) -> None:
    """A plug-in task's module exists (``importlib.util.find_spec``: nothing of it runs), or a
    ConfigError says so as ``load_task`` would."""
    if name in BUILTIN_TASKS:
        return
    module_name = name.partition(":")[0]
    try:
        found, missing = importlib.util.find_spec(module_name), module_name
    except ModuleNotFoundError as e:  # a parent package is missing
        found, missing = None, e.name
    if found is None:
        raise ConfigError([f"task: cannot import {missing} (got {name}). Is it on PYTHONPATH?"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        from trainer.launch import needs_torchrun

        if needs_torchrun():
            # This process only re-launches: it never imports torch (seconds of CPU, and memory
            # it would hold while the workers train). What can be checked without torch fails
            # here, once, before torchrun; the factory's own arguments are the workers' to check.
            _check_task_module(cfg.task)
            named = cfg.resume not in ("auto", "never") and "://" not in cfg.resume
            if named and not Path(cfg.resume).exists():
                raise ConfigError([f"resume: no such checkpoint (got {cfg.resume})"])
            return relaunch_under_torchrun(argv)
        code = record_exit(train(cfg))
        if code == EXIT_PREEMPTED:
            exit_preempted()
        return code
    except ConfigError as e:
        if args.debug:
            traceback.print_exc()
        # Every process of a node finds the same mistake: one of them says it.
        if os.environ.get(LOCAL_RANK, "0") == "0":
            for line in e.problems:
                print(line, file=sys.stderr)
        return record_exit(EXIT_CONFIG)
    except Exception:
        traceback.print_exc()
        return record_exit(EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
