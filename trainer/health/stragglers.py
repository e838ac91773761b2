"""Stragglers: a rank persistently slower than the others, named.

In lockstep DDP every rank's wall time per step is the same: the fast ranks wait for the slow one
in the gradient all-reduce. So each rank measures the time it is busy (:class:`BusyTimer`): from
the step's start to the moment its last gradient bucket is ready (DDP calls the comm hook for it:
``distributed.StepFlags.on_last_bucket``), which leaves out the wait for its peers. On a GPU the
two moments are events on the stream, so the figure is the device's, read once per window.

Every log window, one small all-gather brings each rank's median busy time per step to rank 0
(:class:`Stragglers`), which compares each rank with the median of the other ranks. A rank slower
by ``straggler_factor`` for ``straggler_windows`` windows in a row is named in a ``straggler``
event (rank, pod, node, its time against the median); once it has kept up as many windows in a
row, a ``straggler`` event with ``recovered: true`` says so.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from trainer import distributed as dist_
from trainer.config import WatchdogConfig
from trainer.contract import STRAGGLER
from trainer.health.watchdog import where
from trainer.telemetry.events import Reporter


class BusyTimer:
    """This rank's busy time in each step of the window: :meth:`start` at the step's start,
    :meth:`last_bucket` from the comm hook."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.seconds: list[float] = []
        self.pending: list[tuple[Any, Any]] = []  # CUDA events, timed when the window ends
        self.started: Any = None

    def start(self) -> None:
        if self.cuda:
            self.started = torch.cuda.Event(enable_timing=True)
            self.started.record()
        else:
            self.started = time.perf_counter()

    def last_bucket(self) -> None:
        if self.started is None:
            return
        if self.cuda:
            done = torch.cuda.Event(enable_timing=True)
            done.record()
            self.pending.append((self.started, done))
        else:
            self.seconds.append(time.perf_counter() - self.started)
        self.started = None

    def take(self) -> float:
        """The window's median busy seconds per step (NaN with none); a new window starts."""
        for begun, done in self.pending:
            done.synchronize()
            self.seconds.append(begun.elapsed_time(done) / 1000.0)
        times, self.seconds, self.pending = self.seconds, [], []
        return statistics.median(times) if times else math.nan


class SlowRanks:
    """The rule: a rank whose time is ``factor`` times the median of the other ranks' or more,
    ``windows`` windows in a row, becomes slow; one slow that keeps up as many windows in a row
    is slow no more."""

    def __init__(self, factor: float, windows: int, world_size: int):
        self.factor, self.windows = factor, windows
        self.slow = [0] * world_size  # windows in a row each rank was slow
        self.fast = [0] * world_size  # ... and kept up
        self.named: set[int] = set()

    def see(self, times: list[float]) -> list[dict[str, Any]]:
        """One window's times (NaN: none); what changed: each rank that became slow, or kept
        up again (``recovered``), with its time, the median and its ratio."""
        changes = []
        for r, mine in enumerate(times):
            others = [t for q, t in enumerate(times) if q != r and math.isfinite(t)]
            if not others or not math.isfinite(mine):
                continue
            median = statistics.median(others)
            ratio = mine / median if median > 0 else math.inf
            if ratio >= self.factor:
                self.slow[r], self.fast[r] = self.slow[r] + 1, 0
            else:
                self.slow[r], self.fast[r] = 0, self.fast[r] + 1
            change = {"rank": r, "step_time_s": mine, "median_s": median, "factor": ratio}
            if self.slow[r] == self.windows and r not in self.named:
                self.named.add(r)
                changes.append(change)
            elif self.fast[r] == self.windows and r in self.named:
                self.named.discard(r)
                changes.append({**change, "recovered": True})
        return changes


class Stragglers:
    """Rank 0 learns every rank's busy time once per log window and names a rank that lags.

    Make it on every rank (its constructor gathers each rank's pod and node: a collective);
    call :meth:`compare` on every rank at the end of each log window."""

    def __init__(
        self,
        cfg: WatchdogConfig,
        rank: int,
        world_size: int,
        device: torch.device,
        report: Reporter,
        step_flags: dist_.StepFlags | None,
    ):
        self.rank, self.report = rank, report
        # Only where there is a gradient all-reduce to time and someone to compare with.
        self.enabled = bool(cfg.straggler_factor) and step_flags is not None and world_size > 1
        self.rule = SlowRanks(cfg.straggler_factor, cfg.straggler_windows, world_size)
        self.timer = BusyTimer(device)
        self.places: list[dict[str, Any]] = []
        #: This rank after the last window: its median busy seconds per step (None: not
        #: measured), and whether the rule names it a straggler.
        self.busy_s: float | None = None
        self.slow = False
        if self.enabled:
            assert step_flags is not None
            step_flags.on_last_bucket = self.timer.last_bucket
            self.places = dist_.gather_objects(where(), what="straggler places") or []

    def step_started(self) -> None:
        if self.enabled:
            self.timer.start()

    def compare(self, step: int) -> dict[str, Any]:
        """The window ending at ``step``: one all-gather of every rank's busy time; on rank 0,
        a ``straggler`` event for each rank that became one, or stopped being one. Returns the
        ``train`` event's ``stragglers`` field while there are any (rank 0), so that the newest
        ``train`` event says who lags now."""
        if not self.enabled:
            return {}
        times = [t for (t,) in dist_.all_gather_floats([self.timer.take()], what="straggler check")]
        # Every rank applies the rule to the same times, so each knows whether it is named (its
        # metrics say so); rank 0 alone says it.
        changes = self.rule.see(times)
        self.busy_s, self.slow = times[self.rank], self.rank in self.rule.named
        if self.rank != 0:
            return {}
        for change in changes:
            self.report.event(
                STRAGGLER,
                **change,
                **self._place(change["rank"]),
                step=step,
                windows=self.rule.windows,
                threshold=self.rule.factor,
            )
        now = [
            {"rank": r, **self._place(r), "step_time_s": times[r]} for r in sorted(self.rule.named)
        ]
        return {"stragglers": now} if now else {}

    def _place(self, rank: int) -> dict[str, Any]:
        place = self.places[rank] if rank < len(self.places) else {}
        return {"pod": place.get("hostname"), "node": place.get("node")}
