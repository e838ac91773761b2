"""What each run of a job cost, carried across restarts by rank 0: the ledger behind ``goodput``.

A re-created pod's earlier log is gone, so the trainer carries what the controller cannot see.
Each run of the job (one start of the trainer) is one record: when its container's process
started, when its first step was done, the step it resumed from and the last it reached, and
its seconds after the first step split into steps, checkpoint stalls and evaluation (laps of
one clock, so they sum to the run's time), with a mark at every checkpoint it saved. The
ledger travels two ways:

- in the checkpoint state (``state["ledger"]``): the runs as of the save;
- in a small object beside the checkpoints (:data:`RECORD`, a local dir or S3 through
  ``trainer.checkpoint.storage``), rewritten in the background at every log window, every save
  and at least every :data:`HEARTBEAT_S` seconds (the step reached, the time): how far the run got
  past its last checkpoint.

A resumed run reads both and settles the runs before it: the steps a run trained after the
checkpoint the new run resumed from are trained again (``lost_steps``), and the run's time
after that checkpoint's save, up to the last moment it was known alive, is lost (``lost_s``).
Rank 0 prints the ledger as the ``goodput`` event (``trainer/contract.py``) at the start, every
log window and the end; the controller adds what the cluster saw (the queue, the pods).
Nothing here fails a run: a record that cannot be read or written is warned about once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from trainer.contract import GOODPUT, LAUNCHED_AT_ENV, TORCHELASTIC_RESTART_COUNT

log = logging.getLogger(__name__)

#: The record's object name under ``checkpoint.dir`` (not a step: checkpoint scans skip it).
RECORD = "ddpjob-ledger.json"
FORMAT = "ddpjob-ledger/1"
#: How often the record is rewritten when no window or save asks: a run killed in a long step
#: or a stuck collective is known alive until at most this long before it died.
HEARTBEAT_S = 5.0
#: The background writer's thread.
WRITER_THREAD = "ddpjob-ledger"
#: Runs kept one by one; older ones are merged into one record of their sums.
MAX_RUNS = 32
#: Rounding of the seconds and times printed (milliseconds).
DIGITS = 3

#: The lap buckets of a run's time after its first step.
STEPS, STALL, EVAL = "steps_s", "stall_s", "eval_s"
BUCKETS = (STEPS, STALL, EVAL)

_IMPORTED_AT = time.time()


def process_started_at() -> float:
    """When this process started, in epoch seconds: from ``/proc`` (10 ms), else when this module
    was imported."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rpartition(")")[2].split()
        start_ticks = int(after_name[19])  # field 22 of proc(5); the fields after comm start at 3
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return time.time() - (uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


def launched_at() -> float:
    """When the container started this run: the re-launching parent's start (it exports it), or
    this process's own (no re-launch, or torchrun restarted the workers)."""
    raw = os.environ.get(LAUNCHED_AT_ENV)
    if raw and os.environ.get(TORCHELASTIC_RESTART_COUNT, "0") == "0":
        try:
            return float(raw)
        except ValueError:
            pass
    return process_started_at()


# ---------------------------------------------------------------------------------------------
# A run's record (plain dicts: they go into the checkpoint state, the record object and events)


def new_run(launched: float, start_step: int) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex[:8],
        "launched_at": launched,
        "first_step_at": None,
        "ended_at": launched,
        "start_step": start_step,
        "last_step": start_step,
        "kept_step": None,  # None: every step it trained is kept (so far)
        STEPS: 0.0,
        STALL: 0.0,
        EVAL: 0.0,
        "marks": [],  # [step, steps_s, stall_s, eval_s] at the end of each save's stall
        "end": None,
    }


def view(run: dict[str, Any]) -> dict[str, Any]:
    """A run as the ``goodput`` event prints it: its parts sum to ``ended_at - launched_at``."""
    if "merged" in run:
        return {k: v for k, v in run.items() if k != "merged"} | {"merged": run["merged"]}
    launched, ended, first = run["launched_at"], run["ended_at"], run["first_step_at"]
    last, kept_step = run["last_step"], run["kept_step"]
    kept_step = last if kept_step is None else kept_step
    parts = dict.fromkeys(("productive_s", "stall_s", "eval_s", "lost_s"), 0.0)
    if first is None:
        startup = max(0.0, ended - launched)
    else:
        startup = max(0.0, first - launched)
        if kept_step >= last:
            kept = [run[STEPS], run[STALL], run[EVAL]]
        else:  # resumed from an earlier checkpoint: what this run had done by its save is kept
            marks = [m for m in run["marks"] if m[0] <= kept_step]
            kept = list(marks[-1][1:4]) if marks else [0.0, 0.0, 0.0]
        parts["productive_s"], parts["stall_s"], parts["eval_s"] = kept
        parts["lost_s"] = max(0.0, ended - first - sum(kept))
    out = {
        "id": run["id"],
        "launched_at": _r(launched),
        "first_step_at": None if first is None else _r(first),
        "ended_at": _r(ended),
        "start_step": run["start_step"],
        "last_step": last,
        "kept_step": kept_step,
        "lost_steps": max(0, last - max(kept_step, run["start_step"])),
        "startup_s": _r(startup),
        **{k: _r(v) for k, v in parts.items()},
        "other_s": 0.0,
        "end": run["end"],
    }
    return out


