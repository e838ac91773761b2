"""What the controller says of a job that makes no progress or has a straggler: the trainer's
``stuck`` and ``straggler`` events in words (``controller.progress.describe``), read from rank 0's
log into the job's view (``TrainerEvents``), said once by ``wait`` (which follows rank 0's log
quietly) and by ``--follow`` off a terminal. The real trainer's events:
tests/trainer/test_watchdog.py; on the real node: tests/e2e/test_stuck.py."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

from controller.jobs.read.trainer_events import TrainerEvents
from controller.jobs.wait import wait_for_job
from controller.progress import Progress, describe, urgent_lines
from tests.controller.test_follow_unit import FakeCluster, until

FRAME = {"file": "/ckpt/plugins/tasks.py", "line": 109, "function": "hang_here", "code": "x"}
STEP_FRAME = {"file": "/app/trainer/step.py", "line": 114, "function": "_forward_backward"}


def verdict(**fields: Any) -> dict[str, Any]:
    """Rank 0's verdict as the trainer prints it (trainer.health.watchdog.judge), rank 1 to
    blame."""
    return {
        "event": "stuck",
        "culprit": 1,
        "culprits": [1],
        "in_collective": "gradient all-reduce",
        "waiting": [0],
        "silent": [],
        "stuck_s": 21.4,
        "step": 4,
        "frame": FRAME,
        "stack": [{"thread": "MainThread", "frames": [FRAME]}],
        "pod": "j-worker-0",
        "node": "node-a",
        "rank_in_collective": None,
        **fields,
    }


MOVES = {"event": "stuck", "culprit": 1, "recovered": True, "stuck_s": 60.2, "step": 5}
OWN = {
    "event": "stuck",
    "rank": 0,
    "step": 4,
    "stuck_s": 20.1,
    "in_collective": "gradient all-reduce",
    "frame": STEP_FRAME,
}
STRAGGLER = {
    "event": "straggler",
    "rank": 1,
    "pod": "j-worker-0",
    "node": "node-b",
    "step": 30,
    "step_time_s": 0.25,
    "median_s": 0.1,
    "factor": 2.5,
    "windows": 3,
    "threshold": 1.5,
}


def line(event: dict[str, Any]) -> str:
    return json.dumps(event)


# ---------------------------------------------------------------------------------------------
# In words


def test_the_verdict_names_the_rank_the_collective_and_where_it_is():
    assert describe(verdict()) == (
        "stuck: rank 1 is not in the gradient all-reduce that rank 0 waits in (no progress for "
        "21 s after step 4): rank 1 is at /ckpt/plugins/tasks.py:109, in hang_here "
        "(pod j-worker-0, node node-a)"
    )
    assert describe(MOVES) == "moving again after 60 s: rank 1 was the one the others waited for"


def test_the_other_verdicts_in_words():
    silent = verdict(culprit=2, culprits=[2], waiting=[0, 1], silent=[2], frame=None, pod=None)
    assert describe(silent) == (
        "stuck: rank 2 does not answer (its whole process is frozen, or gone) while ranks 0, 1 "
        "wait in the gradient all-reduce (no progress for 21 s after step 4)"
    )
    behind = verdict(in_collective="barrier", rank_in_collective="all-reduce", node=None)
    assert describe(behind) == (
        "stuck: rank 1 is behind, in the all-reduce, while rank 0 waits in the barrier (no "
        "progress for 21 s after step 4): rank 1 is at /ckpt/plugins/tasks.py:109, in "
        "hang_here (pod j-worker-0)"
    )
    level = verdict(culprit=None, culprits=[], waiting=[0, 1], frame=None)
    assert describe(level).startswith(
        "stuck: every rank waits in the gradient all-reduce and none is behind"
    )
    outside = verdict(culprit=None, culprits=[], waiting=[], in_collective=None, pod=None)
    assert describe(outside) == (
        "stuck: no rank is in a collective (no progress for 21 s after step 4); it is at "
        "/ckpt/plugins/tasks.py:109, in hang_here (node node-a)"
    )


def test_a_ranks_own_event_and_a_straggler_in_words():
    assert describe(OWN) == (
        "rank 0: no progress for 20 s after step 4, waiting in the gradient all-reduce, at "
        "/app/trainer/step.py:114, in _forward_backward"
    )
    assert describe({**OWN, "recovered": True, "stuck_s": 60.0}) == "rank 0 moves again after 60 s"
    assert describe(STRAGGLER) == (
        "straggler: rank 1 (pod j-worker-0, node node-b) is busy 0.25 s a step, 2.5x the other "
        "ranks' median of 0.1 s, 3 log windows in a row"
    )
    assert describe({**STRAGGLER, "recovered": True, "step_time_s": 0.1}) == (
        "straggler: rank 1 (pod j-worker-0, node node-b) keeps up again (0.1 s a step against "
        "0.1 s)"
    )


# ---------------------------------------------------------------------------------------------
# Read from the log


def test_the_view_holds_the_verdict_until_the_job_moves_and_the_ranks_that_lag_now():
    events = TrainerEvents()
    train = {"event": "train", "step": 30, "max_steps": 100, "step_time_s": 0.3}
    lagging = {**train, "stragglers": [{"rank": 1, "pod": "j-worker-0", "step_time_s": 0.26}]}
    events.see_lines([line(STRAGGLER), line(lagging), line(OWN), line(verdict())])
    assert events.stuck() == verdict() and events.of_ranks("stuck") == {0: OWN}
    # The newest train event lists who lags; its straggler event adds the median and factor.
    assert events.stragglers() == [{**STRAGGLER, "step_time_s": 0.26}]
    events.see_lines([line(MOVES), line({**train, "step": 40})])
    assert events.stuck() is None and events.verdict() == MOVES
    assert events.stragglers() == []  # a train event without the list: none lags now
    assert events.alerts == [STRAGGLER, verdict(), MOVES]


def test_off_a_terminal_the_lines_pass_through_and_the_verdict_is_said_on_stderr(capsys):
    out = io.StringIO()
    progress = Progress(out, live=False)
    lines = [line(OWN), line(verdict()), "plain"]
    progress.feed_lines(lines)
    progress.feed(line(MOVES))
    assert out.getvalue().splitlines() == [*lines, line(MOVES)]
    assert capsys.readouterr().err.splitlines() == [describe(verdict()), describe(MOVES)]
    assert urgent_lines([*lines, line(STRAGGLER)]) == [describe(verdict()), describe(STRAGGLER)]


# ---------------------------------------------------------------------------------------------
# wait


def test_wait_follows_rank_0_quietly_and_says_the_verdict_once_and_that_the_job_moves():
    c = FakeCluster()
    c.pod_event("ADDED", "j-master-0", "a", "running")
    c.job_event("Running")
    said: list[str] = []
    result: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: result.update(job=wait_for_job(c, "j", "ns", timeout_s=30, say=said.append))
    )
    t.start()
    c.print("a", line({"event": "train", "step": 4, "max_steps": 10}))
    c.print("a", line(OWN))
    c.print("a", line(verdict()))
    until(lambda: len(said) == 1, "wait")
    c.print("a", line({**OWN, "recovered": True}))
    c.print("a", line(MOVES))
    until(lambda: len(said) == 2, "wait")
    c.pod_event("MODIFIED", "j-master-0", "a", "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)
    assert not t.is_alive() and result["job"]["status"]["conditions"][0]["type"] == "Succeeded"
    assert said == [f"job j: {describe(verdict())}", f"job j: {describe(MOVES)}"]
    assert [(pod, follow) for pod, follow, _ in c.opened] == [("j-master-0", True)]
