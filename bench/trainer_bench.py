"""Trainer throughput side by side: ddpjob's trainer vs a minimal DDP loop vs HF Accelerate.

    python bench/trainer_bench.py                    # 2 gloo ranks on CPU, 7 rounds
    python bench/trainer_bench.py --rounds 9 --steps 300 --json bench-trainer.json
    python bench/trainer_bench.py ddp.gradient_as_bucket_view=false   # trainer settings

Same model (the ``vision`` task's SmallCNN), same generated images, same per-rank batch, fp32,
AdamW with the same two parameter groups and the same warmup+cosine schedule, no clipping, no
accumulation. One ``torchrun --nproc-per-node 2`` job runs all three contenders in the same two
processes, one after the other, for ``--rounds`` rounds (the order rotates every round). A
shared machine's load drifts over minutes; adjacent short segments in the same warm processes
see the same load, so the median of the per-round ratios is a fair comparison.

Throughput is global samples/s after ``--warmup`` steps (first iterations allocate and rebuild
DDP buckets), timed on rank 0 in windows of 10 steps. Two figures per contender: over the whole
timed span, and over its fastest window (like ``timeit``'s minimum: on a shared machine, slower
windows are mostly other processes' interference, which the fastest one suffered least).
The trainer is the real ``Trainer.fit`` (the loop ``python -m trainer`` runs); its windows come
from its own ``train`` events, so all its per-step bookkeeping is inside the figure.

Targets: trainer >= 1.0x the minimal loop and >= 1.0x Accelerate.
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


def run_trainer(cfg, env, warmup: int) -> list[float]:
    """The real Trainer.fit; window times from its own train events."""
    from trainer.tasks import load_task
    from trainer.telemetry.events import Reporter
    from trainer.train import Trainer

    out = io.StringIO()
    reporter = Reporter(env.is_main, cfg.max_steps, "never", None, stream=out)
    Trainer(cfg, env, load_task(cfg.task, cfg.task_args), reporter).fit()
    events = [json.loads(x) for x in out.getvalue().splitlines() if x.startswith("{")]
    return [
        e["step_time_s"] * LOG_EVERY for e in events if e["event"] == "train" and e["step"] > warmup
    ]


def _timed_loop(cfg, warmup: int, loader, sampler, step_fn) -> list[float]:
    """Run ``step_fn`` over epochs for max_steps; seconds per LOG_EVERY steps after warmup."""
    step, epoch, windows, t0 = 0, 0, [], 0.0
    while step < cfg.max_steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for batch in loader:
            step_fn(batch)
            step += 1
            if step >= warmup and step % LOG_EVERY == 0:
                now = time.perf_counter()
                if step > warmup:
                    windows.append(now - t0)
                t0 = now
            if step == cfg.max_steps:
                break
        epoch += 1
    return windows


def run_minimal(cfg, env, warmup: int) -> list[float]:
    """The loop people write by hand from the PyTorch DDP tutorial."""
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from trainer.parts.optimizer import build_optimizer, build_scheduler

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

    return _timed_loop(cfg, warmup, loader, sampler, step)


def run_accelerate(cfg, env, warmup: int) -> list[float]:
    """The same loop through HF Accelerate (MULTI_CPU over the same gloo group)."""
    import torch.nn.functional as F
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from trainer.parts.optimizer import build_optimizer, build_scheduler

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
    return _timed_loop(cfg, warmup, loader, None, step)


def worker(args: argparse.Namespace) -> None:
    """One rank: every contender, round after round, in this same process."""
    import torch.distributed as dist

    from trainer import distributed

    env = distributed.setup("cpu", "gloo", 600)
    runners = {"trainer": run_trainer, "minimal": run_minimal, "accelerate": run_accelerate}
    results: dict[str, list[list[float]]] = {n: [] for n in CONTENDERS}
    window_samples = LOG_EVERY * args.batch_size * env.world_size
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(args, tmp)
        for r in range(args.rounds):
            order = CONTENDERS[r % 3 :] + CONTENDERS[: r % 3]
            for name in order:
                dist.barrier()
                windows = runners[name](cfg, env, args.warmup)
                results[name].append(windows)
                if env.is_main:
                    print(
                        f"round {r + 1}/{args.rounds} {name:>10}: "
                        f"{window_samples * len(windows) / sum(windows):8.1f} samples/s",
                        file=sys.stderr,
                        flush=True,
                    )
    if env.is_main:
        print(json.dumps({"rounds": results, "window_samples": window_samples}), flush=True)
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
    ap.add_argument("--rounds", type=int, default=7)
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
    raw = next(json.loads(x) for x in p.stdout.splitlines() if x.startswith('{"rounds"'))
    n = raw["window_samples"]
    # Per round: the whole timed span, and its fastest window (the least disturbed by others).
    span = {k: [n * len(w) / sum(w) for w in rounds] for k, rounds in raw["rounds"].items()}
    best = {k: [n / min(w) for w in rounds] for k, rounds in raw["rounds"].items()}
    report = {}
    for label, per_round in (("span", span), ("best window", best)):
        med = {k: statistics.median(v) for k, v in per_round.items()}
        ratio = {
            other: statistics.median(
                t / o for t, o in zip(per_round["trainer"], per_round[other], strict=True)
            )
            for other in ("minimal", "accelerate")
        }
        report[label] = {"samples_per_s": med, "rounds": per_round, "trainer_vs": ratio}
    print(
        f"\nvision SmallCNN, {args.ranks} gloo ranks on CPU, batch {args.batch_size}/rank, "
        f"fp32, {args.steps} steps ({args.warmup} warmup), {args.rounds} rounds; "
        "median over rounds"
    )
    print(
        f"{'samples/s':>12} {'trainer':>10} {'minimal':>10} {'accelerate':>10}"
        f" {'vs minimal':>11} {'vs accel.':>10}"
    )
    for label, r in report.items():
        m, v = r["samples_per_s"], r["trainer_vs"]
        print(
            f"{label:>12} {m['trainer']:10.1f} {m['minimal']:10.1f} {m['accelerate']:10.1f}"
            f" {v['minimal']:10.3f}x {v['accelerate']:9.3f}x"
        )
    print("targets: >= 1.00x the minimal loop, >= 1.00x Accelerate (ratios: median per round)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **report}, indent=2))


if __name__ == "__main__":
    main()
