"""What each run of a job cost, carried across restarts by rank 0: the ledger behind ``goodput``.

A re-created pod's earlier log is gone, so the trainer carries what the controller cannot see.
Each run of the job (one start of the trainer) is one record: which code it ran (a shipped
workdir's digest and git commit, from the pod's env), when its container's process started, when
its first step was done, the step it resumed from and the last it reached, and its seconds after
the first step split into steps, checkpoint stalls and evaluation (laps of one clock, so they sum
to the run's time), with a mark at every checkpoint it saved. The
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
import time
import uuid
from collections.abc import Iterator
from typing import Any

from trainer.checkpoint.storage import Store
from trainer.contract import GOODPUT, WORKDIR_COMMIT_ENV, WORKDIR_DIGEST_ENV, WORKDIR_DIRTY_ENV
from trainer.launch import launched_at
from trainer.parts.phases import EVALUATION, SAVE
from trainer.telemetry.writer import NewestWriter

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

# ---------------------------------------------------------------------------------------------
# A run's record (plain dicts: they go into the checkpoint state, the record object and events)


def shipped_code() -> dict[str, Any] | None:
    """Which code this run runs where the job shipped a workdir (its pod's env, set by the
    controller): ``{digest, commit, dirty}``; None for the image's own code."""
    digest = os.environ.get(WORKDIR_DIGEST_ENV)
    if not digest:
        return None
    dirty = os.environ.get(WORKDIR_DIRTY_ENV)
    return {
        "digest": digest,
        "commit": os.environ.get(WORKDIR_COMMIT_ENV) or None,
        "dirty": None if dirty is None else dirty == "true",
    }


def new_run(launched: float, start_step: int) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex[:8],
        "workdir": shipped_code(),
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
        "workdir": run.get("workdir"),
        "cause": run.get("cause"),
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
    and :meth:`window` after the log window's ``train`` event, times each phase of the loop
    (``trainer.parts.phases``) in :meth:`phase`, and calls :meth:`end` as the run ends (before
    its ``done`` event); :meth:`close` stops the writer. ``store`` is the checkpoints' (rank 0's;
    None: no record beside them)."""

    def __init__(
        self,
        store: Store | None,
        is_main: bool,
        report: Any,
        *,
        resumed_step: int,
        state: dict[str, Any] | None,
        keep: int,
        heartbeat_s: float = HEARTBEAT_S,
    ):
        self.enabled = is_main
        if not is_main:
            return
        self.report, self.keep, self.store = report, keep, store
        self._warned = False
        from_state = (state or {}).get("ledger") if state is not None else None
        from_record = self._read_record()
        earlier = settle(choose(from_state, from_record), resumed_step)
        self.runs = merge_oldest(earlier, MAX_RUNS - 1)
        self.run = new_run(launched_at(), resumed_step)
        self.run["ended_at"] = time.time()
        self._t0 = self._t = None  # perf_counter at the first step, and at the last lap
        self._writer: NewestWriter[dict[str, Any]] | None = None
        if store is not None:
            self._writer = NewestWriter(
                self._write, name=WRITER_THREAD, heartbeat_s=heartbeat_s, beat=self._heartbeat
            )
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
    def phase(self, name: str, step: int) -> Iterator[None]:
        """Time the block: an evaluation as ``eval_s``, a save or the wait for the last write
        as ``stall_s`` (the steps' time before it is laid down first). After a save of ``step``,
        mark what the run has done by then: what a run that resumes from it keeps of this one."""
        self.lap(STEPS)
        try:
            yield
        finally:
            self.lap(EVAL if name == EVALUATION else STALL)
        if name == SAVE and self.enabled and self._t is not None:
            run = self.run
            mark = [step, run[STEPS], run[STALL], run[EVAL]]
            run["marks"] = [*run["marks"], mark][-(self.keep + 1) :]  # a resume uses only these
            self._queue()

    def end(self, reason: str, cause: str | None = None) -> None:
        """The run ends with ``reason`` (the ``done`` event's, printed next): print the ledger
        and write it."""
        if not self.enabled:
            return
        self.lap(STEPS)
        self.run["end"] = reason
        if cause is not None:
            self.run["cause"] = cause
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
            self._writer.submit({"format": FORMAT, "runs": self.state_dict()})

    def _heartbeat(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """The writer's thread, nothing new for a while: while the run goes on, the last record
        with the run alive now, at the last step done (a run killed inside a long step or a long
        log window is known alive, and how far it got, until shortly before)."""
        current = record["runs"][-1]
        if current["end"] is not None:
            return None  # the run ended: its record says so already
        current = dict(current, ended_at=time.time())
        current["last_step"] = max(current["last_step"], self.run["last_step"])
        return dict(record, runs=[*record["runs"][:-1], current])

    def _write(self, record: dict[str, Any]) -> None:
        try:
            self.store.write_bytes(RECORD, json.dumps(record, separators=(",", ":")).encode())
        except Exception as e:
            if not self._warned:
                self._warned = True
                log.warning("ledger: cannot write %s (%s); goodput may miss its end", RECORD, e)

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
