"""A checkpoint costs the loop the copy of the state, not its write: a real 2-rank gloo run
(``Trainer.fit`` in two processes) whose rank 0 writes through a store that holds one step's
state until the loop has trained further. The manager's own rules (a save returns before its
write, waits for the one before): tests/trainer/test_checkpoint.py.
"""

from __future__ import annotations

import gc
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.conftest import TEST_TASK, free_port, one_of_two_ranks, spawn_ranks
from trainer import distributed
from trainer.checkpoint.manager import STATE, step_name

#: The save whose write is held, and how many steps the loop must take while it is.
SAVE_AT, STEPS_DURING = 8, 6
#: How long the held write waits for those steps before it gives up (below the group's timeout).
HOLD_S = 30
#: Each step's least time (the task sleeps in it): the held write lasts STEPS_DURING of them,
#: many times what the save's copy of a small model costs even on a loaded machine, as the
#: steps of a real model do; steps of a few milliseconds left the write as short as one
#: scheduling delay of the save's call.
STEP_S = 0.1


def _held_worker(rank: int, port: int, out_dir: str, settings: dict[str, Any]) -> None:
    """One rank trains; rank 0's store holds the write of step SAVE_AT's state until the loop
    has done step SAVE_AT + STEPS_DURING, and rank 0 writes down, in order, each step done, the
    held write's start and end, and each ``checkpoint`` event, with what the loop paid for each
    save."""
    try:
        timeline = _train(rank, port, settings)
        if rank == 0:
            Path(out_dir, "timeline.json").write_text(json.dumps(timeline))
    finally:
        gc.collect()  # the trainer, in cycles with the wrappers below, holds the group
        distributed.teardown()


def _train(rank: int, port: int, settings: dict[str, Any]) -> list[list[Any]]:
    trainer = one_of_two_ranks(rank, port, settings)
    timeline: list[list[Any]] = []
    if rank == 0:
        _hold_a_write(trainer, timeline)
    assert trainer.fit() == "completed"
    return timeline


def _hold_a_write(trainer: Any, timeline: list[list[Any]]) -> None:
    steps = threading.Condition()
    done = [0]
    run_step = trainer.train_step.run

    def counted_step(*args: Any, **kwargs: Any) -> Any:
        out = run_step(*args, **kwargs)
        with steps:
            done[0] += 1
            timeline.append(["step", done[0]])
            steps.notify_all()
        return out

    trainer.train_step.run = counted_step
    store = trainer.checkpoints.storage.store
    write = store.write

    def held_write(name: str, produce: Any) -> tuple[int, int]:
        if name == f"{step_name(SAVE_AT)}/{STATE}":
            started = time.perf_counter()
            with steps:
                timeline.append(["held", done[0]])
                steps.wait_for(lambda: done[0] >= SAVE_AT + STEPS_DURING, timeout=HOLD_S)
                timeline.append(["released", done[0], time.perf_counter() - started])
        return write(name, produce)

    store.write = held_write
    save = trainer.checkpoints.save

    def timed_save(step: int, state_dict: Any) -> None:
        started = time.perf_counter()
        save(step, state_dict)
        timeline.append(["saved", step, time.perf_counter() - started])

    trainer.checkpoints.save = timed_save
    report = trainer.checkpoints.report

    class Recorded:
        def event(self, name: str, **fields: Any) -> None:
            timeline.append([name, fields])
            report.event(name, **fields)

    trainer.checkpoints.report = Recorded()


@pytest.mark.slow
def test_steps_go_on_while_a_checkpoint_is_written_and_the_save_stalls_a_fraction_of_it(
    tmp_path: Path,
) -> None:
    settings = {
        "task": TEST_TASK,
        "task_args": {"sleep_s": STEP_S},
        "max_steps": 2 * SAVE_AT,
        "batch_size": 8,
        "eval_every": 0,
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "every_steps": SAVE_AT},
    }
    spawn_ranks(_held_worker, (free_port(), str(tmp_path), settings))
    timeline = json.loads((tmp_path / "timeline.json").read_text())

    (held,) = [e for e in timeline if e[0] == "held"]
    (released,) = [e for e in timeline if e[0] == "released"]
    # The loop trained on while step SAVE_AT's state was being written.
    assert held[1] <= SAVE_AT + 1 and released[1] == SAVE_AT + STEPS_DURING, timeline
    steps_in_write = timeline[timeline.index(held) : timeline.index(released)]
    assert [e[1] for e in steps_in_write if e[0] == "step"][-1] == SAVE_AT + STEPS_DURING
    # Each save is reported once complete, after the steps its write let through.
    checkpoints = [e[1] for e in timeline if e[0] == "checkpoint"]
    assert [c["step"] for c in checkpoints] == [SAVE_AT, 2 * SAVE_AT], timeline
    first = timeline.index(["checkpoint", checkpoints[0]])
    assert first > timeline.index(["step", SAVE_AT + STEPS_DURING])
    # The write lasted at least as long as it was held; the save stalled the loop a fraction
    # of that: what the loop paid (the call), and what the event says it paid, both.
    (saved,) = [e for e in timeline if e[0] == "saved" and e[1] == SAVE_AT]
    write_s, stall_s, save_call_s = checkpoints[0]["write_s"], checkpoints[0]["stall_s"], saved[2]
    assert write_s >= released[2], (write_s, released)
    assert stall_s <= save_call_s < write_s / 2, (stall_s, save_call_s, write_s)
