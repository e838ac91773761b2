"""A checkpoint location on S3 that the trainer cannot use stops the job at start, before its
first step: a missing bucket or a wrong secret key is one line naming the URL and the server's
answer, exit 2 (not retried), and `wait` says so. The server is the local cluster's S3 server;
the pods run on the real node. A job that checkpoints there and survives a deleted pod:
test_recovery.py (PyTorchJob) and test_trainjob.py (TrainJob)."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.e2e.helpers import (
    Background,
    events,
    s3_checkpoints,
    s3_url,
    write_spec,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BUCKET = "no-such-bucket"
# name: (how the location is wrong, the server's answer)
CASES = {
    "s3-nobucket": ("bucket", "NoSuchBucket"),
    "s3-badkey": ("secret key", "SignatureDoesNotMatch"),
}


def _spec(cluster, tmp_path, namespace: str, name: str, wrong: str):
    fields = s3_checkpoints(
        cluster, namespace, name, {}, secret_key="0" * 40 if wrong == "secret key" else None
    )
    if wrong == "bucket":
        fields["trainer"]["checkpoint"]["dir"] = f"s3://{BUCKET}/{namespace}/{name}"
    fields["volumes"] = []  # nothing but S3
    return write_spec(cluster, tmp_path, name, namespace, nodes=1, max_steps=400, **fields)


def _seconds_run(pod: dict) -> float:
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    started, finished = (
        datetime.fromisoformat(state[k].replace("Z", "+00:00")) for k in ("startedAt", "finishedAt")
    )
    return (finished - started).total_seconds()


def test_a_missing_bucket_or_a_wrong_secret_key_exits_2_at_start_and_wait_says_why(
    real_node, namespace, tmp_path
):
    cluster = real_node
    specs = {
        name: _spec(cluster, tmp_path, namespace, name, wrong) for name, (wrong, _) in CASES.items()
    }
    runs = {
        name: Background(cluster, tmp_path, name, "submit", str(spec), "--wait")
        for name, spec in specs.items()
    }
    try:
        results = {name: run.result(timeout=300) for name, run in runs.items()}
    finally:
        for run in runs.values():
            run.stop()
    for name, (wrong, answer) in CASES.items():
        code, out, err = results[name]
        assert code == 1, out + err
        where = (
            f"s3://{BUCKET}/{namespace}/{name}" if wrong == "bucket" else s3_url(namespace, name)
        )
        line = f"checkpoint.dir: cannot write, read and delete in {where} ({answer}"
        # wait's report: the Master's exit 2, what it means, and the trainer's own line.
        assert f"error: job {namespace}/{name} Failed: replica master-0" in err, err
        assert "exit code 2" in err and "bad command-line or config" in err, err
        assert line in err, err
        pod = cluster.get_json("pod", f"{name}-master-0", "-n", namespace)
        log = cluster.kubectl("logs", f"{name}-master-0", "-n", namespace, "-c", "pytorch").stdout
        # One line, before any step, and the container ran once (exit 2 is not retried).
        assert [x for x in log.splitlines() if x.startswith(line)] != [], log[-3000:]
        assert "Traceback" not in log and events(log, "train") == [], log[-3000:]
        status = pod["status"]["containerStatuses"][0]
        assert status["state"]["terminated"]["exitCode"] == 2 and status["restartCount"] == 0
        print(f"{name}: the container ran {_seconds_run(pod):.1f} s")
