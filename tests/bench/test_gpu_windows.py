"""The trainer's and nanoGPT's loop's timed windows start and end at the same point of a step.

Both read one clock, ``trainer.parts.window.StepClock``, which synchronizes the device before it
reads the time. Each reading is recorded here with what had happened by then (optimizer steps taken,
``train`` events printed), for both loops on CPU with the same settings: a window must end after
its last step's update and before its own event is printed, the next one must start at that same
reading, and each event's time must be the difference of its two readings.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from bench.gpu import baseline
from tests.trainer.conftest import free_port
from trainer import distributed
from trainer.config import build_config
from trainer.parts import window
from trainer.tasks import load_task
from trainer.telemetry.events import Reporter
from trainer.train import Trainer

SETTINGS = {
    "task": "lm",
    "task_args": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32, "dropout": 0.0},
    "batch_size": 4,
    "max_steps": 8,
    "log_every": 2,
    "eval_batches": 1,
    "device": "cpu",
    "progress": "never",
    "resume": "never",
}


class _Recorder:
    """Every StepClock reading, with the optimizer steps taken and train events printed by then."""

    def __init__(self, stream: io.StringIO):
        self.stream, self.steps, self.readings = stream, 0, []

    def trains(self) -> int:
        return sum('"event": "train"' in line for line in self.stream.getvalue().splitlines())

    def events(self) -> list[dict]:
        lines = self.stream.getvalue().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]  # not human lines


@pytest.fixture
def recorded(monkeypatch):
    """Patches StepClock to record its readings into the current recorder."""
    current: dict[str, _Recorder] = {}
    read = window.StepClock.__call__

    def reading(self) -> float:
        t = read(self)
        rec = current["r"]
        rec.readings.append((t, rec.steps, rec.trains()))
        return t

    monkeypatch.setattr(window.StepClock, "__call__", reading)

    def start(stream: io.StringIO) -> _Recorder:
        current["r"] = _Recorder(stream)
        return current["r"]

    hook = register_optimizer_step_post_hook(
        lambda *_: setattr(current["r"], "steps", current["r"].steps + 1)
    )
    try:
        yield start
    finally:
        hook.remove()


def _windows(rec: _Recorder) -> list[tuple[int, int]]:
    """(steps, train events) at each reading that bounds a window: the last reading before the
    first step, then one per train event. Checks that each event's time is the difference of its
    two readings."""
    trains = [e for e in rec.events() if e["event"] == "train"]
    starts = [r for r in rec.readings if r[1] == 0]
    assert starts, "no clock reading before the first step"
    bounds = [starts[-1]]
    for k, event in enumerate(trains):
        ends = [r for r in rec.readings if r[1] == event["step"] and r[2] == k]
        assert len(ends) == 1, (event, rec.readings)
        bounds.append(ends[0])
        steps = event["step"] - (trains[k - 1]["step"] if k else 0)
        elapsed = bounds[-1][0] - bounds[-2][0]
        assert event["step_time_s"] * steps == pytest.approx(elapsed, rel=1e-9), event
    return [(steps, trains) for _, steps, trains in bounds]


def test_the_trainer_and_nanogpts_loop_time_the_same_windows(
    recorded, monkeypatch, tmp_path: Path
) -> None:
    cfg = build_config({**SETTINGS, "checkpoint": {"dir": str(tmp_path / "ckpt")}})
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    env = distributed.setup("cpu", "gloo", 60)
    try:
        out = io.StringIO()
        ours = recorded(out)
        trainer = Trainer(
            cfg,
            env,
            load_task(cfg.task, cfg.task_args),
            Reporter(True, cfg.max_steps, "never", None, stream=out),
        )
        trainer.fit()
    finally:
        distributed.teardown()
    bare_out = io.StringIO()
    theirs = recorded(bare_out)
    torch.manual_seed(0)
    baseline.train("ddpjob", cfg, stream=bare_out)

    expected = [(0, 0)] + [(step, k) for k, step in enumerate(range(2, 9, 2))]
    assert _windows(ours) == expected
    assert _windows(theirs) == expected


def test_the_clock_waits_for_the_device_before_it_reads_the_time(monkeypatch) -> None:
    """On a GPU the reading comes after a synchronize of the run's device (so the window holds
    its steps' device work); on CPU there is nothing to wait for."""
    order = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: order.append(device))
    read = time.perf_counter
    monkeypatch.setattr(window.time, "perf_counter", lambda: order.append("time") or read())
    window.StepClock(torch.device("cuda", 1))()
    assert order == [torch.device("cuda", 1), "time"]
    order.clear()
    window.StepClock(torch.device("cpu"))()
    assert order == ["time"]
