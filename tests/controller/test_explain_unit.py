"""Reading jobs, pods and events (API dicts, as kubectl -o json prints them) without a cluster:
why a job failed, why a pod waits (more: test_why_unit.py), what the replica table and progress
say."""

from __future__ import annotations

from typing import Any

from controller.jobs.read.explain import (
    explain_failure,
    job_condition,
    job_terminal,
    replica_rows,
)
from controller.jobs.read.trainer_events import latest_progress
from controller.jobs.read.why import pending_reason


def pod(
    rtype: str,
    index: int,
    *,
    phase: str = "Running",
    terminated: dict[str, Any] | None = None,
    last: dict[str, Any] | None = None,
    restarts: int = 0,
    reason: str | None = None,
    conditions: list[dict[str, Any]] | None = None,
    waiting: dict[str, Any] | None = None,
) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    if terminated:
        state = {"terminated": terminated}
    if waiting:
        state = {"waiting": waiting}
    status: dict[str, Any] = {
        "phase": phase,
        "containerStatuses": [
            {
                "name": "pytorch",
                "state": state,
                "lastState": {"terminated": last} if last else {},
                "restartCount": restarts,
            }
        ],
        "conditions": conditions or [],
    }
    if reason:
        status["reason"] = reason
    return {
        "metadata": {
            "name": f"job-{rtype}-{index}",
            "uid": f"uid-{rtype}-{index}",
            "labels": {
                "training.kubeflow.org/replica-type": rtype,
                "training.kubeflow.org/replica-index": str(index),
            },
        },
        "spec": {"nodeName": "kwok-node-0"},
        "status": status,
    }


FAILED_JOB = {
    "metadata": {"name": "job"},
    "status": {
        "conditions": [
            {"type": "Created", "status": "True"},
            {"type": "Running", "status": "False"},
            {
                "type": "Failed",
                "status": "True",
                "message": "PyTorchJob default/job is failed because 1 Worker replica(s) failed.",
            },
        ]
    },
}


def test_first_failure_wins_over_ranks_that_died_after_it():
    master = pod(
        "master",
        0,
        phase="Failed",
        terminated={"exitCode": 1, "reason": "Error", "finishedAt": "2026-01-01T00:01:09Z"},
    )
    worker = pod(
        "worker",
        0,
        phase="Failed",
        terminated={"exitCode": 1, "reason": "Error", "finishedAt": "2026-01-01T00:01:05Z"},
    )
    f = explain_failure(FAILED_JOB, [master, worker])
    assert (f.replica, f.pod, f.exit_code, f.reason) == ("worker-0", "job-worker-0", 1, "Error")
    f.last_lines = ["Traceback (most recent call last):", "ValueError: boom"]
    text = f.render("default/job")
    assert "replica worker-0 (pod job-worker-0) exit code 1 (Error" in text
    assert "  | ValueError: boom" in text


def test_oom_killed_is_named():
    w = pod("worker", 1, phase="Failed", terminated={"exitCode": 137, "reason": "OOMKilled"})
    w["spec"]["containers"] = [{"name": "pytorch", "resources": {"limits": {"memory": "1Gi"}}}]
    f = explain_failure(FAILED_JOB, [pod("master", 0), w])
    assert (f.replica, f.exit_code, f.reason) == ("worker-1", 137, "OOMKilled")
    text = f.render("default/job")
    assert "SIGKILL" in text
    assert "exit code 137 (OOMKilled: the container went over its memory limit (1Gi)" in text
    assert "raise resources.memory" in text


