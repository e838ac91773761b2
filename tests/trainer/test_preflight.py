"""The pre-flight before step 1 (``trainer.health.preflight``): its rule on numbers, and real
2-rank gloo runs: every rank's times in a ``preflight`` event; a rank throttled from outside (its
process stopped nine tenths of the time, as a GPU that throttles) named with its pod, and with
``preflight.fail`` the job restarting instead of training at its pace."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import Result, common_args, follow_pods, kubeflow_env
from trainer.contract import EXIT_RESTART, PREFLIGHT
from trainer.health.preflight import describe, findings


def _rank(rank: int, matmul_s: float, link_s: float | None) -> dict:
    return {"rank": rank, "pod": f"p{rank}", "node": f"n{rank}", "matmul_s": matmul_s,
            "link_s": link_s}  # fmt: skip


def test_a_rank_or_link_over_factor_times_the_others_median_is_slow() -> None:
    ranks = [_rank(0, 1.0, 0.1), _rank(1, 1.1, 0.1), _rank(2, 3.0, 0.1), _rank(3, 1.0, 0.5)]
    got = findings(ranks, 2.0)
    assert got["matmul_median_s"] == 1.05 and got["link_median_s"] == 0.1
    matmul, link = got["slow"]
    assert (matmul["rank"], matmul["what"], matmul["node"]) == (2, "matmul", "n2")
    assert (matmul["median_s"], matmul["factor"]) == (1.0, 3.0)  # the others': 1.0, 1.1, 1.0
    assert (link["rank"], link["what"], link["peer"]) == (3, "link", 2)
    assert describe(matmul) == "rank 2's matmul took 3 times the median (3.0000 s) on node n2"
    assert describe(link).startswith("the link from rank 2 to rank 3 took 5 times the median")


def test_of_two_ranks_the_slow_one_is_named_and_one_rank_names_none() -> None:
    (slow,) = findings([_rank(0, 1.0, 0.1), _rank(1, 2.5, 0.1)], 2.0)["slow"]
    assert (slow["rank"], slow["factor"]) == (1, 2.5)
    assert findings([_rank(0, 1.0, 0.1), _rank(1, 1.9, 0.19)], 2.0)["slow"] == []
    assert findings([_rank(0, 5.0, None)], 2.0)["slow"] == []


# The throttler: stops PID nine tenths of the time until it is stopped itself (Throttle.stop
# continues PID then), or PID ends.
_THROTTLER = """
import contextlib, os, signal, sys, time
pid, on_s, off_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
try:  # woken on time, ahead of every other process: real-time, where allowed (root)
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
except PermissionError:
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, -10)
with contextlib.suppress(ProcessLookupError):
    while True:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(off_s)
        os.kill(pid, signal.SIGCONT)
        time.sleep(on_s)
"""


class Throttle:
    """Stops a process nine tenths of the time (SIGSTOP/SIGCONT), until stopped itself: what the
    process can do per second drops to a tenth or less, whatever else the machine runs.

    The stopping and continuing is a process of its own, in a session of its own, scheduled
    real-time (SCHED_FIFO, as root; else at nice -10): a thread of the test's process would
    share the niced suite's session, and even a process at nice -10 in a session of its own
    wakes late on a loaded machine (autogroups weigh sessions, not processes), so the rank
    runs on past its few milliseconds and is not held back."""

    def __init__(self, pid: int, on_s: float = 0.005, off_s: float = 0.045):
        self.pid, self.on_s, self.off_s = pid, on_s, off_s
        self.proc: subprocess.Popen | None = None

    def start(self) -> Throttle:
        argv = [sys.executable, "-c", _THROTTLER, str(self.pid), str(self.on_s), str(self.off_s)]
        self.proc = subprocess.Popen(argv, start_new_session=True)
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        self.proc.wait(timeout=60)
        self.proc = None
        with contextlib.suppress(ProcessLookupError):  # it may have been stopped last
            os.kill(self.pid, signal.SIGCONT)


def _healthy(pid: int) -> None:
    """The healthy rank ahead of the machine's other work: nice -10 (as root) where the suite
    runs niced beside the cluster's pods. Set before the process starts its threads (they
    inherit it). Otherwise, on a loaded machine, the scheduler can hold the healthy rank's few
    milliseconds of matmul up longer than the throttle holds the other's, and neither is slow."""
    with contextlib.suppress(PermissionError):  # not root: it keeps the suite's priority
        os.setpriority(os.PRIO_PROCESS, pid, -10)


def _two_pods(tmp_path: Path, throttle_rank: int | None, **overrides) -> list[Result]:
    """A 2-pod job (one rank each) with the pre-flight on; ``throttle_rank``'s process is
    throttled from its start until rank 0 prints its ``preflight`` event, and the other one
    runs ahead of the machine's other work (:func:`_healthy`)."""
    master = kubeflow_env(nproc_per_node=1, world_size=2, rank=0)
    envs = [master, {**master, "RANK": "1", "PET_NODE_RANK": "1"}]
    args = common_args(tmp_path, max_steps=2, **{"preflight.enabled": "true", **overrides})
    throttles: list[Throttle] = []

    def throttle(procs: list) -> None:
        if throttle_rank is not None:
            for i, proc in enumerate(procs):
                if i != throttle_rank:
                    _healthy(proc.pid)
            throttles.append(Throttle(procs[throttle_rank].pid).start())

    def on_event(event: dict, _: list) -> None:
        if event["event"] == PREFLIGHT:
            for t in throttles:
                t.stop()

    try:
        return follow_pods(envs, args, on_event, started=throttle)
    finally:
        for t in throttles:
            t.stop()


@pytest.mark.slow
def test_the_preflight_times_every_rank_and_names_a_throttled_one_with_its_pod(tmp_path) -> None:
    r0, r1 = _two_pods(tmp_path, throttle_rank=1)
    assert [r0.rc, r1.rc] == [0, 0], r1.stderr[-2000:]
    (event,) = r0.of(PREFLIGHT)
    assert [r["rank"] for r in event["ranks"]] == [0, 1]
    assert all(r["matmul_s"] > 0 and r["link_s"] > 0 for r in event["ranks"])
    assert event["bytes"] == 4 << 20 and event["allreduce_s"] > 0 and event["factor"] == 2.0
    slow = [s for s in event["slow"] if s["what"] == "matmul"]
    assert [(s["rank"], s["pod"]) for s in slow] == [(1, socket.gethostname())], event
    assert slow[0]["factor"] > 2.0
    assert f"preflight: rank 1's matmul took {slow[0]['factor']:g} times the median" in r0.stdout
    # It ran before the first step, and the run went on (no preflight.fail).
    events = [e["event"] for e in r0.events]
    assert events.index(PREFLIGHT) < events.index("train")
    assert r0.of("done")[0]["reason"] == "completed"


@pytest.mark.slow
def test_with_fail_a_throttled_rank_restarts_the_job_instead_of_training(tmp_path) -> None:
    r0, r1 = _two_pods(tmp_path, throttle_rank=1, **{"preflight.fail": "true"})
    assert [r0.rc, r1.rc] == [EXIT_RESTART, EXIT_RESTART], (r0.of(PREFLIGHT), r0.stderr[-2000:])
    assert r0.of("train") == []
    (done,) = r0.of("done")
    assert done["reason"] == "restart"
    assert done["cause"].startswith("preflight: rank 1's matmul took ")
    for r in (r0, r1):
        assert "preflight: rank 1's matmul took " in r.stderr and "exiting 138" in r.stderr
