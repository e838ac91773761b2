"""``goodput``'s arithmetic on API dicts and the trainer's ledger, without a cluster: a job with no
restart, one preempted by Kueue and resumed (from Kueue's events, and from its Workload once
those expired), one restarted in place after an OOM kill and still running, and a TrainJob with
no GPUs. Each job is laid out on a timeline of its own (seconds after ``T0``); each part is
checked against what that timeline says, worked out here by hand, not by the code's sweep."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from controller.jobs.read import goodput as gp
from controller.jobs.read.apis import PYTORCHJOB_KIND, TRAINJOB_KIND

T0 = 1_800_000_000.0  # the job's creation


def iso(t: float, whole: bool = True) -> str:
    """An API time ``t`` seconds after T0 (whole seconds, as conditions and pods have)."""
    when = datetime.fromtimestamp(T0 + t, timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ") if whole else when.isoformat().replace("+00:00", "Z")


def pytorchjob(*, done_at: float | None, gpus: int = 4, queue: bool = False) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "pytorch", "resources": {"limits": {}}}]}}
    if gpus:
        template["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    conditions = [{"type": "Created", "status": "True", "lastTransitionTime": iso(0)}]
    if done_at is not None:
        conditions.append(
            {"type": "Succeeded", "status": "True", "lastTransitionTime": iso(done_at)}
        )
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "job",
            "namespace": "ml",
            "uid": "job-uid",
            "creationTimestamp": iso(0),
            "labels": {"kueue.x-k8s.io/queue-name": "user-queue"} if queue else {},
        },
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template},
                "Worker": {"replicas": 1, "template": template},
            }
        },
        "status": {"conditions": conditions},
    }


def master_pod(
    created: float, *, scheduled: float, running: float | None = None, **container: Any
) -> dict[str, Any]:
    status: dict[str, Any] = {"name": "pytorch", **container}
    if running is not None:
        status["state"] = {"running": {"startedAt": iso(running)}}
    return {
        "metadata": {
            "name": "job-master-0",
            "uid": f"pod-{created}",
            "creationTimestamp": iso(created),
            "labels": {
                "training.kubeflow.org/job-name": "job",
                "training.kubeflow.org/replica-type": "master",
                "training.kubeflow.org/replica-index": "0",
            },
        },
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": iso(scheduled)}
            ],
            "containerStatuses": [status],
        },
    }


def run(
    launched: float, first: float | None, ended: float, *, lost_steps: int = 0, **parts: float
) -> dict[str, Any]:
    """A run as the trainer's ``goodput`` event prints it (times after T0)."""
    view = {
        "id": f"r{launched}",
        "launched_at": T0 + launched,
        "first_step_at": None if first is None else T0 + first,
        "ended_at": T0 + ended,
        "lost_steps": lost_steps,
        "startup_s": (first if first is not None else ended) - launched,
        **dict.fromkeys(("productive_s", "stall_s", "eval_s", "lost_s", "other_s"), 0.0),
        **parts,
    }
    in_run = sum(view[k] for k in ("productive_s", "stall_s", "eval_s", "lost_s", "other_s"))
    assert first is None or in_run == pytest.approx(ended - first)  # as the ledger writes them
    return view


def kueue_event(reason: str, at: float, *, again: float | None = None, message: str = ""):
    """Kueue's event on the job (events.k8s.io, as the core API lists it)."""
    event = {
        "reason": reason,
        "message": message or ("Admitted by clusterQueue cq" if reason == "Started" else ""),
        "involvedObject": {"kind": "PyTorchJob", "name": "job", "uid": "job-uid"},
        "eventTime": iso(at, whole=False),
        "reportingComponent": "kubeflow.org/pytorchjob-kueue-controller",
    }
    if again is not None:
        event["series"] = {"count": 2, "lastObservedTime": iso(again, whole=False)}
    return event


def parts_of(g: dict[str, Any]) -> dict[str, float]:
    return {k: g[k] for k in gp.PARTS}


def adds_up(g: dict[str, Any]) -> None:
    assert sum(parts_of(g).values()) == pytest.approx(g["wall_s"], abs=0.01)


# ---------------------------------------------------------------------------------------------


