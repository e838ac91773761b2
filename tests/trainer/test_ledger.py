"""The ledger (``trainer/ledger.py``): what each run of a job cost, carried across restarts.

Its arithmetic on plain records (settling the runs before a resume, merging old ones, choosing
between the checkpoint's copy and the record's), its background writer, and real runs: one
killed with ``kill -9`` after a checkpoint and resumed, whose resumed run names the steps it
trains again and the time the killed run lost, checked against what the killed run printed;
and a re-launched pod, whose workers count start-up from the container's start.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.trainer.conftest import REPO, base_env, common_args, kubeflow_env, parse_events, run
from tests.trainer.conftest import trainer_cmd as cmd
from trainer import ledger
from trainer.ledger import EVAL, STALL, STEPS, choose, merge_oldest, settle, view

PARTS = ("startup_s", "productive_s", "stall_s", "eval_s", "lost_s", "other_s")


def _run(rid: str, *, launched: float, first: float | None, start: int, last: int, **kw) -> dict:
    """A run's record as the ledger keeps it: steps/stall/eval seconds, marks [step, ...]."""
    record = ledger.new_run(launched, start)
    record.update(id=rid, first_step_at=first, last_step=last, ended_at=kw.pop("ended"), **kw)
    return record


def _sums_to_its_time(v: dict) -> None:
    assert sum(v[k] for k in PARTS) == pytest.approx(v["ended_at"] - v["launched_at"], abs=0.01)


# ---------------------------------------------------------------------------------------------
# Arithmetic


def test_a_run_resumed_from_its_own_checkpoint_keeps_what_it_had_done_by_that_save():
    # 10 s of start-up, then steps 1..57 over 60 s; saves at 25 and 50 (marks: the run's steps,
    # stall and eval seconds at the end of each save); killed, last seen alive at 100 + 70.
    killed = _run(
        "a", launched=100.0, first=110.0, start=0, last=57, ended=170.0,
        **{STEPS: 55.0, STALL: 3.0, EVAL: 2.0},
        marks=[[25, 24.0, 1.0, 0.0], [50, 48.0, 2.0, 2.0]],
    )  # fmt: skip
    (settled,) = settle([killed], resumed_step=50)
    v = view(settled)
    assert (v["kept_step"], v["lost_steps"]) == (50, 7)
    # Kept: what the run had done by the end of step 50's save. Lost: the rest of its 60 s
    # after the first step, up to when it was last seen (170 - 110 - 52).
    assert (v["productive_s"], v["stall_s"], v["eval_s"]) == (48.0, 2.0, 2.0)
    assert v["lost_s"] == pytest.approx(8.0)
    assert v["startup_s"] == 10.0
    _sums_to_its_time(v)
    # The same run, not resumed (it is the job's last): everything it did is kept.
    v = view(killed)
    assert (v["lost_steps"], v["lost_s"], v["productive_s"]) == (0, 0.0, 55.0)
    _sums_to_its_time(v)


def test_a_resume_from_an_older_checkpoint_loses_every_step_after_it_in_every_run():
    # Run a: steps 1..30, saves at 10 and 20. Run b resumed from 20, reached 36, saved at 30
    # (that checkpoint torn later). Run c resumes from 20: b's steps are all lost, a keeps 20.
    a = _run(
        "a", launched=0.0, first=5.0, start=0, last=30, ended=40.0, kept_step=20,
        **{STEPS: 30.0, STALL: 2.0, EVAL: 0.0}, marks=[[10, 10.0, 1.0, 0.0], [20, 20.0, 2.0, 0.0]],
    )  # fmt: skip
    b = _run(
        "b", launched=50.0, first=54.0, start=20, last=36, ended=72.0,
        **{STEPS: 17.0, STALL: 1.0, EVAL: 0.0}, marks=[[30, 10.0, 1.0, 0.0]],
    )  # fmt: skip
    va, vb = (view(r) for r in settle([a, b], resumed_step=20))
    assert (va["kept_step"], va["lost_steps"], va["productive_s"]) == (20, 10, 20.0)
    assert va["lost_s"] == pytest.approx(35.0 - 22.0)
    assert (vb["kept_step"], vb["lost_steps"], vb["productive_s"], vb["stall_s"]) == (20, 16, 0, 0)
    assert vb["lost_s"] == pytest.approx(18.0)  # all of its time after its first step
    for v in (va, vb):
        _sums_to_its_time(v)


def test_a_run_that_died_before_its_first_step_was_all_start_up():
    dead = _run("a", launched=0.0, first=None, start=40, last=40, ended=12.5)
    v = view(settle([dead], resumed_step=40)[0])
    assert (v["startup_s"], v["lost_s"], v["lost_steps"]) == (12.5, 0.0, 0)
    _sums_to_its_time(v)


def test_the_record_is_taken_when_it_continues_the_checkpoints_runs():
    ckpt = [{"id": "a", "last_step": 50}]
    record = [{"id": "a", "last_step": 57}, {"id": "b", "last_step": 53}]
    assert choose(ckpt, record) == record  # written after the save: it knows more
    assert choose(ckpt, [{"id": "x", "last_step": 9}]) == ckpt  # another job's: not ours
    assert choose(None, record) == record  # no checkpoint (died before the first): the record
    assert choose(ckpt, None) == ckpt


