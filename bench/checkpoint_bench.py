"""Checkpoint saves against the training they interrupt, and the resume's broadcast, side by side.

    python bench/checkpoint_bench.py                    # 1 GiB of state: local dir, S3, broadcast
    python bench/checkpoint_bench.py --gib 2 --rounds 5 --only local s3
    python bench/checkpoint_bench.py --only broadcast --naive   # and one pickled broadcast_object

**Saves.** One process holds a training state of ``--gib`` GiB (float32 weights and AdamW's two
moments, in tensors of a large model's sizes). Each round saves it twice through the trainer's
own ``CheckpointManager``, into the same location: synchronously (``save`` then ``flush``: the
whole write on the step, as before saves ran in the background) and in the background (``save``
returns: the step's *stall*, the copy off the device into reused memory). Meanwhile a stand-in
for training (a matmul loop on one thread) runs until the background write completes, and its
steps are timed against steps with no write in flight: the write's cost to training beyond the
stall, on the same cores. Ratio: stall / synchronous save, the median of the rounds. Target:
<= 0.10 for both locations.

S3 is the server ``AWS_ENDPOINT_URL`` names (with ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
and ``--bucket``), or else moto's S3 server, started here (``python -m moto.server``: Python, so
far slower than a real server; the ratio, not the seconds, is the figure).

**Broadcast.** Two gloo ranks on CPU. Rank 0 holds the state; each rank reports the seconds of
``trainer.checkpoint.broadcast.broadcast_state`` and its peak RSS above what it held before (rank
1 must allocate the state itself: its figure less the state is the broadcast's own memory). With
``--naive``, the same for one ``broadcast_object`` of the whole state (pickled).

Exit status 1 if a save ratio misses the target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.local.processes import free_port  # noqa: E402

TARGET = 0.10
GiB = 1 << 30


def make_state(gib: float) -> dict:
    """A training state of ``gib`` GiB: weights and two AdamW moments, in 64 MiB tensors."""
    import torch

    per_tensor = 16 << 20  # float32 elements: 64 MiB
    n = max(1, math.ceil(gib * GiB / 4 / per_tensor / 3))
    model = {f"layer{i}.weight": torch.randn(per_tensor) for i in range(n)}
    opt = {
        i: {
            "step": torch.tensor(10.0),
            "exp_avg": torch.randn(per_tensor),
            "exp_avg_sq": torch.rand(per_tensor),
        }
        for i in range(n)
    }
    return {
        "model": model,
        "optimizer": {"state": opt, "param_groups": [{"lr": 1e-3, "params": list(range(n))}]},
        "step": 10,
        "epoch": 0,
        "batch_in_epoch": 10,
        "world_size": 1,
        "rng": [{"torch": torch.get_rng_state()}],
    }


def state_bytes(state: dict) -> int:
    tensors = list(state["model"].values())
    tensors += [t for s in state["optimizer"]["state"].values() for t in s.values()]
    return sum(t.numel() * t.element_size() for t in tensors)


class Training:
    """A stand-in for training steps on one thread: matmuls, each step timed."""

    def __init__(self):
        import torch

        torch.set_num_threads(1)
        self.a, self.b = torch.randn(384, 384), torch.randn(384, 384)

    def step(self) -> float:
        started = time.perf_counter()
        for _ in range(8):
            self.a = (self.a @ self.b).tanh_()
        return time.perf_counter() - started

    def steps_while(self, busy) -> list[float]:
        times = []
        while busy():
            times.append(self.step())
        return times


def save_rounds(location: str, gib: float, rounds: int) -> dict:
    from trainer.checkpoint.manager import CheckpointManager

    state = make_state(gib)
    mgr = CheckpointManager(location, keep=1, is_main=True)
    training = Training()
    baseline = [training.step() for _ in range(30)]
    out = {"location": location, "state_gib": state_bytes(state) / GiB, "rounds": []}
    step = 0
    for r in range(rounds):
        step += 1
        started = time.perf_counter()
        mgr.save(step, lambda: state)
        mgr.flush()
        sync_s = time.perf_counter() - started

        step += 1
        started = time.perf_counter()
        mgr.save(step, lambda: state)
        stall_s = time.perf_counter() - started
        finished: list[dict] = []

        def wait(finished=finished) -> None:  # the write, waited for off the training thread
            finished += mgr.flush()

        waiter = threading.Thread(target=wait)
        waiter.start()
        during = training.steps_while(waiter.is_alive)
        waiter.join()
        (done,) = finished
        result = {
            "sync_s": sync_s,
            "stall_s": stall_s,
            "write_s": done["write_s"],
            "ratio": stall_s / sync_s,
            "step_s_idle": statistics.median(baseline),
            "step_s_during_write": statistics.median(during) if during else None,
        }
        out["rounds"].append(result)
        print(f"  {location}: round {r + 1}: " + json.dumps(result), flush=True)
        baseline = [training.step() for _ in range(30)]
    out["ratio"] = statistics.median(x["ratio"] for x in out["rounds"])
    return out


# ---------------------------------------------------------------------------------------------
# S3: a server named by the environment, or moto's


def s3_location(bucket: str) -> tuple[str, subprocess.Popen | None]:
    if os.environ.get("AWS_ENDPOINT_URL"):
        return f"s3://{bucket}/bench", None
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ |= {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                server.kill()
                raise RuntimeError("moto's server did not start") from None
            time.sleep(0.2)
    import boto3

    boto3.client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/bench", server


# ---------------------------------------------------------------------------------------------
# The resume's broadcast: two gloo ranks


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def broadcast_worker(rank: int, port: int, gib: float, naive: bool, out: str) -> None:
    import torch.distributed as dist

    from trainer import distributed as distributed_
    from trainer.checkpoint.broadcast import broadcast_state

    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        state = make_state(gib) if rank == 0 else None
        dist.barrier()
        before = _peak_rss_bytes()
        started = time.perf_counter()
        got = distributed_.broadcast_object(state) if naive else broadcast_state(state)
        dist.barrier()
        seconds = time.perf_counter() - started
        result = {
            "rank": rank,
            "seconds": seconds,
            "peak_rss_above_before_gib": (_peak_rss_bytes() - before) / GiB,
            "state_gib": state_bytes(got) / GiB,
        }
        Path(out, f"{'naive' if naive else 'chunked'}-{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def broadcast_figures(gib: float, naive: bool) -> dict:
    import torch.multiprocessing as mp

    figures = {}
    for kind in ["chunked"] + (["naive"] if naive else []):
        with tempfile.TemporaryDirectory() as out:
            mp.spawn(broadcast_worker, args=(free_port(), gib, kind == "naive", out), nprocs=2)
            figures[kind] = [
                json.loads(Path(out, f"{kind}-{rank}.json").read_text()) for rank in (0, 1)
            ]
        for r in figures[kind]:
            print(f"  broadcast ({kind}): " + json.dumps(r), flush=True)
    return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="state size (default 1 GiB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=["local", "s3", "broadcast"])
    parser.add_argument("--dir", help="local checkpoint dir (default: a temp dir under /var/tmp)")
    parser.add_argument("--bucket", default="ddpjob-bench")
    parser.add_argument("--naive", action="store_true", help="also one broadcast_object")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    parts = args.only or ["local", "s3", "broadcast"]
    figures: dict = {}
    worst = 0
    if "local" in parts:
        with tempfile.TemporaryDirectory(dir=args.dir or "/var/tmp") as d:
            figures["local"] = save_rounds(str(Path(d) / "ckpt"), args.gib, args.rounds)
    if "s3" in parts:
        location, server = s3_location(args.bucket)
        try:
            figures["s3"] = save_rounds(location, args.gib, args.rounds)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
    if "broadcast" in parts:
        figures["broadcast"] = broadcast_figures(args.gib, args.naive)
    for where in ("local", "s3"):
        if where in figures:
            f = figures[where]
            ok = f["ratio"] <= TARGET
            worst = worst or (0 if ok else 1)
            sync = statistics.median(r["sync_s"] for r in f["rounds"])
            stall = statistics.median(r["stall_s"] for r in f["rounds"])
            print(
                f"{where}: {f['state_gib']:.2f} GiB: synchronous save {sync:.2f} s, stall "
                f"{stall:.3f} s: {f['ratio']:.3f} of it (target <= {TARGET}) "
                f"{'ok' if ok else 'MISSED'}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
