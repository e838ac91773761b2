"""Before step 1: is any rank, or any link between ranks, far slower than the others?

A GPU that throttles, a bad PCIe slot or a link that fell back from NVLink or InfiniBand makes a
whole synchronous job as slow as its slowest rank, from the first step to the last. Each rank
times, between barriers (so one phase's lag does not leak into the next):

- a short square matmul (:data:`MATMUL_N`, repeated :data:`MATMUL_REPEATS` times after one
  warm-up), in bf16 on a GPU, fp32 on a CPU: its compute;
- a fixed-size message (:data:`MESSAGE_BYTES`) from the previous rank while it sends one to the
  next (the ring ``rank - 1 -> rank -> rank + 1``, after a small warm-up message that sets the
  pair's links up): the link from ``rank - 1``. A slow link slows its receiver; a rank whose
  network is slow slows both its links, so both neighbours' times name it;
- one all-reduce of the same size: the job's collective, which every rank waits out together.

Every rank gathers them (one small collective) and finds the same slow ones: a rank whose
matmul, or a link whose message, took more than ``factor`` times the median of the other
ranks' (the others': with two ranks, the median of all could never be half of either). Rank 0
prints the ``preflight`` event, and a ``preflight: ...`` line for each slow one. With
``preflight.fail``, every rank raises ``Restart`` (the job exits 138 and is retried, the slow
rank's node counted as a fault: ``trainer.health.nodes``) instead of training at the slow rank's
pace. On by default on GPUs (``preflight.enabled: auto``); its cost is printed in the event
(``elapsed_s``) and measured by ``bench/preflight.py``.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from trainer import distributed as dist_
from trainer.config import PreflightConfig
from trainer.contract import PREFLIGHT
from trainer.health.restart import Restart, place
from trainer.health.watchdog import where

log = logging.getLogger(__name__)

#: The square matmul's side and how often it runs (after one warm-up), by device type.
MATMUL_N = {"cuda": 8192, "cpu": 384}
MATMUL_REPEATS = {"cuda": 20, "cpu": 8}
#: The neighbour's message and the all-reduce, in bytes (fp32 elements), by device type.
MESSAGE_BYTES = {"cuda": 256 << 20, "cpu": 4 << 20}
WARMUP_BYTES = 4 << 10


def enabled(cfg: PreflightConfig, device: torch.device) -> bool:
    """``true``, ``false``, or ``auto``: on GPUs."""
    return cfg.enabled is True or (cfg.enabled == "auto" and device.type == "cuda")


def run_preflight(
    cfg: PreflightConfig, rank: int, world_size: int, device: torch.device, report: Any
) -> dict[str, Any] | None:
    """The pre-flight on every rank (collective); the event's fields, or None when it is off.
    Raises Restart on every rank when ``cfg.fail`` and a rank or link is slow."""
    if not enabled(cfg, device):
        return None
    started = time.perf_counter()
    kind = "cuda" if device.type == "cuda" else "cpu"
    dist_.barrier("pre-flight")
    matmul_s = _time_matmul(device, MATMUL_N[kind], MATMUL_REPEATS[kind])
    numel = MESSAGE_BYTES[kind] // 4
    link_s = allreduce_s = None
    if _grouped(world_size):
        dist_.barrier("pre-flight")
        _exchange(device, WARMUP_BYTES // 4, rank, world_size)
        dist_.barrier("pre-flight")
        link_s = _exchange(device, numel, rank, world_size)
        dist_.barrier("pre-flight")
        payload = torch.ones(numel, device=device)
        allreduce_s = _timed(device, lambda: dist_.all_reduce_sum(payload, what="pre-flight"))
    mine = {"rank": rank, **_place(), "matmul_s": matmul_s, "link_s": link_s}
    ranks = _all_gather(mine, world_size)
    fields = findings(ranks, cfg.factor)
    fields |= {
        "bytes": numel * 4,
        "allreduce_s": allreduce_s,
        "elapsed_s": round(time.perf_counter() - started, 4),
    }
    if rank == 0:
        report.event(PREFLIGHT, **fields)
        for slow in fields["slow"]:
            report.say(f"preflight: {describe(slow)}")
    if cfg.fail and fields["slow"]:
        first = fields["slow"][0]
        raise Restart(
            f"preflight: {describe(first)}",
            rank=first["rank"],
            node=first["node"],
            pod=first["pod"],
        )
    return fields


def findings(ranks: list[dict[str, Any]], factor: float) -> dict[str, Any]:
    """What the ranks' times say: their medians and the slow ones (pure; every rank computes
    the same from the same times)."""
    out: dict[str, Any] = {"ranks": ranks, "factor": factor, "slow": []}
    for what, key in (("matmul", "matmul_s"), ("link", "link_s")):
        times = [r[key] for r in ranks if isinstance(r.get(key), float)]
        median = statistics.median(times) if times else None
        out[f"{key.removesuffix('_s')}_median_s"] = median
        if len(times) < 2:
            continue
        for r in ranks:
            seconds = r.get(key)
            others = [x[key] for x in ranks if x is not r and isinstance(x.get(key), float)]
            median_others = statistics.median(others)
            if isinstance(seconds, float) and median_others and seconds > factor * median_others:
                slow = {
                    "rank": r["rank"],
                    "pod": r.get("pod"),
                    "node": r.get("node"),
                    "what": what,
                    "seconds": seconds,
                    "median_s": median_others,
                    "factor": round(seconds / median_others, 2),
                }
                if what == "link":
                    slow["peer"] = (r["rank"] - 1) % len(ranks)
                out["slow"].append(slow)
    return out


def describe(slow: dict[str, Any]) -> str:
    """``rank 3's matmul took 4.1 times the median on node X``, or its link's."""
    where_ = place(slow.get("node"), slow.get("pod"))
    if slow["what"] == "link":
        return (
            f"the link from rank {slow['peer']} to rank {slow['rank']} took {slow['factor']:g} "
            f"times the median ({slow['seconds']:.4f} s), rank {slow['rank']} {where_}"
        )
    return (
        f"rank {slow['rank']}'s matmul took {slow['factor']:g} times the median "
        f"({slow['seconds']:.4f} s) {where_}"
    )


def _grouped(world_size: int) -> bool:
    return world_size > 1 and dist.is_available() and dist.is_initialized()


def _place() -> dict[str, Any]:
    here = where()
    return {"pod": here["hostname"], "node": here["node"]}


def _timed(device: torch.device, fn) -> float:
    """Seconds ``fn`` takes, its device work included."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return round(time.perf_counter() - t0, 6)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_matmul(device: torch.device, n: int, repeats: int) -> float:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=device, dtype=dtype)
    torch.mm(a, b, out=out)  # warm-up: the library's handles and kernels

    def work() -> None:
        for _ in range(repeats):
            torch.mm(a, b, out=out)

    return _timed(device, work)


def _exchange(device: torch.device, numel: int, rank: int, world_size: int) -> float:
    """Send ``numel`` floats to the next rank while receiving as many from the previous one;
    returns the seconds until the message from the previous rank was here."""
    send = torch.ones(numel, device=device)
    recv = torch.empty(numel, device=device)
    ops = [
        dist.P2POp(dist.irecv, recv, (rank - 1) % world_size),
        dist.P2POp(dist.isend, send, (rank + 1) % world_size),
    ]
    with dist_.COLLECTIVES.inside("pre-flight"):
        _sync(device)
        t0 = time.perf_counter()
        received, sent = dist.batch_isend_irecv(ops)
        received.wait()
        _sync(device)
        link_s = round(time.perf_counter() - t0, 6)
        sent.wait()
    return link_s


def _all_gather(mine: dict[str, Any], world_size: int) -> list[dict[str, Any]]:
    if not _grouped(world_size):
        return [mine]
    out: list[Any] = [None] * world_size
    with dist_.COLLECTIVES.inside("pre-flight"):
        dist.all_gather_object(out, mine)
    return out
