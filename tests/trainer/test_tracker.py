"""The MLflow tracker (trainer/telemetry/tracker.py) against a real MLflow tracking server (the
``mlflow`` package's, tests/trainer/mlflow_server.py): one run per job across restarts, no step
logged twice, the end status, and a server that does not answer.

Rank 0's events are fed as the reporter feeds them; a whole run of the trainer is in
test_telemetry_runs.py.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.trainer.conftest import free_port
from trainer.checkpoint.storage import open_store
from trainer.contract import CHECKPOINT, EVAL, GOODPUT, START, TRAIN
from trainer.telemetry.tracker import RECORD, Settings, Tracker

pytestmark = pytest.mark.slow

CONFIG = {"lr": 0.001, "checkpoint": {"dir": "/ckpt", "keep": 3}, "task_args": {}}


def settings(uri: str, experiment: str) -> Settings:
    env = {"DDPJOB_JOB_NAME": "job-a", "DDPJOB_NAMESPACE": "team", "DDPJOB_JOB_API": "trainjob"}
    # The code a shipped working directory brought (controller/render/workdir.py).
    env |= {"DDPJOB_WORKDIR_DIGEST": "sha256:ab12", "DDPJOB_WORKDIR_COMMIT": "c0ffee"}
    found = Settings.from_env(uri, experiment, "/ckpt", env)
    assert found is not None
    return found


def feed(tracker: Tracker, start: int, steps: range) -> None:
    """What rank 0's reporter hands a tracker over a run from ``start``."""
    tracker.event(START, {"step": start, "world_size": 2, "config": CONFIG})
    for step in steps:
        tracker.event(TRAIN, {"step": step, "max_steps": 100, "loss": 10.0 / step, "lr": 1e-3})
        tracker.event(GOODPUT, {"runs": [{"productive_s": 3.0, "startup_s": 1.0}]})
    last = steps[-1]
    tracker.event(EVAL, {"step": last, "metrics": {"loss": 0.5, "accuracy": 0.9}})
    tracker.event(CHECKPOINT, {"step": last, "path": f"/ckpt/step_{last:08d}", "stall_s": 0.1})


def announced(tracker: Tracker, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while (got := tracker.announcement()) is None:
        assert time.monotonic() < deadline, "the tracker never found its run"
        time.sleep(0.05)
    return got


def test_one_run_per_job_across_restarts_with_no_step_twice(mlflow_server, tmp_path: Path):
    store = open_store(str(tmp_path / "ckpt"))
    s = settings(mlflow_server.url, "exp-restarts")

    first = Tracker.start(s, store, resume=True, max_points=1000)
    feed(first, 0, range(10, 40, 10))  # steps 10, 20, 30
    assert first.end("preempted", wait_s=60) == 0
    first_run = announced(first)
    assert first_run["resumed"] is False
    assert first_run["url"] == (
        f"{mlflow_server.url}/#/experiments/{first_run['experiment_id']}/runs/{first_run['run_id']}"
    )
    assert RECORD in store.list() or (tmp_path / "ckpt" / RECORD).exists()
    run = mlflow_server.run(first_run["run_id"])
    assert run["info"]["status"] == "RUNNING"  # preempted: resumed later
    assert run["info"]["run_name"] == "job-a"
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["lr"] == "0.001" and params["checkpoint.keep"] == "3"
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags["ddpjob.job"] == "job-a" and tags["ddpjob.api"] == "trainjob"
    assert tags["ddpjob.code_digest"] == "sha256:ab12"
    assert tags["mlflow.source.git.commit"] == "c0ffee" and "ddpjob.code_dirty" not in tags
    assert tags["ddpjob.checkpoint"] == "/ckpt/step_00000030"

    # Resumed from the checkpoint at step 20: steps 30 and 40 are trained again and 50 is new.
    second = Tracker.start(s, store, resume=True, max_points=1000)
    feed(second, 20, range(30, 60, 10))
    assert second.end("completed", wait_s=60) == 0
    second_run = announced(second)
    assert second_run["run_id"] == first_run["run_id"] and second_run["resumed"] is True
    run = mlflow_server.run(first_run["run_id"])
    assert run["info"]["status"] == "FINISHED"
    loss = mlflow_server.history(first_run["run_id"], "loss")
    assert [step for step, _ in loss] == [10, 20, 30, 40, 50]  # each step once, none lost
    assert dict(loss)[30] == pytest.approx(10.0 / 30)
    assert mlflow_server.history(first_run["run_id"], "restarts") == [(40, 1.0)]
    assert [s for s, _ in mlflow_server.history(first_run["run_id"], "eval/accuracy")] == [30, 50]
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags["ddpjob.restarts"] == "1"
    assert len(mlflow_server.runs("exp-restarts")) == 1

    # resume=never starts a run of its own, and a failed run ends FAILED.
    third = Tracker.start(s, store, resume=False, max_points=1000)
    feed(third, 0, range(10, 20, 10))
    third.end("nonfinite", wait_s=60)
    third_run = announced(third)
    assert third_run["run_id"] != first_run["run_id"]
    assert mlflow_server.run(third_run["run_id"])["info"]["status"] == "FAILED"


def test_an_unreachable_server_is_one_warning_and_a_bounded_buffer(tmp_path: Path, caplog):
    port = free_port()  # nothing listens: refused at once
    s = settings(f"http://127.0.0.1:{port}", "exp-down")
    with caplog.at_level(logging.WARNING, logger="trainer.telemetry.tracker"):
        tracker = Tracker.start(s, open_store(str(tmp_path)), resume=True, max_points=5)
        started = time.monotonic()
        # 8 windows (loss and lr), 8 goodput points, 2 of evaluation, 1 checkpoint stall.
        feed(tracker, 0, range(1, 9))
        assert time.monotonic() - started < 5, "feeding the tracker waited for the server"
        deadline = time.monotonic() + 30
        while not caplog.records:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        dropped = tracker.end("completed", wait_s=2)
    # What was fed, none of it sent: 5 kept to the end, the rest pushed out as it came.
    assert dropped == 8 * 2 + 8 + 2 + 1
    (warning,) = caplog.records
    assert f"cannot reach the tracking server at http://127.0.0.1:{port}" in warning.getMessage()
    assert tracker.announcement() is None


class Forwarder:
    """A TCP port that forwards to ``target`` once started: a server that comes back."""

    def __init__(self, port: int, target: int):
        self.port, self.target = port, target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def start(self) -> None:
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.sock.close()


def test_points_queued_while_the_server_is_away_reach_it_when_it_answers(
    mlflow_server, tmp_path: Path, caplog
):
    forwarder = Forwarder(free_port(), mlflow_server.port)
    s = settings(f"http://127.0.0.1:{forwarder.port}", "exp-back")
    try:
        with caplog.at_level(logging.WARNING, logger="trainer.telemetry.tracker"):
            tracker = Tracker.start(s, open_store(str(tmp_path)), resume=True, max_points=1000)
            feed(tracker, 0, range(1, 6))
            deadline = time.monotonic() + 30
            while not caplog.records:  # it tried, and said so
                assert time.monotonic() < deadline
                time.sleep(0.05)
        forwarder.start()
        assert tracker.end("completed", wait_s=120) == 0
    finally:
        forwarder.close()
    run_id = announced(tracker)["run_id"]
    assert [step for step, _ in mlflow_server.history(run_id, "loss")] == [1, 2, 3, 4, 5]
    assert mlflow_server.run(run_id)["info"]["status"] == "FINISHED"
