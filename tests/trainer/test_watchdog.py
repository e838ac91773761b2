"""A rank that hangs is named with where it is; a rank that lags is flagged; slow moments (a
first step, a checkpoint) are neither. One real 2-rank gloo run under torchrun,
and the verdict's and the straggler's rules on their own (``trainer.health.watchdog.judge``,
``trainer.health.stragglers.SlowRanks``)."""

from __future__ import annotations

import inspect
import json
import math
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from tests.trainer import tasks
from tests.trainer.conftest import REPO, Result, base_env, common_args, torchrun_cmd
from trainer.contract import parse_event
from trainer.health.stragglers import SlowRanks
from trainer.health.watchdog import frame_of_interest, judge

TASKS_FILE = str(Path(tasks.__file__).resolve())
#: The line of hang_here that sleeps: where a hung rank 1 is.
HANG_LINE = next(
    n
    for n, text in enumerate(
        inspect.getsourcelines(tasks.hang_here)[0], tasks.hang_here.__code__.co_firstlineno
    )
    if "time.sleep" in text
)
STUCK_AFTER_S = 2
#: The longest rank 1 hangs when nothing names it (below the process group's timeout).
HANG_S = 200
RUN_TIMEOUT_S = 420


def _task_args(**args: object) -> str:
    return "task_args=" + json.dumps(args)


def _two_ranks_until_named(
    tmp_path: Path, release: Path, *args: str, **overrides: object
) -> Result:
    """A 2-rank run under torchrun; once rank 0 prints the verdict (a ``stuck`` event with a
    culprit), ``release`` is created, which ends the hang (``tasks.hang_here``): the hang lasts
    until it is named, however long a step takes on this machine."""
    cmd = torchrun_cmd(2, *common_args(tmp_path, **overrides), *args)
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=base_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    stderr: list[str] = []
    drain = threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)
    drain.start()
    deadline = threading.Timer(RUN_TIMEOUT_S, proc.kill)
    deadline.start()
    stdout = []
    try:
        for line in proc.stdout:
            stdout.append(line)
            event = parse_event(line)
            if event is not None and event["event"] == "stuck" and "culprit" in event:
                release.touch()
        rc = proc.wait()
    finally:
        deadline.cancel()
    drain.join(timeout=30)
    r = Result(rc, "".join(stdout), "".join(stderr))
    assert r.rc == 0, r.stderr[-3000:]
    return r


def _stuck(r: Result) -> tuple[list[dict], list[dict]]:
    """(the verdicts, the ranks' own events) among the ``stuck`` events."""
    stuck = r.of("stuck")
    return [e for e in stuck if "culprit" in e], [e for e in stuck if "culprit" not in e]