def settle(runs: list[dict[str, Any]], resumed_step: int) -> list[dict[str, Any]]:
    """The runs before one that starts at ``resumed_step`` (0: from scratch): a run that got past
    it trained those steps for nothing, and its time after that checkpoint is lost."""
    out = []
    for run in runs:
        run = dict(run)
        if "merged" not in run and run["last_step"] > resumed_step:
            kept = run["last_step"] if run["kept_step"] is None else run["kept_step"]
            run["kept_step"] = max(run["start_step"], min(kept, resumed_step))
        out.append(run)
    return out


def merge_oldest(runs: list[dict[str, Any]], limit: int = MAX_RUNS) -> list[dict[str, Any]]:
    """At most ``limit`` runs: the oldest merged into one record of their sums (the time
    between them in ``other_s``), so a job that restarts all day keeps a small ledger."""
    runs = list(runs)
    while len(runs) > limit:
        a, b = view(runs[0]), view(runs[1])
        merged = {
            **{k: _r(a[k] + b[k]) for k in _SECONDS},
            "id": a["id"],
            "launched_at": a["launched_at"],
            "first_step_at": a["first_step_at"] or b["first_step_at"],
            "ended_at": b["ended_at"],
            "start_step": a["start_step"],
            "last_step": b["last_step"],
            "kept_step": b["kept_step"],
            "lost_steps": a["lost_steps"] + b["lost_steps"],
            "end": b["end"],
            "merged": runs[0].get("merged", 1) + runs[1].get("merged", 1),
        }
        merged["other_s"] = _r(a["other_s"] + b["other_s"] + (b["launched_at"] - a["ended_at"]))
        runs[:2] = [merged]
    return runs


_SECONDS = ("startup_s", "productive_s", "stall_s", "eval_s", "lost_s", "other_s")


def _r(x: float) -> float:
    return round(float(x), DIGITS)


def choose(from_state: list[dict] | None, from_record: list[dict] | None) -> list[dict]:
    """The runs to go on from: the record's when it continues the checkpoint's lineage (it is
    rewritten after every save, so it knows more), else the checkpoint's. A record alone (no
    checkpoint, or one written before ledgers) is taken as it is."""
    if not from_record:
        return list(from_state or [])
    if not from_state:
        return list(from_record)
    ids = {r["id"] for r in from_record}
    return list(from_record) if from_state[-1]["id"] in ids else list(from_state)


# ---------------------------------------------------------------------------------------------
# The ledger of this run


