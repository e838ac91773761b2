"""What the trainer says about a job in its events: one JSON object per line of a pod's log
(``trainer/contract.py``), rank 0's about the job, any rank's about itself.

:class:`TrainerEvents` keeps the newest event of each name (and, for the events a rank writes
about itself, the newest per rank); whoever reads a log of the job feeds it lines, and what shows
the job reads it. Progress (``train``/``done``) is read here, and what ails a running job: rank
0's verdict on a job that makes no progress (:meth:`TrainerEvents.stuck`) and the ranks that lag
(:meth:`TrainerEvents.stragglers`); the last ``checkpoint`` is the same kind of read
(:meth:`TrainerEvents.newest`, :meth:`TrainerEvents.of_ranks`).

Pure: lines in, dicts out.
"""

from __future__ import annotations

from typing import Any

from controller.progress import is_urgent
from trainer.contract import DONE, PREFLIGHT, RANK_EVENTS, STRAGGLER, STUCK, TRAIN, parse_event


class TrainerEvents:
    """The newest event of each name seen in the job's logs, in the order they were fed."""

    def __init__(self) -> None:
        self._seq = 0
        # event name -> (order seen, the event, the pod whose log had it, if known)
        self._newest: dict[str, tuple[int, dict[str, Any], str | None]] = {}
        # a rank's own events (RANK_EVENTS): event name -> rank -> the newest
        self._by_rank: dict[str, dict[int, dict[str, Any]]] = {}
        # rank 0's newest verdict on a job that makes no progress (a `stuck` event with a
        # `culprit`), or the one that says it moves again
        self._verdict: dict[str, Any] | None = None
        # rank 0's newest `straggler` event about each rank
        self._stragglers: dict[int, dict[str, Any]] = {}
        #: The verdicts and straggler events, in the order seen (``progress.is_urgent``): what
        #: a command that follows the job says as they come.
        self.alerts: list[dict[str, Any]] = []

    def see_lines(self, lines: list[str], pod: str | None = None) -> None:
        """Read the events among ``lines`` (plain lines are skipped), in order; ``pod``: whose
        log they are from."""
        for line in lines:
            event = parse_event(line)
            if event is not None:
                self.see(event, pod)

    def see(self, event: dict[str, Any], pod: str | None = None) -> None:
        self._seq += 1
        name = event["event"]
        self._newest[name] = (self._seq, event, pod)
        if name == STUCK and "culprit" in event:
            self._verdict = event
        elif name in RANK_EVENTS and isinstance(event.get("rank"), int):
            self._by_rank.setdefault(name, {})[event["rank"]] = event
        if name == STRAGGLER and isinstance(event.get("rank"), int):
            self._stragglers[event["rank"]] = event
        if is_urgent(event):
            self.alerts.append(event)

    def newest(self, *names: str) -> dict[str, Any] | None:
        """The newest event among those named ``names`` (None: none seen)."""
        seen = [self._newest[n] for n in names if n in self._newest]
        return max(seen, key=lambda s: s[0])[1] if seen else None

    def pod_of(self, name: str) -> str | None:
        """The pod whose log had the newest event ``name``, where known."""
        found = self._newest.get(name)
        return found[2] if found is not None else None

    def of_ranks(self, name: str) -> dict[int, dict[str, Any]]:
        """A rank's own events ``name`` (one of ``RANK_EVENTS``): the newest per rank."""
        return dict(self._by_rank.get(name, {}))

    def stuck(self) -> dict[str, Any] | None:
        """Rank 0's verdict while the job makes no progress (None when there is none, or the
        job moved again after it)."""
        verdict = self._verdict
        return verdict if verdict is not None and not verdict.get("recovered") else None

    def verdict(self) -> dict[str, Any] | None:
        """Rank 0's newest verdict, the one that says the job moves again included."""
        return self._verdict

    def stragglers(self) -> list[dict[str, Any]]:
        """The ranks that lag now: the newest ``train`` event's ``stragglers`` where one was
        seen (it lists them every window), else each rank's newest ``straggler`` event that is
        not a recovery. Each as its ``straggler`` event, where seen, with the newest time."""
        train = self._newest.get(TRAIN)
        if train is None:
            return [e for _, e in sorted(self._stragglers.items()) if not e.get("recovered")]
        now = [s for s in train[1].get("stragglers") or [] if isinstance(s.get("rank"), int)]
        # The straggler event, where seen, has the median and the factor it was named with.
        return [{**self._stragglers.get(s["rank"], {}), **s} for s in now]

    def preflight_slow(self) -> list[dict[str, Any]]:
        """The ranks and links the run's pre-flight found slow: its ``preflight`` event where
        seen, else the newest ``train`` event's ``preflight`` (rank 0 repeats it every window)."""
        preflight = self._newest.get(PREFLIGHT)
        if preflight is not None:
            return list(preflight[1].get("slow") or [])
        train = self._newest.get(TRAIN)
        return list(train[1].get("preflight") or []) if train is not None else []

    def progress(self) -> dict[str, Any] | None:
        """The newest ``train`` (or ``done``) event, with an ETA added (``eta_s``)."""
        latest = self.newest(TRAIN, DONE)
        return None if latest is None else with_eta(latest)


def with_eta(event: dict[str, Any]) -> dict[str, Any]:
    """A ``train`` or ``done`` event with ``eta_s``, where its rate and ``max_steps`` tell."""
    out = dict(event)
    step, max_steps = event.get("step"), event.get("max_steps")
    rate = event.get("steps_per_s")
    if rate is None and event.get("samples_per_s") and event.get("global_batch_size"):
        rate = event["samples_per_s"] / event["global_batch_size"]
    if rate is None and event.get("step_time_s"):
        rate = 1.0 / event["step_time_s"]
    if event.get("event") == DONE:
        out["eta_s"] = 0.0
    elif rate and step is not None and max_steps:
        out["eta_s"] = max(0.0, (max_steps - step) / rate)
    return out


def latest_progress(lines: list[str]) -> dict[str, Any] | None:
    """The newest ``train`` (or ``done``) event among ``lines``, with an ETA added."""
    events = TrainerEvents()
    events.see_lines(lines)
    return events.progress()