@pytest.mark.slow
def test_a_hung_rank_is_named_with_its_frame_a_slow_one_flagged_and_slow_moments_pass(
    tmp_path: Path,
) -> None:
    """One run: rank 1 is slowed every step (a straggler from the third log window), takes
    twice the limit over its first step, and hangs in its 20th until it is named; rank 0's
    checkpoints (it reads the state) take twice the limit. Only the hang is named."""
    slow_s, hang_s = 2 * STUCK_AFTER_S, HANG_S
    r = _two_ranks_until_named(
        tmp_path,
        tmp_path / "named",
        _task_args(
            slow_rank=1,
            slow_s=0.05,
            slow_first_s=slow_s,
            hang_rank=1,
            hang_call=20,
            hang_s=hang_s,
            hang_release=str(tmp_path / "named"),
            slow_state_rank=0,
            slow_state_s=slow_s,
        ),
        max_steps=24,
        log_every=3,
        **{
            "watchdog.stuck_after_s": STUCK_AFTER_S,
            "watchdog.straggler_windows": 3,
            "checkpoint.every_steps": 12,
            "timeout_s": hang_s + 60,
        },
    )
    verdicts, own = _stuck(r)
    verdict, moved = verdicts  # the hang's verdict, then "the job moves again": nothing else

    # The slow moments happened: the first window and each checkpoint took longer than the limit.
    assert r.of("train")[0]["step_time_s"] * 3 >= slow_s
    assert [c["step"] for c in r.of("checkpoint")] == [12, 24]
    assert r.of("done")[0]["elapsed_s"] >= 3 * slow_s + verdict["stuck_s"]
    assert verdict["culprit"] == 1 and verdict["culprits"] == [1], verdict
    assert verdict["frame"]["file"] == TASKS_FILE
    assert (verdict["frame"]["function"], verdict["frame"]["line"]) == ("hang_here", HANG_LINE)
    assert verdict["in_collective"] == "gradient all-reduce" and verdict["waiting"] == [0]
    assert verdict["silent"] == [] and verdict["rank_in_collective"] is None
    assert verdict["pod"] == socket.gethostname() and verdict["step"] == 19
    # Named after the configured time, while rank 1 still slept; then the job moved again.
    assert STUCK_AFTER_S <= verdict["stuck_s"] < hang_s, verdict
    assert moved == {
        "event": "stuck",
        "culprit": 1,
        "recovered": True,
        "stuck_s": moved["stuck_s"],
        "step": moved["step"],
    }
    assert moved["stuck_s"] >= verdict["stuck_s"] and r.events.index(moved) > r.events.index(
        verdict
    )

    by_rank = {e["rank"]: e for e in own if not e.get("recovered")}
    assert set(by_rank) == {0, 1} and len(own) == 4  # each rank: stuck once, moving once
    hung, waiting = by_rank[1], by_rank[0]
    assert hung["in_collective"] is None
    assert waiting["in_collective"] == "gradient all-reduce"
    # torch's Flight Recorder: rank 0 entered one collective more than rank 1, not completed.
    # (Whether gloo's recorder has marked rank 1's last one completed yet varies: on gloo the
    # loop's record says whether a rank waits.)
    assert waiting["collective"] == {
        "op": "gloo:all_reduce",
        "seq": hung["collective"]["seq"] + 1,
        "completed": False,
    }
    assert waiting["frame"]["file"].endswith("trainer/parts/step.py")
    # Every thread's stack (gloo's are C++ threads, the watchdog's is left out), the loop's
    # first, innermost frames first.
    loop = hung["stack"][0]
    assert loop["thread"] == "MainThread"
    assert [f["function"] for f in loop["frames"][:2]] == ["hang_here", "loss"]
    assert {e["rank"] for e in own if e.get("recovered")} == {0, 1}

    (straggler,) = r.of("straggler")
    assert straggler["rank"] == 1 and straggler["pod"] == socket.gethostname()
    assert straggler["node"] is None  # not in a pod: no NODE_NAME
    assert straggler["step"] == 9 and straggler["windows"] == 3  # the third window in a row
    assert straggler["step_time_s"] >= 0.05 > straggler["median_s"]
    assert straggler["factor"] == straggler["step_time_s"] / straggler["median_s"] >= 1.5
    # Each train event from then on says who lags now.
    lags = {e["step"]: e.get("stragglers") for e in r.of("train")}
    assert lags[6] is None and [s["rank"] for s in lags[9]] == [1] == [s["rank"] for s in lags[24]]
    assert lags[9][0]["pod"] == socket.gethostname() and lags[9][0]["step_time_s"] >= 0.05


# ---------------------------------------------------------------------------------------------
# The rules


def _record(rank: int, in_collective: str | None, seq: int | None = None, **more: object) -> dict:
    frame = {"file": f"/code/rank{rank}.py", "line": 10 + rank, "function": f"f{rank}"}
    collective = None if seq is None else {"op": "gloo:all_reduce", "seq": seq}
    return {
        "rank": rank,
        "step": 7,
        "stuck_s": 20.0 + rank,
        "in_collective": in_collective,
        "collective": collective,
        "frame": frame,
        "stack": [{"thread": "MainThread", "frames": [frame]}],
        "hostname": f"pod-{rank}",
        "node": "node-a",
    }


