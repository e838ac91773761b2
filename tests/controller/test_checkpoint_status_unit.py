"""``status`` shows the job's last checkpoint (step, where, age): read from rank 0's log with the
kubelet's timestamps (controller/jobs/read/checkpoints.py), in ``-o json`` and in one line."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from controller.errors import NotFound
from controller.jobs.read.checkpoints import format_checkpoint, last_checkpoint
from controller.jobs.status import CHECKPOINT_LINES, TAIL_LINES, job_status
from controller.kubeflow import LABEL_JOB_NAME, LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE
from trainer.contract import format_event

NOW = datetime(2026, 11, 27, 10, 0, 0, tzinfo=timezone.utc)
URL = "s3://ddpjob/run/step_{:08d}"


def stamped(seconds: int, line: str, nanos: int = 0, now: datetime = NOW) -> str:
    """``line`` as the API server sends it with ``timestamps=true``, ``seconds`` before now."""
    at = datetime.fromtimestamp(now.timestamp() - seconds, timezone.utc)
    return f"{at.strftime('%Y-%m-%dT%H:%M:%S')}.{nanos:09d}Z {line}"


def saved(step: int, **fields: Any) -> str:
    return format_event("checkpoint", step=step, path=URL.format(step), bytes=3 << 30,
                        stall_s=0.2, write_s=41.5, **fields)  # fmt: skip


def train(step: int) -> str:
    return format_event("train", step=step, max_steps=1000, loss=0.5, steps_per_s=2.0)


def ledger() -> str:
    """The goodput event the trainer prints with every log window (status's goodput reads it
    from the same tail, so no other read)."""
    return format_event("goodput", at=NOW.timestamp(), runs=[])


def test_the_newest_checkpoint_event_with_the_time_its_line_was_logged():
    lines = [
        stamped(300, "plain text"),
        stamped(200, saved(100)),
        stamped(120, train(150)),
        stamped(61, saved(200), nanos=500_000_000),
        stamped(10, train(250)),
    ]
    found = last_checkpoint(lines, NOW)
    assert found == {
        "step": 200,
        "path": URL.format(200),
        "at": stamped(61, "", nanos=500_000_000).split()[0].replace(".500000000Z", ".500000Z"),
        "age_s": 60.5,
        "resumed": False,
        "bytes": 3 << 30,
        "write_s": 41.5,
        "stall_s": 0.2,
    }
    assert format_checkpoint(found, NOW) == (
        f"step 200 at {URL.format(200)}, 1m0s ago (3.0 GiB, written in 41.5 s)"
    )


def test_a_run_that_wrote_none_yet_shows_the_checkpoint_it_resumed_from():
    resume = format_event("resume", step=200, path=URL.format(200), skipped=[])
    found = last_checkpoint([stamped(30, resume), stamped(5, train(210))], NOW)
    assert (found["step"], found["path"], found["resumed"]) == (200, URL.format(200), True)
    assert found["at"] is None and found["age_s"] is None and found["bytes"] is None
    assert format_checkpoint(found) == (
        f"step 200 at {URL.format(200)}, loaded at resume (none written since)"
    )
    # A checkpoint written after the resume is the newer one.
    assert last_checkpoint([stamped(30, resume), stamped(5, saved(300))], NOW)["step"] == 300


def test_no_checkpoint_no_line():
    fresh = format_event("resume", step=0, path=None, skipped=["s3://b/x: unreadable"])
    assert last_checkpoint([stamped(5, train(10)), stamped(4, fresh)], NOW) is None
    assert last_checkpoint([], NOW) is None


def test_a_line_without_a_timestamp_has_no_age():
    found = last_checkpoint([saved(100)], NOW)
    assert found["step"] == 100 and found["at"] is None and found["age_s"] is None
    assert format_checkpoint(found) == f"step 100 at {URL.format(100)} (3.0 GiB, written in 41.5 s)"


# ---------------------------------------------------------------------------------------------
# status, against a cluster's answers


class FakeCluster:
    """A running 1-pod PyTorchJob ``j`` whose master logged ``log`` (lines with timestamps)."""

    server = "https://x"

    def __init__(self, log: list[str], elastic: bool = False):
        self.log = log
        self.elastic = elastic  # Workers only: the rendezvous places rank 0
        self.reads: list[int | None] = []

    def get_job(self, name, namespace, api=None):
        if api.plural != "pytorchjobs":
            raise NotFound(f"x: {api.kind} {namespace}/{name} not found", reason="NotFound")
        return {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {
                "name": "j",
                "namespace": "ml",
                "creationTimestamp": "2026-11-27T09:00:00Z",
            },
            "spec": {"pytorchReplicaSpecs": {self.replica.capitalize(): {"replicas": 1}}},
            "status": {"conditions": [{"type": "Running", "status": "True"}]},
        }

    @property
    def replica(self) -> str:
        return "worker" if self.elastic else "master"

    def list_pods(self, namespace, selector):
        labels = {LABEL_JOB_NAME: "j", LABEL_REPLICA_TYPE: self.replica, LABEL_REPLICA_INDEX: "0"}
        running = {"name": "pytorch", "state": {"running": {}}, "restartCount": 0, "ready": True}
        return [
            {
                "metadata": {
                    "name": f"j-{self.replica}-0",
                    "namespace": "ml",
                    "uid": "u0",
                    "labels": labels,
                },
                "spec": {"nodeName": "n"},
                "status": {"phase": "Running", "containerStatuses": [running]},
            }
        ]

    def list_events(self, namespace, field_selector=None):
        return []

    def read_log(self, pod, namespace, *, container, tail_lines=None, timestamps=False, **_):
        assert (pod, container, timestamps) == (f"j-{self.replica}-0", "pytorch", True)
        self.reads.append(tail_lines)
        lines = self.log[-tail_lines:] if tail_lines else self.log
        return "\n".join(lines) + "\n"


def test_status_shows_the_last_checkpoint_in_json_and_in_one_line(monkeypatch, capsys):
    from controller.cli import cluster as cli_cluster
    from controller.cli.main import main

    now = datetime.now(timezone.utc)  # status's clock
    fake = FakeCluster(
        [stamped(90, saved(100), now=now), stamped(20, train(120), now=now), stamped(20, ledger())]
    )
    st = job_status(fake, "j", "ml", "pytorchjob")
    assert st["progress"]["step"] == 120  # the same read feeds the progress
    assert (st["checkpoint"]["step"], st["checkpoint"]["path"]) == (100, URL.format(100))
    assert 90 <= st["checkpoint"]["age_s"] < 3600
    assert fake.reads == [TAIL_LINES]

    monkeypatch.setattr(cli_cluster, "cluster_of", lambda args: fake)
    assert main(["status", "j", "-n", "ml"]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("checkpoint: ")]
    assert line.startswith(f"checkpoint: step 100 at {URL.format(100)}, 1m")
    assert line.endswith(" ago (3.0 GiB, written in 41.5 s)")


def test_status_reads_further_back_for_a_checkpoint_its_tail_lacks():
    """A run that logs every step and checkpoints every 1000: its last checkpoint is older
    than the tail read for the progress."""
    log = [stamped(2000, saved(1000))]
    log += [stamped(1000 - i, train(1000 + i)) for i in range(TAIL_LINES)]
    fake = FakeCluster([*log, stamped(600, ledger())])
    st = job_status(fake, "j", "ml", "pytorchjob")
    assert st["checkpoint"]["step"] == 1000
    assert fake.reads == [TAIL_LINES, CHECKPOINT_LINES]
    # A short log that has none is read once: there is nothing further back.
    fake = FakeCluster([stamped(5, train(10)), stamped(5, ledger())])
    assert job_status(fake, "j", "ml", "pytorchjob")["checkpoint"] is None
    assert fake.reads == [TAIL_LINES]


def test_an_elastic_jobs_checkpoint_keeps_the_time_of_its_line():
    """In an elastic job the tail that found rank 0 (by its newest event) is the one read."""
    now = datetime.now(timezone.utc)
    log = [
        stamped(90, saved(100), now=now),
        stamped(20, train(120), now=now),
        stamped(20, ledger()),
    ]
    fake = FakeCluster(log, elastic=True)
    st = job_status(fake, "j", "ml", "pytorchjob")
    assert st["rank0_pod"] == "j-worker-0" and st["progress"]["step"] == 120
    assert st["checkpoint"]["step"] == 100 and 90 <= st["checkpoint"]["age_s"] < 3600
    assert fake.reads == [TAIL_LINES]


# ---------------------------------------------------------------------------------------------
# status names the MLflow run


RUN_URL = "http://mlflow.ddpjob-system.svc:5000/#/experiments/1/runs/abc"


def tracking() -> str:
    return format_event(
        "tracking", tracker="mlflow", run_id="abc", experiment_id="1", url=RUN_URL, resumed=False
    )


class TrackedCluster(FakeCluster):
    """The same job, its pod told where to track (``MLFLOW_TRACKING_URI`` in its env)."""

    def list_pods(self, namespace, selector):
        pods = super().list_pods(namespace, selector)
        env = [{"name": "MLFLOW_TRACKING_URI", "value": "http://mlflow.ddpjob-system.svc:5000"}]
        pods[0]["spec"]["containers"] = [{"name": "pytorch", "env": env}]
        return pods


def test_status_names_the_mlflow_run(monkeypatch, capsys):
    from controller.cli import cluster as cli_cluster
    from controller.cli.main import main

    fake = FakeCluster([stamped(30, tracking()), stamped(20, train(120)), stamped(20, ledger())])
    st = job_status(fake, "j", "ml", "pytorchjob")
    assert st["tracking"]["url"] == RUN_URL and st["tracking"]["run_id"] == "abc"
    monkeypatch.setattr(cli_cluster, "cluster_of", lambda args: fake)
    assert main(["status", "j", "-n", "ml"]) == 0
    assert f"mlflow run: {RUN_URL}" in capsys.readouterr().out.splitlines()

    # Printed once, long before the tail: read further back, for a job that tracks only.
    log = [stamped(2000, tracking())]
    log += [stamped(1000 - i, train(10 + i)) for i in range(TAIL_LINES)]
    fake = TrackedCluster([*log, stamped(500, ledger())])
    assert job_status(fake, "j", "ml", "pytorchjob")["tracking"]["url"] == RUN_URL
    # The tail; further back once, for the checkpoint it lacks and the run alike.
    assert fake.reads == [TAIL_LINES, CHECKPOINT_LINES]
    untracked = FakeCluster([*log[1:], stamped(500, ledger())])
    assert job_status(untracked, "j", "ml", "pytorchjob")["tracking"] is None
    assert untracked.reads == [TAIL_LINES, CHECKPOINT_LINES]  # the checkpoint's read only
