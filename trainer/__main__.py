"""``python -m trainer [--config FILE.yaml] [key=value ...]`` — the one entrypoint everywhere.

Runbook::

    python -m trainer max_steps=100                                  # one process (CPU or 1 GPU)
    torchrun --nproc-per-node 2 -m trainer task=lm                   # N processes on one machine
    accelerate launch --multi_gpu --num_processes 2 -m trainer       # the same, through accelerate
    # A Kubeflow pod runs exactly `python -m trainer key=value ...`. In a PyTorchJob with
    # nprocPerNode > 1 (or an elastic one) it re-launches itself under torchrun (one process per
    # GPU). A Trainer v2 TrainJob sets only PET_NNODES, PET_NPROC_PER_NODE (a count or auto),
    # PET_NODE_RANK and PET_MASTER_ADDR/PORT and starts no torchrun: with more than one process
    # per pod it re-launches the same way; with one, it runs as that node's rank.

Exit codes: 0 done, 1 failure (NaN/inf loss, an exception), 2 bad configuration,
138 a peer rank was lost (128 + SIGUSR1: the operator's code for a user-defined retryable
error; this process is fine, the job should be retried),
143 preempted (SIGTERM; a checkpoint was written, so the operator's retry resumes).
Under restartPolicy ExitCode the operator retries 130, 137, 138 and 143 and fails on the rest.

This module parses the command line and dispatches: the re-launch is ``trainer.launch``'s, the
run ``trainer.train``'s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import traceback

from trainer.config import ConfigError, TrainConfig, load_config
from trainer.contract import EXIT_CONFIG, EXIT_FAILED, EXIT_PREEMPTED, LOCAL_RANK, METRICS_DIR_ENV
from trainer.launch import (
    check_before_relaunch,
    exit_preempted,
    needs_torchrun,
    record_config_problems,
    record_exit,
    relaunch_under_torchrun,
    take_trainjob_place,
)


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


def _serve_workers_metrics(cfg: TrainConfig) -> dict[str, str]:
    """Where the pod serves metrics: serve its torchrun workers' from this process, which
    outlives them; what the workers' environment needs for it (nothing where none are served)."""
    from trainer.telemetry import metrics

    port = metrics.serving_port(cfg.prometheus.serve, cfg.prometheus.port)
    if port is None:
        return {}
    env = metrics.worker_environment(port)
    metrics.serve(port, workers_dir=env[METRICS_DIR_ENV])
    return env


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        if needs_torchrun():
            # This process only re-launches: it never imports torch (seconds of CPU, and memory
            # it would hold while the workers train).
            check_before_relaunch(cfg)
            worker_env = _serve_workers_metrics(cfg)
            try:
                return relaunch_under_torchrun(argv, worker_env=worker_env)
            finally:  # the workers' metrics folder: a restarted container's /tmp keeps it
                if METRICS_DIR_ENV in worker_env:
                    shutil.rmtree(worker_env[METRICS_DIR_ENV], ignore_errors=True)
        take_trainjob_place()
        from trainer.train import run

        code = record_exit(run(cfg))
        if code == EXIT_PREEMPTED:
            exit_preempted()
        return code
    except ConfigError as e:
        if args.debug:
            traceback.print_exc()
        # Every process of a node finds the same mistake: the re-launching parent says it once,
        # or, under a torchrun of someone else's, local rank 0.
        if not record_config_problems(e.problems) and os.environ.get(LOCAL_RANK, "0") == "0":
            for line in e.problems:
                print(line, file=sys.stderr)
        return record_exit(EXIT_CONFIG)
    except Exception:
        traceback.print_exc()
        return record_exit(EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
