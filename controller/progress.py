"""Rank 0's stdout, one line at a time, turned into a progress bar with an ETA.

The trainer prints JSON events (``{"event": "train", "step": 120, "max_steps": 1000, ...}``)
beside human lines (docs/architecture.md, "The trainer's stdout contract"). Feed every line to
:class:`Progress`; it works the same for ``run --local`` (a child's pipe), ``logs -f`` and
``submit --follow`` (a pod's log stream):

    progress = Progress(sys.stdout)
    for line in lines:
        progress.feed(line)
    progress.close()

On a terminal it draws a rich bar (step/max, loss, samples/s, ETA) and prints events as short
human lines. Anywhere else every line passes through unchanged, so the output stays
machine-readable (``... | grep '"event": "eval"'``), and what the job must hear at once (rank 0's
verdict on a rank that is stuck, a straggler, a restart of the job and why, a failed save, a bad
node, a slow rank before step 1) is also said on stderr. Either way the latest state
is kept in attributes (``step``, ``max_steps``, ``loss``, ``eta_s``, ``done``) for the caller.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import IO, Any

from trainer.contract import (
    BAD_NODE,
    CHECKPOINT,
    CHECKPOINT_FAILED,
    COMPLETED,
    DONE,
    EVAL,
    PREFLIGHT,
    RESTART,
    RESUME,
    START,
    STRAGGLER,
    STUCK,
    TRAIN,
    parse_event,
)


def format_duration(seconds: float | None) -> str:
    """``1:02:03`` / ``4:05`` / ``--:--`` for unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "--:--"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Eta:
    """Seconds left, from the trainer's own ``step_time_s`` or else from wall-clock step rate.

    The trainer's figure is preferred: it is right even when lines arrive in a burst (a log
    replayed by ``logs -f``), where wall-clock time between lines means nothing.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, window: int = 5):
        self.clock = clock
        self.samples: deque[tuple[float, int]] = deque(maxlen=window)
        self.step_times: deque[float] = deque(maxlen=window)  # smooths one slow window

    def update(self, step: int, max_steps: int, step_time_s: float | None = None) -> float | None:
        now = self.clock()
        if self.samples and step < self.samples[-1][1]:
            self.samples.clear()  # the job restarted from an earlier checkpoint
            self.step_times.clear()
        self.samples.append((now, step))
        left = max(max_steps - step, 0)
        if isinstance(step_time_s, (int, float)) and step_time_s > 0:
            self.step_times.append(float(step_time_s))
            return left * sum(self.step_times) / len(self.step_times)
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        if s1 > s0 and t1 > t0:
            return left * (t1 - t0) / (s1 - s0)
        return None


class Progress:
    """A reusable renderer of the trainer's output, fed one line at a time (see module doc)."""

    def __init__(
        self,
        out: IO[str] | None = None,
        *,
        live: bool | None = None,
        label: str = "train",
        clock: Callable[[], float] = time.monotonic,
    ):
        self.out = out if out is not None else sys.stdout
        isatty = getattr(self.out, "isatty", None)
        self.live = bool(isatty and isatty()) if live is None else live
        self.label = label
        self.eta = Eta(clock)
        self.step: int | None = None
        self.max_steps: int | None = None
        self.loss: float | None = None
        self.samples_per_s: float | None = None
        self.eta_s: float | None = None
        self.last_event: dict[str, Any] | None = None
        self.done: dict[str, Any] | None = None
        self._bar: Any = None
        self._task: Any = None

    # -- input -------------------------------------------------------------------------------

    def feed(self, line: str) -> dict[str, Any] | None:
        """Take one line of output; returns its event, if it was one."""
        line = line.rstrip("\r\n")
        event = parse_event(line)
        if event is not None:
            self._track(event)
        if not self.live:
            self._write(line)
            self._note_urgent(event)
        elif event is None:
            self._print(line)
        else:
            self._show(event)
        return event

    def feed_lines(self, lines: list[str]) -> None:
        """Take a batch of lines (what one read of a log delivered): the same as ``feed`` on
        each, with one write and one flush for the whole batch when not on a terminal."""
        if self.live:
            for line in lines:
                self.feed(line)
            return
        lines = [line.rstrip("\r\n") for line in lines]
        events = [e for line in lines if (e := parse_event(line)) is not None]
        for event in events:
            self._track(event)
        self.out.write("\n".join(lines) + "\n")
        self.out.flush()
        for event in events:
            self._note_urgent(event)

    def note(self, text: str) -> None:
        """A message of the caller's own (restarts, pod events): above the bar on a terminal,
        on stderr otherwise, so the passthrough on ``out`` stays the trainer's lines only."""
        if self.live:
            self._print(text)
        else:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def close(self) -> None:
        """Stop the bar (left on screen at its last state). Safe to call twice."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _note_urgent(self, event: dict[str, Any] | None) -> None:
        """Off a terminal: say rank 0's verdict on a stuck job and a straggler on stderr too."""
        if event is not None and is_urgent(event):
            self.note(describe(event) or "")

    # -- state -------------------------------------------------------------------------------

    def _track(self, event: dict[str, Any]) -> None:
        self.last_event = event
        name = event["event"]
        if isinstance(event.get("max_steps"), int):
            self.max_steps = event["max_steps"]
        if isinstance(event.get("step"), int):
            self.step = event["step"]
        if name == TRAIN:
            if isinstance(event.get("loss"), (int, float)):
                self.loss = float(event["loss"])
            if isinstance(event.get("samples_per_s"), (int, float)):
                self.samples_per_s = float(event["samples_per_s"])
            if self.step is not None and self.max_steps:
                self.eta_s = self.eta.update(self.step, self.max_steps, event.get("step_time_s"))
        elif name == DONE:
            self.done = event
            self.eta_s = 0.0 if event.get("reason") == "completed" else None

    # -- output ------------------------------------------------------------------------------

    def _write(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()

    def _print(self, line: str) -> None:
        self._ensure_bar()
        self._bar.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _show(self, event: dict[str, Any]) -> None:
        name = event["event"]
        if name == TRAIN or (name == DONE and event.get("reason") == COMPLETED):
            self._refresh()
            return
        text = describe(event)
        if text:
            self._print(text)
        self._refresh()

    def _ensure_bar(self) -> None:
        if self._bar is not None:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = Console(file=self.out, highlight=False)
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[rate]}"),
            TextColumn("ETA {task.fields[eta]}"),
            console=console,
            refresh_per_second=4,
        )
        self._task = self._bar.add_task(self.label, total=None, loss="-", rate="", eta="--:--")
        self._bar.start()

    def _refresh(self) -> None:
        self._ensure_bar()
        self._bar.update(
            self._task,
            total=self.max_steps,
            completed=self.step or 0,
            loss="-" if self.loss is None else f"{self.loss:.4f}",
            rate="" if self.samples_per_s is None else f"{self.samples_per_s:,.0f} samples/s",
            eta=format_duration(self.eta_s),
        )


