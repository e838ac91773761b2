"""Whole runs of the real trainer with its telemetry on: a pod's launcher serving both torchrun
workers' Prometheus metrics while they train (scraped mid-run, parsed as Prometheus does), and
one MLflow run (a real server) across a restart, or none reachable at all.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.trainer.conftest import (
    REPO,
    Result,
    base_env,
    common_args,
    free_port,
    kubeflow_env,
    run,
    trainer_cmd,
)
from tests.trainer.test_metrics import scrape, value
from trainer.contract import JOB_NAME_ENV, parse_event

pytestmark = pytest.mark.slow


def test_a_pods_launcher_serves_both_workers_metrics_while_they_train(tmp_path: Path):
    """The pod's path (PET_NPROC_PER_NODE=2: the trainer re-launches itself under torchrun):
    one port, both ranks, read while the run is in its steps (paced by the task); the workers'
    folder in the launcher's $TMPDIR is gone when it ends."""
    port = free_port()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = kubeflow_env(nproc_per_node=2, world_size=2) | {
        JOB_NAME_ENV: "scraped",
        "TMPDIR": str(tmp),
    }
    args = common_args(
        tmp_path,
        max_steps=40,
        log_every=2,
        **{"prometheus.serve": "true", "prometheus.port": port},
        task_args=json.dumps({"sleep_s": 0.1}),
    )
    proc = subprocess.Popen(
        trainer_cmd(*args),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines, start = [], None
        for line in proc.stdout:  # up to the second log window: both ranks have stepped
            lines.append(line)
            event = parse_event(line)
            if event and event["event"] == "start":
                start = event
            if event and event["event"] == "train" and event["step"] >= 4:
                break
        assert start is not None and start["metrics_url"].endswith(f":{port}/metrics")
        got = scrape(f"http://127.0.0.1:{port}/metrics")
        for rank in ("0", "1"):
            assert value(got, "ddpjob_step", rank=rank, job_name="scraped") >= 4
            assert value(got, "ddpjob_samples_total", rank=rank) >= 4 * 8
            assert value(got, "ddpjob_samples_per_second", rank=rank) > 0
            assert value(got, "ddpjob_step_seconds_count", rank=rank) >= 4
            assert value(got, "ddpjob_stuck", rank=rank) == 0
        assert value(got, "ddpjob_world_size", rank="0") == 2
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    done = [e for e in map(parse_event, lines + out.splitlines()) if e and e["event"] == "done"]
    assert done[0]["step"] == 40 and "tracking_dropped" not in done[0]
    assert not list(tmp.glob("ddpjob-metrics-*")), list(tmp.iterdir())


def run_tracked(tmp: Path, uri: str, max_steps: int, **env: str) -> Result:
    args = common_args(tmp, max_steps=max_steps, log_every=2, **{"checkpoint.every_steps": 4})
    env = base_env(MLFLOW_TRACKING_URI=uri, MLFLOW_EXPERIMENT_NAME="runs", **env)
    return run(trainer_cmd(*args), env=env, timeout=300)


def test_one_mlflow_run_through_a_restart(mlflow_server, tmp_path: Path):
    first = run_tracked(tmp_path, mlflow_server.url, 6, **{JOB_NAME_ENV: "tracked"})
    assert first.rc == 0, first.stderr[-3000:]
    (tracking,) = first.of("tracking")
    assert tracking["resumed"] is False and tracking["url"].startswith(mlflow_server.url)
    assert first.of("done")[0]["tracking_dropped"] == 0
    run_id = tracking["run_id"]
    info = mlflow_server.run(run_id)
    assert info["info"]["status"] == "FINISHED" and info["info"]["run_name"] == "tracked"
    params = {p["key"]: p["value"] for p in info["data"]["params"]}
    assert params["max_steps"] == "6" and params["checkpoint.every_steps"] == "4"

    # The job goes on (a longer run from the same checkpoints): the same run, continued.
    second = run_tracked(tmp_path, mlflow_server.url, 10, **{JOB_NAME_ENV: "tracked"})
    assert second.rc == 0, second.stderr[-3000:]
    (again,) = second.of("tracking")
    assert again["run_id"] == run_id and again["resumed"] is True
    assert [s for s, _ in mlflow_server.history(run_id, "loss")] == [2, 4, 6, 8, 10]
    assert mlflow_server.history(run_id, "restarts") == [(8, 1.0)]
    assert mlflow_server.run(run_id)["info"]["status"] == "FINISHED"
    assert len(mlflow_server.runs("runs")) == 1


def test_an_unreachable_tracking_server_costs_one_warning_and_no_step(tmp_path: Path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    result = run_tracked(tmp_path, uri, 8)
    assert result.rc == 0, result.stderr[-3000:]
    assert result.stderr.count("cannot reach the tracking server") == 1, result.stderr
    (done,) = result.of("done")
    assert done["step"] == 8 and done["reason"] == "completed"
    assert done["tracking_dropped"] > 0
    assert [e["step"] for e in result.of("train")] == [2, 4, 6, 8]
    assert not result.of("tracking")
    assert time.monotonic() - started < 300
