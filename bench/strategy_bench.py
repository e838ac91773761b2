"""Memory and speed of strategy fsdp against ddp: the same model, the same run, side by side.

    python bench/strategy_bench.py                      # 2 and 4 ranks, lm 8 x 384 (14M params)
    python bench/strategy_bench.py --ranks 2 --layers 12 --width 384 --steps 20

For each world size, the real Trainer trains the lm task on that many gloo ranks on CPU, once
with ``strategy=ddp`` and once with ``strategy=fsdp`` (``mp.spawn``; each rank a process of its
own). Every rank measures what it holds:

- **model state**: the bytes of its parameters, of its gradients at the optimizer step (their
  peak: all of them exist then) and of its optimizer state, as tensors it owns (a DTensor's local
  shard under fsdp; the whole under ddp). The figure is rank 0's; every rank's is within a shard's
  rounding of it.
- **peak RSS**: the process's peak resident memory through the last training step (before the
  run's final checkpoint copies the state), and that peak above what it held before the model
  was built (torch's own libraries are the rest). On CPU it also counts the activations, the
  allocator's free pages and, under fsdp, the whole model as it was built before sharding.
- **speed**: optimizer steps per second over the steps after the first two (warm-up).

Ratios, fsdp over ddp at each world size: model state (target: <= 1.2 / world size), peak RSS
above the start, steps per second. Exit status 1 if a model-state ratio misses its target.
On CPU the speed ratio is gloo's collectives on shared cores; a GPU's figures are the GPU
check's (bench/gpu, docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.local.processes import free_port  # noqa: E402

#: fsdp's model state per rank over ddp's may be at most this over the world size.
TARGET = 1.2
MiB = 1 << 20


def _rss_bytes() -> int:
    """This process's resident memory now."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _owned(tensors: Any) -> int:
    """Bytes of the tensors this rank holds (a DTensor's local shard)."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _rank(rank: int, world: int, port: int, out: str, settings: dict[str, Any]) -> None:
    """One rank: train, measuring what it holds; rank 0 writes the figures."""
    import torch

    from trainer import distributed

    os.environ |= {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }
    torch.set_num_threads(1)
    env = distributed.setup("cpu", "gloo", 300)
    try:
        figures = _train(settings, env)
        if rank == 0:
            Path(out).write_text(json.dumps(figures))
    finally:
        distributed.teardown()  # the trainer, which holds the group, is gone by now


def _train(settings: dict[str, Any], env: Any) -> dict[str, Any]:
    import torch

    from trainer.config import build_config
    from trainer.tasks import load_task
    from trainer.telemetry.events import Reporter
    from trainer.train import Trainer

    start_rss = _rss_bytes()
    cfg = build_config(settings)
    task = load_task(cfg.task, cfg.task_args)
    trainer = Trainer(cfg, env, task, Reporter(False, 0, "never", None))
    params = list(trainer.raw_model.parameters())
    grads_peak, peak_rss, times = 0, 0, []

    def before_step(*_: Any) -> None:  # all gradients exist now
        nonlocal grads_peak, peak_rss
        grads_peak = max(grads_peak, _owned(p.grad for p in params if p.grad is not None))
        # The peak so far: training's, before the run's last checkpoint copies the state.
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        times.append(time.perf_counter())

    trainer.optimizer.register_step_pre_hook(before_step)
    assert trainer.fit() == "completed"
    moments = [v for s in trainer.optimizer.state.values() for v in s.values()]
    figures = {
        "params": _owned(params),
        "grads": grads_peak,
        "optimizer": _owned(v for v in moments if torch.is_tensor(v)),
        "peak_rss": peak_rss,
        "start_rss": start_rss,
        "steps_per_s": (len(times) - 3) / (times[-1] - times[2]),
    }
    figures["state"] = figures["params"] + figures["grads"] + figures["optimizer"]
    return figures


def measure(world: int, strategy: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        settings = {
            "task": "lm",
            "task_args": {"n_layer": args.layers, "n_embd": args.width, "block_size": 64},
            "strategy": strategy,
            "device": "cpu",
            "backend": "gloo",
            "max_steps": args.steps,
            "batch_size": 4,
            "log_every": args.steps,
            "eval_batches": 1,
            "progress": "never",
            "checkpoint": {"dir": f"{tmp}/ckpt", "every_steps": 0},
        }
        out = f"{tmp}/figures.json"
        mp.spawn(_rank, args=(world, free_port(), out, settings), nprocs=world)
        return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args(argv)

    from trainer.sizing import parameter_count

    count = parameter_count("lm", {"n_layer": args.layers, "n_embd": args.width, "block_size": 64})
    print(f"lm task, {args.layers} blocks of width {args.width}: {count / 1e6:.1f}M parameters")
    print(
        "ranks  strategy  params MiB  grads MiB  optim MiB  state MiB  peak RSS MiB  (+start)"
        "  steps/s"
    )
    failed = False
    for world in args.ranks:
        got = {s: measure(world, s, args) for s in ("ddp", "fsdp")}
        for strategy, f in got.items():
            print(
                f"{world:>5}  {strategy:>8}  {f['params'] / MiB:9.1f}  {f['grads'] / MiB:9.1f}  "
                f"{f['optimizer'] / MiB:9.1f}  {f['state'] / MiB:9.1f}  "
                f"{f['peak_rss'] / MiB:12.0f}  {(f['peak_rss'] - f['start_rss']) / MiB:8.0f}  "
                f"{f['steps_per_s']:7.2f}"
            )
        ddp, fsdp = got["ddp"], got["fsdp"]
        state = fsdp["state"] / ddp["state"]
        rss = (fsdp["peak_rss"] - fsdp["start_rss"]) / (ddp["peak_rss"] - ddp["start_rss"])
        speed = fsdp["steps_per_s"] / ddp["steps_per_s"]
        target = TARGET / world
        ok = state <= target
        failed |= not ok
        print(
            f"  {world} ranks, fsdp / ddp: model state {state:.3f} (target <= {target:.3f}: "
            f"{'ok' if ok else 'MISSED'}), peak RSS above start {rss:.2f}, steps/s {speed:.2f}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
