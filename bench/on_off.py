"""The harness of the benches that weigh one of the trainer's parts: with it against without,
in the same run (``watchdog_bench.py``, ``metrics_bench.py``).

The real ``Trainer.fit`` on the ``vision`` task, three times per round in the same ranks (the
order rotates every round): ``on`` (the part on), ``off`` (the part off) and ``off again``,
whose ratio to the first ``off`` is the noise of the machine over the same minutes. Throughput
is global samples/s from the trainer's own ``train`` events after ``--warmup`` steps; per round,
the ratio to the first ``off``; the median over rounds.

Target: ``on`` costs no more than the noise: its median ratio to ``off`` is at least the lowest
per-round ratio of ``off`` to itself (or at least 0.99).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.local.processes import free_port  # noqa: E402

TASK_ARGS = {"image_size": 16, "width": 32, "train_size": 8192}
LOG_EVERY = 10
ROUNDS = ("on", "off", "off again")

#: Settings per round name; ``during(name, env)``: a context each run of that name is in.
Settings = dict[str, dict[str, Any]]
During = Callable[[str, Any], contextlib.AbstractContextManager]


def _config(args: argparse.Namespace, ckpt_dir: str, settings: dict[str, Any]):
    from trainer.config import build_config

    return build_config(
        {
            "task": "vision",
            "task_args": TASK_ARGS,
            "max_steps": args.steps,
            "batch_size": args.batch_size,
            "grad_clip": 0,
            "log_every": LOG_EVERY,
            "eval_batches": 1,
            "progress": "never",
            "resume": "never",
            "device": "cpu",
            "checkpoint": {"dir": ckpt_dir, "every_steps": 0},
            **settings,
        }
    )


def _samples_per_s(cfg, env, warmup: int) -> float:
    """One real Trainer.fit; global samples/s over its windows after ``warmup`` steps."""
    from trainer.tasks import load_task
    from trainer.telemetry.events import Reporter
    from trainer.train import Trainer

    out = io.StringIO()
    reporter = Reporter(env.is_main, cfg.max_steps, "never", None, stream=out)
    Trainer(cfg, env, load_task(cfg.task, cfg.task_args), reporter).fit()
    if not env.is_main:
        return 0.0
    events = [json.loads(x) for x in out.getvalue().splitlines() if x.startswith("{")]
    times = [e["step_time_s"] for e in events if e["event"] == "train" and e["step"] > warmup]
    return cfg.batch_size * env.world_size / statistics.fmean(times)


def _worker(args: argparse.Namespace, settings: Settings, during: During | None) -> None:
    import torch.distributed as dist

    from trainer import distributed

    env = distributed.setup("cpu", "gloo", 600)
    results: dict[str, list[float]] = {n: [] for n in ROUNDS}
    for r in range(args.rounds):
        for name in ROUNDS[r % 3 :] + ROUNDS[: r % 3]:
            with tempfile.TemporaryDirectory() as tmp:
                dist.barrier()
                cfg = _config(args, tmp, settings[name])
                with during(name, env) if during else contextlib.nullcontext():
                    got = _samples_per_s(cfg, env, args.warmup)
            results[name].append(got)
            if env.is_main:
                print(
                    f"round {r + 1}/{args.rounds} {name:>9}: {got:8.1f} samples/s", file=sys.stderr
                )
    if env.is_main:
        print(json.dumps({"rounds": results}), flush=True)
    distributed.teardown()


def main(
    script: str, description: str, what: str, settings: Settings, during: During | None = None
) -> int:
    """Run the bench ``script`` (the file of the caller, which torchrun starts again as the
    ranks): ``settings`` per round name; ``what``: the part, as the report names it."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=40, help="steps excluded from the timing")
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--ranks", type=int, default=2, help="gloo ranks (processes)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    if args.warmup % LOG_EVERY or args.steps <= args.warmup:
        ap.error(f"--warmup: a multiple of {LOG_EVERY} (the trainer's log window) below --steps")
    if args.worker:
        _worker(args, settings, during)
        return 0

    from trainer.contract import without_launcher

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(args.ranks),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(Path(script).resolve()),
        "--worker",
        *sys.argv[1:],
    ]
    env = without_launcher(dict(os.environ)) | {"OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench workers failed (exit {p.returncode})")
    rounds = next(json.loads(x) for x in p.stdout.splitlines() if x.startswith('{"rounds"'))[
        "rounds"
    ]
    base = rounds["off"]
    ratio = {n: [a / b for a, b in zip(rounds[n], base, strict=True)] for n in ("on", "off again")}
    on, noise = statistics.median(ratio["on"]), ratio["off again"]
    floor = min(min(noise), 0.99)
    print(
        f"\n{what}: vision SmallCNN, {args.ranks} gloo ranks on CPU, batch {args.batch_size}/rank, "
        f"{args.steps} steps ({args.warmup} warmup), log window {LOG_EVERY} steps, "
        f"{args.rounds} rounds; median over rounds"
    )
    print(f"samples/s: on {statistics.median(rounds['on']):.1f}, off {statistics.median(base):.1f}")
    print(f"on / off:        {on:.3f}x  (per round: {', '.join(f'{x:.3f}' for x in ratio['on'])})")
    print(
        f"off again / off: {statistics.median(noise):.3f}x  "
        f"(per round: {', '.join(f'{x:.3f}' for x in noise)})"
    )
    print(f"target: on / off >= {floor:.3f} (the lowest off-again ratio, or 0.99)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=2))
    return 0 if on >= floor else 1