def test_a_job_with_no_restart():
    # Created at 0; pod made at 1, scheduled at 2, its container started at 3; 10 s of
    # start-up; 60 s after the first step: 50 of steps, 6 of checkpoint stalls, 4 of
    # evaluation; the job Succeeded at 76, 3 s after the trainer's last word.
    job = pytorchjob(done_at=76, gpus=4)
    pod = master_pod(1, scheduled=2, running=None)
    ledger = {"runs": [run(3, 13, 73, productive_s=50, stall_s=6, eval_s=4, end="completed")]}
    g = gp.account(
        PYTORCHJOB_KIND, job, [pod], ledger=ledger, events=[], workload=None,
        now=T0 + 1000, price_per_gpu_hour=2.0,
    )  # fmt: skip
    assert parts_of(g) == pytest.approx(
        {
            "queued_s": 0,
            "scheduling_s": 3,  # 0 -> 3: the pod made, scheduled, its image pulled
            "startup_s": 10,
            "productive_s": 50,
            "checkpoint_s": 6,
            "evaluation_s": 4,
            "lost_s": 0,
            "other_s": 3,  # 73 -> 76: the trainer's exit, the job marked Succeeded
        }
    )
    assert g["wall_s"] == 76 and not g["running"]
    adds_up(g)
    assert g["goodput_pct"] == pytest.approx(100 * 50 / 76, abs=0.001)
    # Two pods of 4 GPUs held from the pod's scheduling (at 2) to the end.
    assert g["gpus"] == 8
    assert g["gpu_hours_held"] == pytest.approx(8 * (76 - 2) / 3600, abs=1e-4)
    assert g["gpu_hours_useful"] == pytest.approx(8 * 50 / 3600, abs=1e-4)
    assert g["cost"] == pytest.approx(2.0 * 8 * (76 - 2) / 3600, abs=0.01)
    assert (g["runs"], g["lost_steps"]) == (1, 0)


def _preempted() -> tuple[dict, list[dict], dict]:
    """Kueue admits the job at 2 (its pod made at 3, run 1 launched at 4, first step at 10);
    evicts it at 40; run 1 stops at 41, having trained 5 steps past its last checkpoint
    (lost: 7 s of its 31 after the first step); readmits it at 99.6; pod B made at 100,
    scheduled at 101, run 2 launched at 102, first step at 110, done at 150; the job Succeeded
    at 152. (The API's times are whole seconds; Kueue's events and the trainer's are not.)"""
    job = pytorchjob(done_at=152, gpus=1, queue=True)
    pod_b = master_pod(100, scheduled=101)
    ledger = {
        "runs": [
            run(4, 10, 41, lost_steps=5, productive_s=22, stall_s=2, lost_s=7, end=None),
            run(102, 110, 150, productive_s=36, stall_s=3, eval_s=1, end="completed"),
        ]
    }
    return job, [pod_b], ledger


@pytest.mark.parametrize("stopped_again", [None, 40.24])  # a TrainJob's eviction, said twice
def test_a_job_preempted_by_kueue_and_resumed_from_kueues_events(stopped_again):
    job, pods, ledger = _preempted()
    events = [
        kueue_event("Started", 2, again=99.6),
        kueue_event(
            "Stopped", 40, again=stopped_again, message="Preempted to accommodate a workload"
        ),
    ]
    g = gp.account(
        PYTORCHJOB_KIND, job, pods, ledger=ledger, events=events, workload=None, now=T0 + 1000
    )
    assert parts_of(g) == pytest.approx(
        {
            # 0 -> 2, and 41 -> 99.6: from the eviction at 40, less the second run 1 still took.
            "queued_s": 2 + (99.6 - 41),
            "scheduling_s": (4 - 2) + (102 - 100),  # before run 1; pod B's creation to start
            "startup_s": (10 - 4) + (110 - 102),
            "productive_s": 22 + 36,
            "checkpoint_s": 2 + 3,
            "evaluation_s": 1,
            "lost_s": 7,
            "other_s": (100 - 99.6) + (152 - 150),  # the operator making pod B; the end
        }
    )
    adds_up(g)
    assert g["goodput_pct"] == pytest.approx(100 * 58 / 152, abs=0.001)
    assert (g["runs"], g["lost_steps"], g["sources"]["queue"]) == (2, 5, "kueue events")
    # Two pods of one GPU, held all but the queued time and pod B's wait to be scheduled
    # (100 -> 101).
    assert g["gpu_hours_held"] == pytest.approx(2 * (152 - (2 + 58.6) - 1) / 3600, abs=1e-4)