def describe(event: dict[str, Any]) -> str | None:
    """A short human line for an event (None for events the bar already shows)."""
    name, step = event.get("event"), event.get("step")
    if name == START:
        where = f" from step {step}" if step else ""
        return (
            f"started: world size {event.get('world_size', '?')} on "
            f"{event.get('device', '?')}{where}"
        )
    if name == EVAL:
        metrics = event.get("metrics") or {}
        shown = ", ".join(f"{k} {_num(v)}" for k, v in metrics.items())
        return f"eval @ step {step}: {shown}" if shown else f"eval @ step {step}"
    if name == CHECKPOINT:
        return f"checkpoint @ step {step}: {event.get('path')}"
    if name == RESUME:
        if event.get("path"):
            return f"resumed from {event['path']} at step {step}"
        return None
    if name == DONE:
        reason = event.get("reason", "?")
        if reason == RESTART:
            return (
                f"restarts itself at step {step}/{event.get('max_steps')}: {event.get('cause')} "
                "(exit 138; the next run resumes from the last complete checkpoint)"
            )
        error = f": {event['error']}" if event.get("error") else ""
        return f"stopped ({reason}) at step {step}/{event.get('max_steps')}{error}"
    if name == CHECKPOINT_FAILED:
        return describe_failed_save(event)
    if name == BAD_NODE:
        return describe_bad_node(event)
    if name == PREFLIGHT:
        return describe_preflight(event)
    if name == STUCK:
        return describe_stuck(event)
    if name == STRAGGLER:
        return describe_straggler(event)
    if name == TRAIN:
        return None
    return json.dumps(event)


#: The events that may be urgent (:func:`is_urgent`), as they appear in a log line.
_URGENT_NAMES = tuple(
    f'"{name}"' for name in (STUCK, STRAGGLER, RESTART, CHECKPOINT_FAILED, BAD_NODE, PREFLIGHT)
)


def urgent_lines(lines: list[str]) -> list[str]:
    """What :func:`describe` says of the urgent events among raw log ``lines``. Only a line
    that names one of their events is parsed, so a long log costs a substring test a line."""
    found = []
    for line in lines:
        if any(name in line for name in _URGENT_NAMES):
            event = parse_event(line)
            if event is not None and is_urgent(event):
                found.append(describe(event) or "")
    return found


def is_urgent(event: dict[str, Any]) -> bool:
    """What a person following the job must hear at once: rank 0's verdict on a job that makes
    no progress (or moves again), a straggler, the job restarting itself (and why), a save that
    failed, a node that failed the job, a rank or link the pre-flight found slow."""
    name = event.get("event")
    return (
        (name == STUCK and "culprit" in event)
        or name in (STRAGGLER, CHECKPOINT_FAILED, BAD_NODE)
        or (name == DONE and event.get("reason") == RESTART)
        or (name == PREFLIGHT and bool(event.get("slow")))
    )


def describe_failed_save(event: dict[str, Any]) -> str:
    """A ``checkpoint_failed`` event: which save, where, what the server answered, how many in
    a row of how many the job takes before it restarts."""
    row, limit = event.get("failed_in_row"), event.get("limit")
    count = f"; {row} in a row" if row else ""
    count += f", the job restarts at {limit}" if limit else ""
    return (
        f"checkpoint @ step {event.get('step')} failed: {event.get('error')} "
        f"({event.get('path')}){count}; training goes on"
    )