class Ledger:
    """Rank 0's ledger: the runs before this one, settled, and this run's clock. On any other
    rank every method does nothing.

    The loop calls :meth:`started` after its ``start`` event, :meth:`stepped` after every step
    and :meth:`window` after the log window's ``train`` event, times an evaluation or a stall in
    :meth:`part` and a save in :meth:`saving`, and calls :meth:`end` as the run ends (before its
    ``done`` event); :meth:`close` stops the writer."""

    def __init__(
        self,
        location: str | None,
        is_main: bool,
        report: Any,
        *,
        resumed_step: int,
        state: dict[str, Any] | None,
        keep: int,
    ):
        self.enabled = is_main
        if not is_main:
            return
        self.report, self.keep = report, keep
        self.store = _open(location)
        from_state = (state or {}).get("ledger") if state is not None else None
        from_record = self._read_record()
        earlier = settle(choose(from_state, from_record), resumed_step)
        self.runs = merge_oldest(earlier, MAX_RUNS - 1)
        self.run = new_run(launched_at(), resumed_step)
        self.run["ended_at"] = time.time()
        self._t0 = self._t = None  # perf_counter at the first step, and at the last lap
        self._writer = _Writer(self.store, HEARTBEAT_S) if self.store is not None else None
        self._queue()

    # -- the loop's calls ----------------------------------------------------------------------

    def started(self) -> None:
        """Print the ledger now (after the ``start`` event: the runs before, settled)."""
        if self.enabled:
            self.run["ended_at"] = max(self.run["ended_at"], time.time())
            self._print()

    def stepped(self, step: int) -> None:
        """A step is done: the first ends the run's start-up."""
        if not self.enabled:
            return
        if self._t is None:
            self._t0 = self._t = time.perf_counter()
            self.run["first_step_at"] = time.time()
        self.run["last_step"] = step
        if self._writer is not None:
            self._writer.live_step = step

    def lap(self, bucket: str) -> None:
        """The time since the last lap was ``bucket``'s (before the first step: start-up's)."""
        if not self.enabled or self._t is None:
            return
        now = time.perf_counter()
        self.run[bucket] += now - self._t
        self._t = now
        self.run["ended_at"] = self.run["first_step_at"] + (now - self._t0)

    def window(self) -> None:
        """The log window ended: its time was steps'; print the ledger and rewrite the record."""
        if not self.enabled:
            return
        self.lap(STEPS)
        self._print()
        self._queue()

    @contextlib.contextmanager
    def part(self, bucket: str) -> Iterator[None]:
        """Time the block as ``bucket`` (evaluation, a stall); the steps' time before it is laid
        down first."""
        self.lap(STEPS)
        try:
            yield
        finally:
            self.lap(bucket)

    @contextlib.contextmanager
    def saving(self, step: int) -> Iterator[None]:
        """Time a save of ``step`` as a stall; then mark what the run has done by then (what a
        run that resumes from this checkpoint keeps of this one)."""
        with self.part(STALL):
            yield
        if self.enabled and self._t is not None:
            run = self.run
            mark = [step, run[STEPS], run[STALL], run[EVAL]]
            run["marks"] = [*run["marks"], mark][-(self.keep + 1) :]  # a resume uses only these
            self._queue()

    def end(self, reason: str) -> None:
        """The run ends with ``reason`` (the ``done`` event's, printed next): print the ledger
        and write it."""
        if not self.enabled:
            return
        self.lap(STEPS)
        self.run["end"] = reason
        self._print()
        self._queue()

    def close(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (waiting at most ``timeout_s``) and stop the writer."""
        if self.enabled and self._writer is not None:
            self._writer.close(timeout_s)

    # -- state --------------------------------------------------------------------------------

    def state_dict(self) -> list[dict[str, Any]] | None:
        """What the checkpoint holds: every run, this one as of now."""
        if not self.enabled:
            return None
        return [*self.runs, json.loads(json.dumps(self.run))]

    def views(self) -> list[dict[str, Any]]:
        return [view(r) for r in [*self.runs, self.run]]

    # -- inside -------------------------------------------------------------------------------

    def _print(self) -> None:
        self.report.event(GOODPUT, at=_r(time.time()), runs=self.views())

    def _queue(self) -> None:
        if self._writer is not None:
            record = {"format": FORMAT, "runs": self.state_dict()}
            self._writer.submit(record, running=self.run["end"] is None)

    def _read_record(self) -> list[dict[str, Any]] | None:
        if self.store is None:
            return None
        try:
            data = json.loads(self.store.read_bytes(RECORD))
            return data["runs"] if data.get("format") == FORMAT else None
        except FileNotFoundError:
            return None
        except Exception as e:  # unreadable or another shape: start the ledger from the state
            log.warning("ledger: cannot read %s (%s); carrying on without it", RECORD, e)
            return None


def _open(location: str | None):
    if not location:
        return None
    from trainer.checkpoint.storage import open_store

    try:
        return open_store(location)
    except Exception as e:
        log.warning("ledger: cannot open %s (%s); goodput will not see past this run", location, e)
        return None


class _Writer:
    """Rewrites :data:`RECORD` in a daemon thread: the newest record submitted, at once, and
    while the run goes on every :data:`HEARTBEAT_S` seconds with ``ended_at`` moved to now and
    ``last_step`` to :attr:`live_step` (so a run killed inside a long step or a long log window
    is known alive, and how far it got, until shortly before)."""

    #: The last step done, set by the loop's thread (one int: no lock needed).
    live_step: int | None = None

    def __init__(self, store, heartbeat_s: float):
        self.store, self.heartbeat_s = store, heartbeat_s
        self._cond = threading.Condition()
        self._record: dict[str, Any] | None = None
        self._running = True
        self._new = self._closed = False
        self._warned = False
        self._thread = threading.Thread(target=self._loop, name=WRITER_THREAD, daemon=True)
        self._thread.start()

    def submit(self, record: dict[str, Any], running: bool) -> None:
        with self._cond:
            self._record, self._running, self._new = record, running, True
            self._cond.notify()

    def close(self, timeout_s: float) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not (self._new or self._closed):
                    self._cond.wait(self.heartbeat_s)
                record, new, running, closing = self._record, self._new, self._running, self._closed
                self._new = False
            if new:
                self._write(record)
            elif record is not None and running and not closing:
                # A heartbeat: the run is alive now, whatever step it is in.
                current = dict(record["runs"][-1], ended_at=time.time())
                if self.live_step is not None:
                    current["last_step"] = max(current["last_step"], self.live_step)
                self._write(dict(record, runs=[*record["runs"][:-1], current]))
            if closing:
                return

    def _write(self, record: dict[str, Any]) -> None:
        try:
            self.store.write_bytes(RECORD, json.dumps(record, separators=(",", ":")).encode())
        except Exception as e:
            if not self._warned:
                self._warned = True
                log.warning("ledger: cannot write %s (%s); goodput may miss its end", RECORD, e)