def test_once_kueues_events_expired_the_workload_tells_the_queued_total():
    # The same job; Kueue's events are gone. Its Workload: admitted (again) at 99 (whole
    # seconds), and before that admitted 38 s in all (2 -> 40): it waited 99 - 38 = 61 s in all.
    job, pods, ledger = _preempted()
    workload = {
        "status": {
            "conditions": [{"type": "Admitted", "status": "True", "lastTransitionTime": iso(99)}],
            "accumulatedPastExecutionTimeSeconds": 38,
        }
    }
    g = gp.account(
        PYTORCHJOB_KIND, job, pods, ledger=ledger, events=[], workload=workload, now=T0 + 1000
    )
    assert g["sources"]["queue"] == "workload status (total)"
    # The 61 s go where no run was, latest first: 41 -> 99 (58 s), then 3 s just before run 1
    # (1 -> 4).
    assert g["queued_s"] == pytest.approx(61)
    assert g["scheduling_s"] == pytest.approx((1 - 0) + (102 - 100))
    assert (g["productive_s"], g["lost_s"]) == pytest.approx((58, 7))
    adds_up(g)


def test_a_job_restarted_in_place_after_an_oom_kill_and_still_running():
    # No Kueue. Pod made at 1, run 1 launched at 3, first step at 8, last seen alive at 50
    # (then OOM-killed: its container ended at 51); the kubelet restarted the container at 61;
    # run 2 resumed 5 steps back, first step at 66, last reported at 95; now is 100.
    job = pytorchjob(done_at=None, gpus=8)
    pod = master_pod(
        1,
        scheduled=1,
        running=61,
        restartCount=1,
        lastState={
            "terminated": {
                "exitCode": 137,
                "reason": "OOMKilled",
                "startedAt": iso(3),
                "finishedAt": iso(51),
            }
        },
    )
    ledger = {
        "runs": [
            run(3, 8, 50, lost_steps=5, productive_s=30, stall_s=2, lost_s=10),
            run(61, 66, 95, productive_s=27, stall_s=2),
        ]
    }
    g = gp.account(
        PYTORCHJOB_KIND, job, [pod], ledger=ledger, events=[], workload=None, now=T0 + 100
    )
    assert g["running"] and g["wall_s"] == 100
    assert g["since_report_s"] == pytest.approx(5)  # 95 -> 100: run 2's steps, not yet told
    assert parts_of(g) == pytest.approx(
        {
            "queued_s": 0,
            "scheduling_s": 3,
            "startup_s": 5 + 5,
            "productive_s": 30 + 27 + 5,
            "checkpoint_s": 2 + 2,
            "evaluation_s": 0,
            "lost_s": 10,
            "other_s": 61 - 50,  # the kill, the kubelet's back-off, the restart
        }
    )
    adds_up(g)
    assert g["lost_steps"] == 5


def test_a_running_container_that_has_not_reported_yet_is_not_the_ledgers_last_run():
    # As above, but the container restarted at 80 and its run has printed nothing yet: the
    # ledger's last run ended at 50, and 50 -> 100 is not counted as steps.
    job = pytorchjob(done_at=None)
    pod = master_pod(1, scheduled=1, running=80)
    ledger = {"runs": [run(3, 8, 50, productive_s=42)]}
    g = gp.account(
        PYTORCHJOB_KIND, job, [pod], ledger=ledger, events=[], workload=None, now=T0 + 100
    )
    assert g["since_report_s"] == 0 and g["productive_s"] == pytest.approx(42)
    assert g["other_s"] == pytest.approx(50)
    adds_up(g)


