"""The ledger (``trainer/health/ledger.py``): what each run of a job cost, carried across restarts.

Its arithmetic on plain records (settling the runs before a resume, merging old ones, choosing
between the checkpoint's copy and the record's) and its background writer. Real runs check it
in the runs of other tests: test_resume.py's kill -9 and resume (the steps and time the killed
run lost) and test_launch.py's torchrun re-launch (start-up from the container's start).
"""

from __future__ import annotations

import json
import threading

import pytest

from trainer.health import ledger
from trainer.health.ledger import EVAL, STALL, STEPS, choose, merge_oldest, settle, view

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
    """A store that keeps every write, for the writer's test (it has no record to read)."""

    def __init__(self):
        self.writes: list[dict] = []
        self.cond = threading.Condition()

    def read_bytes(self, name: str) -> bytes:
        raise FileNotFoundError(name)

    def write_bytes(self, name: str, data: bytes) -> None:
        with self.cond:
            self.writes.append(json.loads(data))
            self.cond.notify_all()

    def wait_for(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.writes) >= n, timeout=30), self.writes


class _Events:
    def event(self, name: str, **fields) -> None:
        pass


def test_the_writer_beats_while_the_run_goes_on_and_stops_once_it_ended():
    store = _Store()
    led = ledger.Ledger(
        store, True, _Events(), resumed_step=0, state=None, keep=3, heartbeat_s=0.01
    )
    store.wait_for(4)
    submitted = led.run["ended_at"]  # the record queued at the start, then heartbeats
    beats = [w["runs"][-1]["ended_at"] for w in store.writes]
    assert beats[0] == submitted and beats[1] < beats[2] < beats[3]  # alive, later each time
    led.stepped(7)  # a step done after the record was submitted: the beats carry it
    store.wait_for(len(store.writes) + 2)
    assert store.writes[-1]["runs"][-1]["last_step"] == 7
    led.end("completed")
    final = led.state_dict()[-1]
    with store.cond:
        assert store.cond.wait_for(lambda: store.writes[-1]["runs"][-1] == final, timeout=30)
        count = len(store.writes)
    # Five of the heartbeat's chances pass (counted by the writer): none may write after the end.
    writer = led._writer
    chances = writer.beats
    assert writer.wait_until(lambda: writer.beats >= chances + 5, timeout_s=30)
    led.close(timeout_s=10)
    assert len(store.writes) == count and store.writes[-1]["runs"][-1] == final


def test_a_run_records_the_shipped_workdir_it_ran(monkeypatch):
    """The pod's DDPJOB_WORKDIR_* (controller/render/workdir.py) reach the run's record and the
    goodput event; without them the run ran the image's own code."""
    from trainer.contract import WORKDIR_COMMIT_ENV, WORKDIR_DIGEST_ENV, WORKDIR_DIRTY_ENV

    for name in (WORKDIR_DIGEST_ENV, WORKDIR_COMMIT_ENV, WORKDIR_DIRTY_ENV):
        monkeypatch.delenv(name, raising=False)
    assert view(ledger.new_run(100.0, 0))["workdir"] is None
    monkeypatch.setenv(WORKDIR_DIGEST_ENV, "sha256:" + "a" * 64)
    monkeypatch.setenv(WORKDIR_COMMIT_ENV, "c" * 40)
    monkeypatch.setenv(WORKDIR_DIRTY_ENV, "true")
    run = json.loads(json.dumps(ledger.new_run(100.0, 0)))  # as a checkpoint carries it
    assert view(run)["workdir"] == {
        "digest": "sha256:" + "a" * 64,
        "commit": "c" * 40,
        "dirty": True,
    }