def test_the_verdict_names_the_rank_outside_the_collective_the_others_wait_in() -> None:
    records = {0: _record(0, "barrier"), 1: _record(1, None), 2: _record(2, "barrier")}
    got = judge(records, 3)
    assert got["culprit"] == 1 and got["culprits"] == [1]
    assert got["in_collective"] == "barrier" and got["waiting"] == [0, 2]
    assert got["frame"] == records[1]["frame"] and got["pod"] == "pod-1"
    assert got["stuck_s"] == 22.0 and got["silent"] == []


def test_a_rank_that_does_not_answer_is_the_culprit_without_a_frame() -> None:
    got = judge({0: _record(0, "gradient all-reduce"), 1: _record(1, "gradient all-reduce")}, 3)
    assert got["culprit"] == 2 and got["silent"] == [2] and got["frame"] is None


def test_when_every_rank_waits_the_one_behind_is_the_culprit_and_none_when_level() -> None:
    behind = {0: _record(0, "barrier", 12), 1: _record(1, "all-reduce", 11)}
    got = judge(behind, 2)
    assert got["culprit"] == 1 and got["in_collective"] == "barrier"
    assert got["rank_in_collective"] == "all-reduce"
    level = judge({0: _record(0, "barrier", 12), 1: _record(1, "barrier", 12)}, 2)
    assert level["culprit"] is None and level["waiting"] == [0, 1] and level["frame"] is None


def test_when_no_rank_waits_no_rank_is_blamed_and_the_first_ones_frame_is_shown() -> None:
    got = judge({0: _record(0, None), 1: _record(1, None)}, 2)
    assert got["culprit"] is None and got["waiting"] == []
    assert got["frame"] == _record(0, None)["frame"]


def test_the_frame_of_interest_is_past_torch_and_the_standard_library() -> None:
    import threading

    import torch

    frames = [
        {"file": threading.__file__, "line": 1, "function": "wait"},
        {"file": torch.__file__, "line": 2, "function": "barrier"},
        {"file": "/code/task.py", "line": 3, "function": "loss"},
    ]
    assert frame_of_interest(frames) == frames[2]
    assert frame_of_interest(frames[:2]) == frames[0]


def test_a_straggler_is_named_after_n_slow_windows_in_a_row_and_once_more_when_it_keeps_up() -> (
    None
):
    rule = SlowRanks(1.5, 3, 3)
    slow, even = [1.0, 1.0, 2.0], [1.0, 1.0, 1.0]
    assert rule.see(slow) == [] and rule.see(slow) == []
    assert rule.see(even) == []  # not in a row: counted again from here
    assert rule.see(slow) == [] and rule.see(slow) == []
    (named,) = rule.see(slow)
    assert named == {"rank": 2, "step_time_s": 2.0, "median_s": 1.0, "factor": 2.0}
    assert rule.see(slow) == []  # once
    assert rule.see(even) == [] and rule.see(even) == []
    assert rule.see([1.0, 1.0, math.nan]) == []  # no time from rank 2: neither way
    (kept_up,) = rule.see(even)
    assert kept_up["rank"] == 2 and kept_up["recovered"] is True


def test_on_gloo_the_loops_record_says_whether_a_rank_waits() -> None:
    """gloo's recorder can show the collective a rank has left (and hangs after) as not
    completed; NCCL's marks completion from its own watchdog and is believed."""
    from trainer.health.watchdog import _in_collective

    stale = {"op": "gloo:all_reduce", "seq": 41, "completed": False}
    assert _in_collective(None, stale, "gloo") is None
    assert _in_collective("gradient all-reduce", stale, "gloo") == "gradient all-reduce"
    nccl = {"op": "nccl:all_reduce", "seq": 41, "completed": False}
    assert _in_collective(None, nccl, "nccl") == "nccl:all_reduce"
    assert _in_collective("barrier", {**nccl, "completed": True}, "nccl") is None