def test_a_trainjob_without_gpus_is_told_in_replica_hours():
    # A 2-node TrainJob on CPUs in a Kueue queue: admitted at 5 (Kueue's Started event), its
    # node-0 pod made at 5.5, its run launched at 8, first step at 20, done at 80; Complete at 81.
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "tj",
            "namespace": "ml",
            "uid": "tj-uid",
            "creationTimestamp": iso(0),
            "labels": {"kueue.x-k8s.io/queue-name": "user-queue"},
        },
        "spec": {"trainer": {"numNodes": 2, "resourcesPerNode": {"limits": {"cpu": "1"}}}},
        "status": {
            "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": iso(81)}]
        },
    }
    pod = {
        "metadata": {
            "name": "tj-node-0-0-abcde",
            "creationTimestamp": iso(5.5),
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": "tj",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "batch.kubernetes.io/job-completion-index": "0",
            },
        },
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": iso(6)}
            ],
            "containerStatuses": [
                {"name": "node", "state": {"terminated": {"startedAt": iso(8), "exitCode": 0}}}
            ],
        },
    }
    started = kueue_event("Started", 5)
    started["involvedObject"] = {"kind": "TrainJob", "name": "tj", "uid": "tj-uid"}
    ledger = {"runs": [run(8, 20, 80, productive_s=55, stall_s=5, end="completed")]}
    g = gp.account(
        TRAINJOB_KIND, job, [pod], ledger=ledger, events=[started], workload=None, now=T0 + 500
    )
    assert parts_of(g) == pytest.approx(
        {
            "queued_s": 5,
            "scheduling_s": 8 - 5,
            "startup_s": 12,
            "productive_s": 55,
            "checkpoint_s": 5,
            "evaluation_s": 0,
            "lost_s": 0,
            "other_s": 1,
        }
    )
    adds_up(g)
    assert (g["gpus"], g["replicas"]) == (0, 2) and "gpu_hours_held" not in g
    # Held from the pod's scheduling (at 6, 1 s after the admission) to the end.
    assert g["replica_hours_held"] == pytest.approx(2 * (81 - 6) / 3600, abs=1e-4)
    assert g["replica_hours_useful"] == pytest.approx(2 * 55 / 3600, abs=1e-4)
    lines = gp.format_goodput("trainjob ml/tj", g)
    assert any(line.startswith("no GPUs (gpus: 0): replica-hours 0.042 held") for line in lines)
    priced = gp.account(
        TRAINJOB_KIND, job, [pod], ledger=ledger, events=[started], workload=None, now=T0 + 500,
        price_per_gpu_hour=2.5,
    )  # fmt: skip
    assert (priced["price_per_gpu_hour"], priced["cost"]) == (2.5, None)
    lines = gp.format_goodput("trainjob ml/tj", priced)
    assert "cost: none at 2.5 per GPU-hour (no GPUs held)" in lines


def test_a_job_whose_trainer_prints_no_ledger_is_all_scheduling_and_other():
    job = pytorchjob(done_at=50)
    pod = master_pod(1, scheduled=1, running=None)
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"startedAt": iso(4)}}
    g = gp.account(PYTORCHJOB_KIND, job, [pod], ledger=None, events=[], workload=None, now=T0)
    assert (g["scheduling_s"], g["other_s"], g["productive_s"]) == pytest.approx((4, 46, 0))
    assert g["sources"]["trainer"] is None
    assert any("no goodput event in rank 0's log" in line for line in gp.format_goodput("j", g))


def test_the_code_each_run_ran_is_named_once():
    """Runs of a shipped workdir carry its digest (the trainer's ledger, from the pod's env):
    goodput lists each code once, in the order the runs ran it."""
    code = {"digest": "sha256:" + "a" * 64, "commit": "b" * 40, "dirty": True}
    other = {"digest": "sha256:" + "c" * 64, "commit": None, "dirty": None}
    runs = [
        run(3, 13, 30, productive_s=17, workdir=code, end="preempted"),
        run(31, 40, 50, productive_s=10, workdir=code, end="preempted"),
        run(51, 60, 73, productive_s=13, workdir=other, end="completed"),
    ]
    g = gp.account(
        PYTORCHJOB_KIND, pytorchjob(done_at=76), [master_pod(1, scheduled=2, running=None)],
        ledger={"runs": runs}, events=[], workload=None, now=T0 + 1000,
        price_per_gpu_hour=None,
    )  # fmt: skip
    assert g["workdir"] == [code, other]
    lines = gp.format_goodput("pytorchjob ml/job", g)
    assert lines[1:3] == [
        f"  code: workdir sha256:{'a' * 12} git {'b' * 12} (dirty)",
        f"  code: workdir sha256:{'c' * 12}",
    ]
