"""Trainer throughput side by side: ddpjob's trainer vs a minimal DDP loop vs HF Accelerate.

    python bench/trainer_bench.py                    # 2 gloo ranks on CPU, 5 rounds
    python bench/trainer_bench.py --rounds 9 --steps 300 --json bench-trainer.json
    python bench/trainer_bench.py ddp.gradient_as_bucket_view=false   # trainer settings

Same model (the ``vision`` task's SmallCNN), same generated images, same per-rank batch, fp32,
AdamW with the same two parameter groups and the same warmup+cosine schedule, no clipping, no
accumulation. One ``torchrun --nproc-per-node 2`` job runs all three contenders in the same two
processes, one after the other, for ``--rounds`` rounds (the order rotates every round). A
shared machine's load drifts over minutes; adjacent short segments in the same warm processes
see the same load, so the median of the per-round ratios is a fair comparison.

Throughput is global samples/s over the steps after ``--warmup`` (first iterations allocate and
rebuild DDP buckets), measured on rank 0. The trainer is the real ``Trainer.fit`` (the loop
``python -m trainer`` runs); its figure comes from its own ``train`` events (window time over
samples), so all its per-step bookkeeping is inside the figure.

Targets: trainer >= 0.97x the minimal loop and >= 1.0x Accelerate.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TASK_ARGS = {"image_size": 16, "width": 32, "train_size": 8192}
CONTENDERS = ("trainer", "minimal", "accelerate")
LOG_EVERY = 10


def _config(args: argparse.Namespace, ckpt_dir: str):
    from trainer.config import build_config

    return build_config(
        {
            "task": "vision",
            "task_args": TASK_ARGS,
            "max_steps": args.steps,
            "batch_size": args.batch_size,
            "lr": 1e-3,
            "grad_clip": 0,
            "log_every": LOG_EVERY,
            "eval_batches": 1,
            "progress": "never",
            "resume": "never",
            "device": "cpu",
            "checkpoint": {"dir": ckpt_dir, "every_steps": 0},
        },
        args.trainer_args,
    )


def _parts(cfg):
    """What the hand-written contenders share with the trainer: model, data, optimizer, schedule."""
    import torch

    from trainer.tasks.vision import VisionTask

    task = VisionTask(**TASK_ARGS)
    torch.manual_seed(cfg.seed)
    model = task.build_model()
    train, _ = task.build_datasets()
    return model, train


def run_trainer(cfg, env, warmup: int) -> float:
    """The real Trainer.fit; throughput from its own train events."""
    from trainer.metrics import Reporter
    from trainer.tasks import load_task
    from trainer.train import Trainer

    out = io.StringIO()
    reporter = Reporter(env.is_main, cfg.max_steps, "never", None, stream=out)
    Trainer(cfg, env, load_task(cfg.task, cfg.task_args), reporter).fit()
    samples = seconds = 0.0
    prev = 0
    for line in out.getvalue().splitlines():
        e = json.loads(line) if line.startswith("{") else {}
        if e.get("event") != "train":
            continue
        steps, prev = e["step"] - prev, e["step"]
        if e["step"] > warmup:
            seconds += e["step_time_s"] * steps
            samples += e["samples_per_s"] * e["step_time_s"] * steps
    return samples / seconds if seconds else 0.0


def _timed_loop(cfg, warmup: int, loader, sampler, step_fn, world: int) -> float:
    """Run ``step_fn`` over epochs for max_steps; samples/s after the warmup steps."""
    step, epoch = 0, 0
    while step < cfg.max_steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for batch in loader:
            step_fn(batch)
            step += 1
            if step == warmup:
                t0 = time.perf_counter()
            if step == cfg.max_steps:
                break
        epoch += 1
    return (cfg.max_steps - warmup) * cfg.batch_size * world / (time.perf_counter() - t0)


def run_minimal(cfg, env, warmup: int) -> float:
    """The loop people write by hand from the PyTorch DDP tutorial."""
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from trainer.optim import build_optimizer, build_scheduler

    model, train = _parts(cfg)
    ddp = DDP(model)
    opt = build_optimizer(model, cfg, env.world_size, env.device)
    sched = build_scheduler(opt, cfg)
    sampler = DistributedSampler(train, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(train, batch_size=cfg.batch_size, sampler=sampler, drop_last=True)

    def step(batch):
        x, y = batch
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()

    return _timed_loop(cfg, warmup, loader, sampler, step, env.world_size)


def run_accelerate(cfg, env, warmup: int) -> float:
    """The same loop through HF Accelerate (MULTI_CPU over the same gloo group)."""
    import torch.nn.functional as F
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from trainer.optim import build_optimizer, build_scheduler

    acc = Accelerator(cpu=True)
    model, train = _parts(cfg)
    opt = build_optimizer(model, cfg, acc.num_processes, env.device)
    # Not prepared: Accelerate's scheduler wrapper steps num_processes times per step, which
    # would change the schedule. Stepping our own keeps the math identical.
    sched = build_scheduler(opt, cfg)
    loader = DataLoader(train, batch_size=cfg.batch_size, shuffle=True, drop_last=True)
    model, opt, loader = acc.prepare(model, opt, loader)

    def step(batch):
        x, y = batch
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        acc.backward(loss)
        opt.step()
        sched.step()

    # Accelerate's loader reshuffles per epoch by itself.
    return _timed_loop(cfg, warmup, loader, None, step, acc.num_processes)


def worker(args: argparse.Namespace) -> None:
    """One rank: every contender, round after round, in this same process."""
    import torch.distributed as dist

    from trainer import distributed

    env = distributed.setup("cpu", "gloo", 600)
    runners = {"trainer": run_trainer, "minimal": run_minimal, "accelerate": run_accelerate}
    results: dict[str, list[float]] = {n: [] for n in CONTENDERS}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(args, tmp)
        for r in range(args.rounds):
            order = CONTENDERS[r % 3 :] + CONTENDERS[: r % 3]
            for name in order:
                dist.barrier()
                results[name].append(runners[name](cfg, env, args.warmup))
                if env.is_main:
                    print(
                        f"round {r + 1}/{args.rounds} {name:>10}: "
                        f"{results[name][-1]:8.1f} samples/s",
                        file=sys.stderr,
                        flush=True,
                    )
    if env.is_main:
        print(json.dumps({"rounds": results}), flush=True)
    distributed.teardown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--warmup", type=int, default=50, help="steps excluded from the timing")
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--ranks", type=int, default=2, help="gloo ranks (processes)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument(
        "trainer_args",
        nargs="*",
        metavar="key=value",
        help="extra trainer settings, e.g. ddp.gradient_as_bucket_view=false",
    )
    args = ap.parse_args()
    if args.warmup % LOG_EVERY or args.steps <= args.warmup:
        ap.error(f"--warmup: a multiple of {LOG_EVERY} (the trainer's log window) below --steps")
    if args.worker:
        worker(args)
        return

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        and not k.startswith(("PET_", "TORCHELASTIC_"))
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(args.ranks),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        str(Path(__file__).resolve()),
        "--worker",
        *sys.argv[1:],
    ]
    p = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench workers failed (exit {p.returncode})")
    results = next(json.loads(x) for x in p.stdout.splitlines() if x.startswith('{"rounds"'))
    results = results["rounds"]
    med = {n: statistics.median(v) for n, v in results.items()}
    ratio = {
        other: statistics.median(
            t / o for t, o in zip(results["trainer"], results[other], strict=True)
        )
        for other in ("minimal", "accelerate")
    }
    print(
        f"\nvision SmallCNN, {args.ranks} gloo ranks on CPU, batch {args.batch_size}/rank, "
        f"fp32, {args.steps} steps ({args.warmup} warmup), {args.rounds} rounds"
    )
    print(f"{'':>12} {'samples/s':>10}   (median; each round)")
    for n in CONTENDERS:
        print(f"{n:>12} {med[n]:10.1f}   " + " ".join(f"{v:.0f}" for v in results[n]))
    print(
        f"trainer / minimal loop: {ratio['minimal']:.3f}x (median of per-round ratios; "
        "target >= 0.97)"
    )
    print(f"trainer / accelerate:   {ratio['accelerate']:.3f}x (target >= 1.00)")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "samples_per_s_median": med,
                    "rounds": results,
                    "trainer_vs_minimal": ratio["minimal"],
                    "trainer_vs_accelerate": ratio["accelerate"],
                    "args": vars(args),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