def test_oom_killed_with_another_exit_code_says_a_process_was_killed_not_what_the_code_means():
    """cgroup v1 kills the largest process: a torchrun worker, and torchrun exits 1. The job
    then sees exit 1 with reason OOMKilled; "the program raised" would send the user astray."""
    w = pod("master", 0, phase="Failed", terminated={"exitCode": 1, "reason": "OOMKilled"})
    w["spec"]["containers"] = [{"name": "pytorch", "resources": {"limits": {"memory": "2Gi"}}}]
    f = explain_failure(FAILED_JOB, [w])
    text = f.render("default/job")
    assert "exit code 1 (OOMKilled: the container went over its memory limit (2Gi)" in text
    assert "a torchrun worker" in text and "the main process exited 1" in text
    assert "the program raised" not in text
    (row,) = replica_rows([w])
    assert row.reason == "OOMKilled" and row.meaning.startswith("the container went over")
    assert replica_rows([pod("master", 0)])[0].meaning == ""


def test_evicted_pod_is_named():
    p = pod("master", 0, phase="Failed", reason="Evicted")
    p["status"]["containerStatuses"] = []
    p["status"]["message"] = "The node was low on resource: memory."
    f = explain_failure(FAILED_JOB, [p])
    assert (f.replica, f.reason) == ("master-0", "Evicted")
    assert "low on resource" in f.render("default/job")


def test_failure_from_a_restarted_container_reads_the_previous_log():
    p = pod("master", 0, restarts=1, last={"exitCode": 2, "reason": "Error"})
    f = explain_failure(FAILED_JOB, [p])
    assert f.exit_code == 2 and f.previous


def test_no_pods_left_falls_back_to_the_condition():
    f = explain_failure(FAILED_JOB, [])
    assert f.pod is None and "1 Worker replica(s) failed" in f.render("default/job")


def test_conditions():
    assert job_condition(FAILED_JOB) == "Failed"
    assert job_terminal(FAILED_JOB) == "Failed"
    assert job_condition({"status": {}}) == "Pending"
    assert job_terminal({"status": {"conditions": [{"type": "Running", "status": "True"}]}}) is None


