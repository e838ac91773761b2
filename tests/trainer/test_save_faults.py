"""Saves that survive storage faults, on 2 real gloo ranks checkpointing to a real S3 server
(moto's, tests/trainer/s3.py) behind a proxy that answers every write ``503 SlowDown`` for a while
(``Outage``): the client retries, a save that still fails is said with where and what the
server answered, training goes on and the next save is tried; the checkpoints that exist are
complete. Saves that keep failing restart the job (exit 138), which resumes from the last good
one once the server takes writes again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trainer.conftest import Result, common_args, follow_pods, kubeflow_env
from tests.trainer.s3 import Outage
from trainer.checkpoint.manager import read_path
from trainer.contract import CHECKPOINT, CHECKPOINT_FAILED, EXIT_RESTART

SLOW_DOWN = "SlowDown: Please reduce your request rate."


def _job(tmp_path: Path, outage: Outage, url: str, on_event, **overrides) -> list[Result]:
    """A 2-pod job (one rank each) checkpointing to ``url`` through ``outage``, paced at 0.05 s a
    step; ``on_event`` sees every event of rank 0 as it comes."""
    master = kubeflow_env(nproc_per_node=1, world_size=2, rank=0)
    envs = [{**e, **outage.env} for e in (master, {**master, "RANK": "1", "PET_NODE_RANK": "1"})]
    args = common_args(tmp_path, max_steps=24, log_every=2, **{
        "checkpoint.dir": url, "checkpoint.every_steps": 2, "checkpoint.max_attempts": 2,
        **overrides,
    })  # fmt: skip
    args.append("task_args=" + json.dumps({"sleep_s": 0.05}))
    return follow_pods(envs, args, lambda event, _: on_event(event))


def _complete_checkpoints(moto, bucket: str, prefix: str) -> list[int]:
    """The steps saved under ``prefix``, each checked complete (its manifest and its state,
    whose size and CRC match it); nothing else is there but the ledger's record."""
    keys = [k for k in moto.keys(bucket) if k.startswith(prefix + "step_")]
    steps = sorted({k[len(prefix) :].split("/")[0] for k in keys})
    for step in steps:
        assert {f"{prefix}{step}/manifest.json", f"{prefix}{step}/state.pt"} == {
            k for k in keys if k.startswith(f"{prefix}{step}/")
        }, keys
        assert read_path(f"s3://{bucket}/{prefix}{step}")["step"] == int(step[len("step_") :])
    assert moto.open_uploads(bucket) == []
    return [int(s[len("step_") :]) for s in steps]


@pytest.mark.slow
def test_a_storage_outage_costs_retries_not_the_job(tmp_path: Path, moto, s3) -> None:
    """The server refuses writes from the first checkpoint on, until two saves have failed."""
    url, bucket = f"{s3}/jobs/a", s3[len("s3://") :]
    failed: list[dict] = []
    with Outage(moto) as outage:

        def on_event(event: dict) -> None:
            if event["event"] == CHECKPOINT and event["step"] == 2:
                outage.refusing.set()
            if event["event"] == CHECKPOINT_FAILED:
                failed.append(event)
                if len(failed) == 2:
                    outage.refusing.clear()

        r0, r1 = _job(tmp_path, outage, url, on_event, **{"checkpoint.max_failed_saves": 4})
    assert [r0.rc, r1.rc] == [0, 0], r0.stderr[-3000:]
    assert outage.refused >= 4  # each failed save was tried twice (max_attempts) at least
    assert 2 <= len(failed) <= 3, failed  # a third may have been under way when writes resumed
    for i, event in enumerate(failed, 1):
        assert event["failed_in_row"] == i and event["limit"] == 4
        step_url = f"{url}/step_{event['step']:08d}"
        assert event["path"] == step_url
        assert event["error"].startswith(f"{step_url}/") and event["error"].endswith(SLOW_DOWN)
    first = failed[0]
    assert f"checkpoint: cannot write step {first['step']} ({first['error']}); 1 in a row" in (
        r0.stderr
    )
    saved = [e["step"] for e in r0.of(CHECKPOINT)]
    assert saved[0] == 2 and saved[-1] == 24 and not {e["step"] for e in failed} & set(saved)
    assert r0.of("done")[0]["reason"] == "completed"
    # What is in the bucket is complete, and is what was said saved (keep: the newest 3).
    assert _complete_checkpoints(moto, bucket, "jobs/a/") == saved[-3:]


@pytest.mark.slow
def test_saves_failing_in_a_row_restart_the_job_from_the_last_good_one(
    tmp_path: Path, moto, s3
) -> None:
    url, bucket = f"{s3}/jobs/b", s3[len("s3://") :]
    with Outage(moto) as outage:

        def on_event(event: dict) -> None:
            if event["event"] == CHECKPOINT and event["step"] == 2:
                outage.refusing.set()

        r0, r1 = _job(tmp_path, outage, url, on_event, **{"checkpoint.max_failed_saves": 2})
        assert [r0.rc, r1.rc] == [EXIT_RESTART, EXIT_RESTART], r0.stderr[-3000:]
        # The second failure restarts the job; a save under way then is waited for (and fails).
        failed = r0.of(CHECKPOINT_FAILED)
        assert [e["failed_in_row"] for e in failed] == list(range(1, len(failed) + 1))
        assert 2 <= len(failed) <= 3, failed
        (done,) = r0.of("done")
        assert r0.events.index(done) > r0.events.index(failed[-1])
        last = failed[1]["step"]
        assert done["reason"] == "restart" and done["cause"] == (
            f"checkpoint: 2 saves in a row failed, the last of step {last}: {failed[1]['error']}"
        )
        assert failed[1]["error"].startswith(f"{url}/step_{last:08d}/")
        assert f"[rank 0] {done['cause']} (restarting the job); exiting 138" in r0.stderr
        assert _complete_checkpoints(moto, bucket, "jobs/b/") == [2]

        outage.refusing.clear()
        again = _job(tmp_path, outage, url, lambda event: None)
    assert [r.rc for r in again] == [0, 0], again[0].stderr[-3000:]
    (note,) = again[0].of("resume")
    assert note["step"] == 2 and note["path"] == f"{url}/step_00000002"
    assert again[0].of("train")[0]["step"] == 4 and again[0].of("train")[-1]["step"] == 24
    assert _complete_checkpoints(moto, bucket, "jobs/b/") == [20, 22, 24]
