"""A rank that hangs is named with where it is; a rank that lags is flagged; a run that only has
slow moments (a first step, a checkpoint) says neither. Real 2-rank gloo runs under torchrun,
and the verdict's and the straggler's rules on their own (``trainer.watchdog.judge``,
``trainer.stragglers.SlowRanks``)."""

from __future__ import annotations

import inspect
import json
import math
import socket
from pathlib import Path

from tests.trainer import tasks
from tests.trainer.conftest import Result, base_env, common_args, run, torchrun_cmd
from trainer.stragglers import SlowRanks
from trainer.watchdog import frame_of_interest, judge

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


def _task_args(**args: object) -> str:
    return "task_args=" + json.dumps(args)


def _two_ranks(tmp_path: Path, *args: str, **overrides: object) -> Result:
    cmd = torchrun_cmd(2, *common_args(tmp_path, **overrides), *args)
    r = run(cmd, env=base_env(), timeout=300)
    assert r.rc == 0, r.stderr[-3000:]
    return r


def _stuck(r: Result) -> tuple[list[dict], list[dict]]:
    """(the verdicts, the ranks' own events) among the ``stuck`` events."""
    stuck = r.of("stuck")
    return [e for e in stuck if "culprit" in e], [e for e in stuck if "culprit" not in e]


def test_a_rank_that_hangs_before_the_all_reduce_is_named_by_rank_0_with_its_frame(
    tmp_path: Path,
) -> None:
    hang_s = 15
    r = _two_ranks(
        tmp_path,
        _task_args(hang_rank=1, hang_call=5, hang_s=hang_s),
        max_steps=10,
        **{"watchdog.stuck_after_s": STUCK_AFTER_S, "timeout_s": 120},
    )
    verdicts, own = _stuck(r)
    verdict, moved = verdicts  # one verdict, then one "the job moves again"
    assert verdict["culprit"] == 1 and verdict["culprits"] == [1], verdict
    assert verdict["frame"]["file"] == TASKS_FILE
    assert (verdict["frame"]["function"], verdict["frame"]["line"]) == ("hang_here", HANG_LINE)
    assert verdict["in_collective"] == "gradient all-reduce" and verdict["waiting"] == [0]
    assert verdict["silent"] == [] and verdict["rank_in_collective"] is None
    assert verdict["pod"] == socket.gethostname() and verdict["step"] == 4
    # Named after the configured time, while rank 1 still slept; then the job moved again.
    assert STUCK_AFTER_S <= verdict["stuck_s"] < hang_s, verdict
    assert moved == {
        "event": "stuck",
        "culprit": 1,
        "recovered": True,
        "stuck_s": moved["stuck_s"],
        "step": moved["step"],
    }
    assert moved["stuck_s"] >= hang_s and r.events.index(moved) > r.events.index(verdict)

    by_rank = {e["rank"]: e for e in own if not e.get("recovered")}
    assert set(by_rank) == {0, 1}
    hung, waiting = by_rank[1], by_rank[0]
    assert hung["in_collective"] is None and hung["collective"]["completed"] is True
    assert waiting["in_collective"] == "gradient all-reduce"
    # torch's Flight Recorder: rank 0 entered one collective more than rank 1, not completed.
    assert waiting["collective"] == {
        "op": "gloo:all_reduce",
        "seq": hung["collective"]["seq"] + 1,
        "completed": False,
    }
    assert waiting["frame"]["file"].endswith("trainer/step.py")
    # Every thread's stack (gloo's are C++ threads, the watchdog's is left out), the loop's
    # first, innermost frames first.
    loop = hung["stack"][0]
    assert loop["thread"] == "MainThread"
    assert [f["function"] for f in loop["frames"][:2]] == ["hang_here", "loss"]
    assert {e["rank"] for e in own if e.get("recovered")} == {0, 1}


def test_a_rank_slowed_every_step_is_named_a_straggler(tmp_path: Path) -> None:
    r = _two_ranks(
        tmp_path,
        _task_args(slow_rank=1, slow_s=0.05),
        max_steps=24,
        log_every=3,
        **{"watchdog.straggler_windows": 3},
    )
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
    assert not r.of("stuck")


def test_a_run_with_a_slow_first_step_and_a_slow_checkpoint_says_neither(tmp_path: Path) -> None:
    slow_s = 2 * STUCK_AFTER_S
    r = _two_ranks(
        tmp_path,
        # Rank 1's first step and rank 0's checkpoints (it reads the state) take twice the
        # limit; every step sleeps a little on both ranks, so they take about as long.
        _task_args(
            hang_rank=1,
            hang_call=1,
            hang_s=slow_s,
            slow_state_rank=0,
            slow_state_s=slow_s,
            sleep_s=0.02,
        ),
        max_steps=16,
        log_every=2,
        eval_every=5,
        **{"watchdog.stuck_after_s": STUCK_AFTER_S, "checkpoint.every_steps": 6},
    )
    assert not r.of("stuck") and not r.of("straggler"), r.stdout[-3000:]
    # The slow moments happened: the first window and each checkpoint took longer than the limit.
    assert r.of("train")[0]["step_time_s"] * 2 >= slow_s
    assert [c["step"] for c in r.of("checkpoint")] == [6, 12, 16]
    assert r.of("done")[0]["elapsed_s"] >= 4 * slow_s


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