def test_pending_reason_from_the_scheduler():
    p = pod(
        "master",
        0,
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
            }
        ],
    )
    p["status"]["containerStatuses"] = []
    assert pending_reason(p, []) == (
        "Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    )


def test_pending_reason_from_a_waiting_container():
    p = pod(
        "worker",
        0,
        phase="Pending",
        waiting={"reason": "ImagePullBackOff", "message": "Back-off pulling image x"},
    )
    p["status"]["containerStatuses"][0]["image"] = "x"
    assert pending_reason(p, []) == (
        'ImagePullBackOff: image "x" cannot be pulled: Back-off pulling image x'
    )


def test_pending_reason_from_events_of_the_job():
    events = [
        {
            "type": "Normal",
            "reason": "SuccessfulCreate",
            "involvedObject": {"name": "job"},
            "lastTimestamp": "2026-01-01T00:00:01Z",
        },
        {
            "type": "Warning",
            "reason": "FailedCreatePod",
            "message": "pods is forbidden",
            "involvedObject": {"name": "job"},
            "lastTimestamp": "2026-01-01T00:00:02Z",
        },
    ]
    assert pending_reason(None, events) == "FailedCreatePod: pods is forbidden"


def test_replica_rows_sorted_by_rank_with_last_exit():
    rows = replica_rows(
        [
            pod("worker", 0, restarts=1, last={"exitCode": 137, "reason": "Error"}),
            pod("master", 0),
        ]
    )
    assert [r.replica for r in rows] == ["master-0", "worker-0"]
    assert (rows[1].restarts, rows[1].exit_code, rows[1].reason) == (1, 137, "Error")


def test_progress_and_eta_from_the_latest_train_event():
    lines = [
        "starting",
        '{"event": "train", "step": 10, "max_steps": 100, "loss": 2.5, "step_time_s": 0.5}',
        "some human line",
        '{"event": "train", "step": 20, "max_steps": 100, "loss": 2.1, "samples_per_s": 64.0,'
        ' "step_time_s": 0.25}',
        '{"event": "checkpoint", "step": 20, "path": "/ckpt/20"}',
    ]
    p = latest_progress(lines)
    assert p is not None
    assert (p["step"], p["loss"], p["eta_s"]) == (20, 2.1, 20.0)
    assert latest_progress(["no events here"]) is None


def test_ties_prefer_a_plain_exit_code_then_the_lower_rank():
    t = "2026-01-01T00:01:05Z"
    killed = pod(
        "master",
        0,
        phase="Failed",
        terminated={"exitCode": 143, "reason": "Error", "finishedAt": t},
    )
    raised = pod(
        "worker", 0, phase="Failed", terminated={"exitCode": 1, "reason": "Error", "finishedAt": t}
    )
    assert explain_failure(FAILED_JOB, [killed, raised]).replica == "worker-0"
    also = pod(
        "master", 0, phase="Failed", terminated={"exitCode": 1, "reason": "Error", "finishedAt": t}
    )
    assert explain_failure(FAILED_JOB, [raised, also]).replica == "master-0"


def test_a_rank_that_only_lost_a_peer_comes_after_the_one_that_failed_even_if_earlier():
    """Pods restarted in place keep only their last run: rank 1's last 138 may carry an earlier
    time than rank 0's last raise. 138 says another rank died first, so rank 0 is named."""
    raised = pod(
        "master",
        0,
        phase="Failed",
        terminated={"exitCode": 1, "reason": "Error", "finishedAt": "2026-01-01T00:01:09Z"},
    )
    lost_peer = pod(
        "worker",
        0,
        phase="Failed",
        terminated={"exitCode": 138, "reason": "Error", "finishedAt": "2026-01-01T00:01:01Z"},
    )
    assert explain_failure(FAILED_JOB, [lost_peer, raised]).replica == "master-0"
    # With nothing but lost peers, the earliest is still named.
    other = pod(
        "master",
        0,
        phase="Failed",
        terminated={"exitCode": 138, "reason": "Error", "finishedAt": "2026-01-01T00:01:09Z"},
    )
    assert explain_failure(FAILED_JOB, [other, lost_peer]).replica == "worker-0"


TORCHRUN_TAIL = """\
{"event": "train", "step": 5}
Traceback (most recent call last):
  File "/opt/conda/lib/python3.11/site-packages/trainer/train.py", line 301, in run
    loss = task.step(batch)
RuntimeError: injected failure at call 6 on rank 0
E1122 17:06:37.000000 9 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1)
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/run.py", line 905, in <module>
    main()
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 277
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
trainer FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 1 (pid: 9)
============================================================
"""


def test_a_torchrun_failure_shows_the_workers_error_not_torchruns_summary():
    from controller.jobs.read.explain import log_excerpt

    got = log_excerpt(TORCHRUN_TAIL, 20)
    assert got[-2] == "RuntimeError: injected failure at call 6 on rank 0"
    assert "failed (exitcode: 1)" in got[-1]
    assert not any("ChildFailedError" in line or "Root Cause" in line for line in got)
    assert log_excerpt(TORCHRUN_TAIL, 3)[0] == "    loss = task.step(batch)"
    plain = "a\nb\nTraceback (most recent call last):\nValueError: boom\n"
    assert log_excerpt(plain, 2) == ["Traceback (most recent call last):", "ValueError: boom"]


def test_an_earlier_run_that_raised_is_named_over_later_runs_of_pods_restarted_in_place():
    """A TrainJob's pods restart in place: rank 0 raised in its first run (and every run after),
    rank 1's torchrun later lost its rendezvous (exit 1, earlier than rank 0's *last* run). The
    history kept rank 0's first failed run: that is the one named, with the lines read then."""
    from controller.jobs.watches import PodHistory

    def t(s: int) -> str:
        return f"2026-01-01T00:01:{s:02d}Z"

    first = pod(
        "master", 0, restarts=1, last={"exitCode": 1, "reason": "Error", "finishedAt": t(1)}
    )
    peer_lost = pod("worker", 0, restarts=1, last={"exitCode": 138, "finishedAt": t(2)})
    final_rank0 = pod(
        "master", 0, phase="Failed", restarts=3, last={"exitCode": 1, "finishedAt": t(9)}
    )
    final_rank1 = pod(
        "worker", 0, phase="Failed", restarts=3, last={"exitCode": 1, "finishedAt": t(5)}
    )
    history = PodHistory()
    history.failed += [first, peer_lost]
    assert history.earlier_errors() == [first]  # a lost peer is no error of its own
    assert explain_failure(FAILED_JOB, [final_rank0, final_rank1]).replica == "worker-0"
    f = explain_failure(FAILED_JOB, [final_rank0, final_rank1, *history.earlier_errors()])
    assert (f.replica, f.exit_code, f.run) == ("master-0", 1, (first["metadata"]["uid"], 0))


def _two_runs(rtype: str, current: tuple[int, int], before: tuple[int, int]) -> dict[str, Any]:
    """Replica ``rtype``-0's pod whose container ended twice: (exit code, second it finished)
    of its current run and of the one before."""

    def ended(code: int, second: int) -> dict[str, Any]:
        return {
            "exitCode": code,
            "reason": "Error",
            "finishedAt": f"2026-01-01T00:01:{second:02d}Z",
        }

    return pod(
        rtype, 0, phase="Failed", restarts=1, terminated=ended(*current), last=ended(*before)
    )


def test_a_raise_before_the_give_ups_sigterm_is_named_with_the_log_of_that_run():
    """A TrainJob's Job gives up (backoffLimit) while it has just restarted rank 0's container
    in place: that run ends 143 by the give-up's SIGTERM, and the pod shows the exit 1 before it
    only as its last state. The exit 1 is named, with the log of the run that raised (the
    container's previous), kept by the watch when it first saw the pod so."""
    from controller.jobs.watches import PodHistory

    rank0 = _two_runs("master", current=(143, 9), before=(1, 3))
    rank1 = _two_runs("worker", current=(138, 8), before=(138, 4))
    f = explain_failure(FAILED_JOB, [rank1, rank0])
    assert (f.replica, f.exit_code, f.previous) == ("master-0", 1, True)
    assert f.run == (rank0["metadata"]["uid"], 0)
    assert "exit code 1 (Error, the program raised or exited 1)" in f.render("default/job")

    history = PodHistory()
    run = history.record(rank0)
    assert run is not None and (run.key, run.previous) == ((rank0["metadata"]["uid"], 0), True)
    assert history.earlier_errors() == [rank0]
    assert history.record(rank0) is None  # seen: nothing new

    # A retried SIGTERM before a raise is no cause: the raise, the current run, is named.
    preempted_then_raised = _two_runs("master", current=(1, 9), before=(143, 3))
    f = explain_failure(FAILED_JOB, [preempted_then_raised])
    assert (f.exit_code, f.previous, f.run) == (1, False, ("uid-master-0", 1))


def test_a_failed_init_container_is_the_failure_and_its_log_is_the_one_to_read():
    """A workdir whose archive does not match: the init container exits 2 and the trainer
    never starts (PodInitializing); the failure names the init container, so the caller
    reads its log."""
    failed = pod("master", 0, phase="Failed", waiting={"reason": "PodInitializing"})
    failed["status"]["initContainerStatuses"] = [
        {
            "name": "workdir",
            "state": {
                "terminated": {
                    "exitCode": 2,
                    "reason": "Error",
                    "finishedAt": "2026-01-01T00:00:03Z",
                }
            },
            "restartCount": 0,
        }
    ]
    f = explain_failure(FAILED_JOB, [failed, pod("worker", 0)])
    assert (f.pod, f.init_container, f.exit_code, f.run) == ("job-master-0", "workdir", 2, None)
    f.last_lines = ["workdir: the archive's digest is sha256:aa, the job names sha256:bb"]
    assert f.render("default/job").splitlines() == [
        "job default/job Failed: replica master-0 (pod job-master-0) init container workdir "
        "exit code 2 (Error, bad command-line or config)",
        "last 1 log lines of master-0's workdir:",
        "  | workdir: the archive's digest is sha256:aa, the job names sha256:bb",
    ]