def describe_bad_node(event: dict[str, Any]) -> str:
    """A ``bad_node`` event: the node, the rank and why, its faults, whether it is avoided."""
    node, faults = event.get("node") or "an unknown node", event.get("faults")
    line = f"bad node {node}: rank {event.get('rank')}, {event.get('cause')}"
    if isinstance(faults, int):
        line += f"; {faults} fault(s) of this job there"
    if event.get("avoided"):
        line += f"; its next pods avoid {', '.join(event.get('nodes') or [node])}"
    if event.get("problem"):
        line += f"; not recorded on the job: {event['problem']}"
    return line


def describe_preflight(event: dict[str, Any]) -> str:
    """A ``preflight`` event: the slow ranks and links, or that none was."""
    slow = event.get("slow") or []
    if not slow:
        return f"preflight: {len(event.get('ranks') or [])} rank(s), none slow"
    return "; ".join(f"preflight: {describe_slow(s)}" for s in slow)


def describe_slow(slow: dict[str, Any]) -> str:
    """One slow rank (its matmul) or link (the message from ``peer``) of the pre-flight."""
    factor = slow.get("factor")
    times = f"{factor:g}x" if isinstance(factor, (int, float)) else "far over"
    what = (
        f"the link from rank {slow.get('peer')} to rank {slow.get('rank')}"
        if slow.get("what") == "link"
        else f"rank {slow.get('rank')}'s matmul"
    )
    return f"{what} took {times} the other ranks' median{_place(slow)}"


def describe_stuck(event: dict[str, Any]) -> str:
    """A ``stuck`` event in words: rank 0's verdict (which rank the others wait for, and where
    it is) or a rank's own (where it is, and whether it waits in a collective)."""
    stall = _seconds(event.get("stuck_s"))
    culprit = event.get("culprit")
    if "culprit" not in event:  # a rank about itself
        rank = event.get("rank", "?")
        if event.get("recovered"):
            return f"rank {rank} moves again after {stall}"
        waits = event.get("in_collective")
        state = f"waiting in the {waits}" if waits else "not in a collective"
        return (
            f"rank {rank}: no progress for {stall} after step {event.get('step')}, {state}, "
            f"at {_frame(event.get('frame'))}"
        )
    if event.get("recovered"):
        who = f": rank {culprit} was the one the others waited for" if culprit is not None else ""
        return f"moving again after {stall}{who}"
    since = f"no progress for {stall} after step {event.get('step')}"
    waiting, what = event.get("waiting") or [], event.get("in_collective")
    others = f"{_ranks(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in"
    if culprit is None:
        if waiting:
            return (
                f"stuck: every rank waits in the {what} and none is behind ({since}): a network "
                "or device fault, or ranks that call different collectives"
            )
        return f"stuck: no rank is in a collective ({since}); {_where(event)}"
    where = _where(event, culprit)
    if culprit in (event.get("silent") or []):
        return (
            f"stuck: rank {culprit} does not answer (its whole process is frozen, or gone) while "
            f"{others} the {what} ({since})"
        )
    if event.get("rank_in_collective"):
        return (
            f"stuck: rank {culprit} is behind, in the {event['rank_in_collective']}, while "
            f"{others} the {what} ({since}): {where}"
        )
    return f"stuck: rank {culprit} is not in the {what} that {others} ({since}): {where}"


def describe_straggler(event: dict[str, Any]) -> str:
    """A ``straggler`` event in words: the rank, where it runs, its time against the others'."""
    rank, place = event.get("rank"), _place(event)
    mine, median = _num(event.get("step_time_s")), _num(event.get("median_s"))
    if event.get("recovered"):
        return f"straggler: rank {rank}{place} keeps up again ({mine} s a step against {median} s)"
    factor = event.get("factor")
    if not isinstance(factor, (int, float)):  # only the train event's list was read
        return f"straggler: rank {rank}{place} is busy {mine} s a step, more than the others"
    return (
        f"straggler: rank {rank}{place} is busy {mine} s a step, {factor:.1f}x the other ranks' "
        f"median of {median} s, {event.get('windows')} log windows in a row"
    )


def _where(event: dict[str, Any], rank: int | None = None) -> str:
    who = f"rank {rank}" if rank is not None else "it"
    return f"{who} is at {_frame(event.get('frame'))}{_place(event)}"


def _place(event: dict[str, Any]) -> str:
    """`` (pod P, node N)`` of the event's rank, as far as known."""
    pod, node = event.get("pod"), event.get("node")
    place = ", ".join(p for p in (pod and f"pod {pod}", node and f"node {node}") if p)
    return f" ({place})" if place else ""


def _frame(frame: dict[str, Any] | None) -> str:
    if not frame:
        return "an unknown place"
    return f"{frame.get('file')}:{frame.get('line')}, in {frame.get('function')}"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _seconds(value: Any) -> str:
    return f"{value:.0f} s" if isinstance(value, (int, float)) else "? s"


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