def test_old_runs_merge_into_one_that_keeps_their_sums_and_the_time_between():
    runs = [
        _run(f"r{i}", launched=100.0 * i, first=100.0 * i + 5, start=0, last=0,
             ended=100.0 * i + 60, **{STEPS: 50.0, STALL: 5.0, EVAL: 0.0})
        for i in range(5)
    ]  # fmt: skip
    merged = merge_oldest(runs, limit=3)
    assert len(merged) == 3 and merged[0]["merged"] == 3
    v = view(merged[0])
    assert (v["launched_at"], v["ended_at"]) == (0.0, 260.0)
    assert (v["startup_s"], v["productive_s"], v["stall_s"]) == (15.0, 150.0, 15.0)
    assert v["other_s"] == 80.0  # 40 s between each two of them
    _sums_to_its_time(v)


class _Store:
    """A store that keeps every write, for the writer's test."""

    def __init__(self):
        self.writes: list[dict] = []
        self.cond = threading.Condition()

    def write_bytes(self, name: str, data: bytes) -> None:
        with self.cond:
            self.writes.append(json.loads(data))
            self.cond.notify_all()

    def wait_for(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.writes) >= n, timeout=30), self.writes


def test_the_writer_beats_while_the_run_goes_on_and_stops_once_it_ended():
    store = _Store()
    writer = ledger._Writer(store, heartbeat_s=0.01)
    run_ = ledger.new_run(0.0, 0)
    writer.submit({"runs": [run_]}, running=True)
    store.wait_for(4)
    beats = [w["runs"][-1]["ended_at"] for w in store.writes]
    assert beats[0] == 0.0 and beats[1] < beats[2] < beats[3]  # alive, later each time
    final = dict(run_, end="completed", ended_at=1.0)
    writer.submit({"runs": [final]}, running=False)
    store.wait_for(len(store.writes) + 1)
    count = len(store.writes)
    time.sleep(0.05)  # five heartbeats' time: none may come after the end
    writer.close(timeout_s=10)
    assert len(store.writes) == count and store.writes[-1]["runs"][-1] == final


# ---------------------------------------------------------------------------------------------
# Real runs


def _goodput(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "goodput"]


@pytest.mark.slow
def test_a_run_killed_after_a_checkpoint_and_resumed_reports_the_steps_and_time_it_lost(
    tmp_path: Path,
) -> None:
    every, sleep_s, max_steps = 5, 0.1, 20
    args = common_args(
        tmp_path,
        max_steps=max_steps,
        log_every=1,
        **{"checkpoint.every_steps": every, "task_args.sleep_s": sleep_s},
    )
    proc = subprocess.Popen(
        cmd(*args), cwd=REPO, env=base_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    first_run: list[dict] = []
    try:
        for line in proc.stdout:
            event = parse_events(line)
            first_run += event
            # Past the step-5 checkpoint (complete: its event is printed) by three steps.
            saved = [e["step"] for e in first_run if e["event"] == "checkpoint"]
            if event and event[0]["event"] == "train" and saved and event[0]["step"] >= 8:
                break
    finally:
        psutil.Process(proc.pid).send_signal(signal.SIGKILL)
        killed_at = time.time()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert [e["step"] for e in first_run if e["event"] == "checkpoint"] == [every]
    printed = [e["step"] for e in first_run if e["event"] == "train"]
    # What the killed run got to write in its record (in the background, after each window):
    # its last window, or the one before if the kill came first.
    record = json.loads((tmp_path / "ckpt" / ledger.RECORD).read_text())["runs"][-1]
    assert printed[-1] - 1 <= record["last_step"] <= printed[-1]

    resumed = run(cmd(*args))
    assert resumed.rc == 0, resumed.stderr[-3000:]
    (note,) = resumed.of("resume")
    assert note["step"] == every
    # Steps every+1.. were trained twice: by the killed run, then again by this one.
    again = [e["step"] for e in resumed.of("train")]
    assert again[0] == every + 1
    assert set(printed) & set(again) == set(range(every + 1, printed[-1] + 1))

    first_view, *_ = _goodput(resumed.events)[0]["runs"]  # the killed run, settled at the start
    assert first_view["id"] == record["id"]
    assert first_view["kept_step"] == every
    assert first_view["lost_steps"] == record["last_step"] - every
    # Its lost time: from the end of step 5's save (after step 5's goodput was printed) to the
    # last moment the record saw it, after the steps it trained for nothing, each >= sleep_s.
    step5 = next(g for g in _goodput(first_run) if g["runs"][-1]["last_step"] == every)
    assert first_view["lost_s"] >= first_view["lost_steps"] * sleep_s
    assert first_view["lost_s"] <= killed_at - step5["at"]
    assert first_view["ended_at"] <= killed_at
    _sums_to_its_time(first_view)

    done = _goodput(resumed.events)[-1]["runs"]
    assert [r["id"] for r in done[:1]] == [record["id"]] and len(done) == 2
    last = done[-1]
    assert (last["start_step"], last["last_step"], last["end"]) == (every, max_steps, "completed")
    assert last["lost_steps"] == 0 and last["lost_s"] == 0
    # Its steps took at least sleep_s each; all its parts add up to its time.
    assert last["productive_s"] + last["stall_s"] >= (max_steps - every - 1) * sleep_s
    _sums_to_its_time(last)
    assert last["launched_at"] > killed_at


@pytest.mark.slow
def test_a_relaunched_pods_workers_count_start_up_from_the_containers_start(tmp_path):
    """Under the torchrun re-launch (nprocPerNode 2), the ledger's run starts when the pod's
    process did, not when torchrun started the workers, seconds later."""
    env = kubeflow_env(nproc_per_node=2, world_size=2)
    before = time.time()
    proc = subprocess.Popen(
        cmd(*common_args(tmp_path, max_steps=2)), cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    after = time.time()
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    (run_,) = _goodput(parse_events(out))[-1]["runs"]
    assert before - 0.05 <= run_["launched_at"] <= after + 0.05
