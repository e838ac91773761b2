"""The jobs layer on TrainJob-shaped API dicts: state from conditions and jobsStatus, rank 0 and
replica names from JobSet's labels, missing pods explained from the controllers' events, a NAME
found in whichever API has it, and the pods a wait recorded standing in for deleted ones.

The dicts follow what Trainer v2.3.0 and JobSet v0.12.0 write (trainjob_types.go, the JobSet
plugin's Status, JobSet's pod labels); ``apiVersion``/``kind`` as every API object carries them.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.errors import NotFound, UserError
from controller.jobs.find import find_job
from controller.jobs.read.apis import PYTORCHJOB_KIND, TRAINJOB_KIND, kind_of
from controller.jobs.read.explain import (
    container_status,
    explain_failure,
    job_condition,
    job_terminal,
    node_rank,
    replica_name,
    replica_rows,
)
from controller.jobs.snapshot import Snapshot
from controller.jobs.status import job_status
from controller.jobs.watches import PodHistory


def trainjob(*conditions: dict[str, Any], jobs: list[dict] | None = None, **meta) -> dict:
    status: dict[str, Any] = {}
    if conditions:
        status["conditions"] = list(conditions)
    if jobs is not None:
        status["jobsStatus"] = jobs
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "tj",
            "namespace": "ml",
            "uid": "u1",
            "creationTimestamp": "2026-11-22T10:00:00Z",
            **meta,
        },
        "spec": {
            "runtimeRef": {
                "name": "torch-distributed",
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
            },
            "trainer": {"image": "i", "numNodes": 2, "numProcPerNode": 1},
            "suspend": False,
        },
        "status": status,
    }


def cond(ctype: str, status: str = "True", reason: str = "", message: str = "", at: str = ""):
    return {
        "type": ctype,
        "status": status,
        "reason": reason or ctype,
        "message": message,
        "lastTransitionTime": at or "2026-11-22T10:00:05Z",
    }


def job_counts(ready=0, succeeded=0, failed=0, active=0, suspended=0) -> list[dict[str, Any]]:
    return [
        {
            "name": "node",
            "ready": ready,
            "succeeded": succeeded,
            "failed": failed,
            "active": active,
            "suspended": suspended,
        }
    ]


def pod(index: int, *, uid: str = "", phase: str = "Running", state=None, last=None, restarts=0):
    """A pod as JobSet's Job creates it: its labels, container `node`."""
    cs: dict[str, Any] = {"name": "node", "restartCount": restarts, "ready": phase == "Running"}
    cs["state"] = state or ({"running": {"startedAt": "2026-11-22T10:00:10Z"}})
    if last:
        cs["lastState"] = {"terminated": last}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"tj-node-0-{index}-abc{index}d",
            "namespace": "ml",
            "uid": uid or f"pod-{index}",
            "labels": {
                "batch.kubernetes.io/controller-uid": "j1",
                "batch.kubernetes.io/job-completion-index": str(index),
                "batch.kubernetes.io/job-name": "tj-node-0",
                "jobset.sigs.k8s.io/job-index": "0",
                "jobset.sigs.k8s.io/jobset-name": "tj",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
                "jobset.sigs.k8s.io/restart-attempt": "0",
                "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
                "app.kubernetes.io/instance": "tj",
            },
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
        },
        "spec": {"nodeName": "node-a", "hostname": f"tj-node-0-{index}", "subdomain": "tj"},
        "status": {"phase": phase, "containerStatuses": [cs]},
    }


def exited(code: int, at: str, reason: str = "Error") -> dict[str, Any]:
    return {
        "exitCode": code,
        "reason": reason,
        "finishedAt": at,
        "startedAt": "2026-11-22T10:00:10Z",
    }


# ---------------------------------------------------------------------------------------------
# State


def test_state_without_a_running_condition_comes_from_jobs_status():
    assert job_condition(trainjob()) == "Pending"  # no JobSet yet
    assert job_condition(trainjob(jobs=job_counts(active=1))) == "Created"  # pods starting
    assert job_condition(trainjob(jobs=job_counts(active=1, ready=1))) == "Running"
    suspended = trainjob(
        cond("Suspended", message="TrainJob is suspended"), jobs=job_counts(suspended=1)
    )
    assert job_condition(suspended) == "Suspended"
    resumed = trainjob(cond("Suspended", "False", "Resumed"), jobs=job_counts(active=1, ready=1))
    assert job_condition(resumed) == "Running"
    assert job_terminal(resumed) is None


def test_complete_and_failed_are_the_terminal_states_named_as_for_pytorchjobs():
    done = trainjob(cond("Complete", reason="AllJobsCompleted"), jobs=job_counts(succeeded=1))
    assert (job_condition(done), job_terminal(done)) == ("Succeeded", "Succeeded")
    failed = trainjob(
        cond("Failed", reason="FailedJobs", message="jobset failed due to job node failing")
    )
    assert (job_condition(failed), job_terminal(failed)) == ("Failed", "Failed")
    assert TRAINJOB_KIND.condition_message(failed, "Failed") == (
        "jobset failed due to job node failing"
    )
    deleting = trainjob(deletionTimestamp="2026-11-22T10:01:00Z")
    assert job_condition(deleting) == "Deleting"


def test_start_time_is_the_resume_else_the_creation():
    assert TRAINJOB_KIND.start_time(trainjob()) == "2026-11-22T10:00:00Z"
    resumed = trainjob(cond("Suspended", "False", "Resumed", at="2026-11-22T11:00:00Z"))
    assert TRAINJOB_KIND.start_time(resumed) == "2026-11-22T11:00:00Z"


def test_kind_of_a_manifest_or_job():
    assert kind_of(trainjob()) is TRAINJOB_KIND
    assert kind_of({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}) is PYTORCHJOB_KIND
    with pytest.raises(ValueError, match="not a job ddpjob knows"):
        kind_of({"apiVersion": "batch/v1", "kind": "Job"})


# ---------------------------------------------------------------------------------------------
# Pods: rank 0, replica names, the container


def test_rank_and_replica_from_the_completion_index_and_container_node():
    p0, p1 = pod(0), pod(1, restarts=2)
    assert (node_rank(p0), node_rank(p1)) == (0, 1)
    assert (replica_name(p0), replica_name(p1)) == ("node-0", "node-1")
    assert container_status(p1)["restartCount"] == 2
    rows = replica_rows([p1, p0])
    assert [(r.replica, r.restarts) for r in rows] == [("node-0", 0), ("node-1", 2)]
    assert TRAINJOB_KIND.rank_selector("tj", 0) == (
        "jobset.sigs.k8s.io/jobset-name=tj,jobset.sigs.k8s.io/replicatedjob-name=node,"
        "batch.kubernetes.io/job-completion-index=0"
    )
    assert TRAINJOB_KIND.pods_selector("tj") == "jobset.sigs.k8s.io/jobset-name=tj"
    assert TRAINJOB_KIND.expected_replicas(trainjob()) == ["node-0", "node-1"]
    assert TRAINJOB_KIND.pod_name_of("tj", "node-1") == "tj-node-0-1"


def test_a_failure_restarted_in_place_names_the_pod_and_reads_the_previous_log():
    # OnFailure: rank 1 raised (exit 1), rank 0 then lost its peer (138); both restarted in
    # place, waiting in CrashLoopBackOff.
    waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}
    p0 = pod(0, state=waiting, last=exited(138, "2026-11-22T10:02:01Z"), restarts=3)
    p1 = pod(1, state=waiting, last=exited(1, "2026-11-22T10:02:00Z"), restarts=3)
    failure = explain_failure(trainjob(cond("Failed")), [p0, p1])
    assert (failure.replica, failure.pod, failure.exit_code) == ("node-1", "tj-node-0-1-abc1d", 1)
    assert failure.previous and failure.restarts == 3
    text = failure.render("ml/tj")
    assert text.startswith("job ml/tj Failed: replica node-1 (pod tj-node-0-1-abc1d) exit code 1")


# ---------------------------------------------------------------------------------------------
# Against a cluster's answers (a fake that answers like the API layer)


class FakeCluster:
    server = "https://x"

    def __init__(self, jobs=None, pods=(), events=(), served=("pytorchjobs", "trainjobs")):
        self.jobs = jobs or {}  # (plural, name) -> job
        self.pods, self.events, self.served = list(pods), list(events), served
        self.logs: dict[tuple[str, bool], str] = {}

    def get_job(self, name, namespace, api=None):
        if api.plural not in self.served:
            raise NotFound(f"x: the cluster does not serve {api.kind}s", reason="APINotServed")
        if (api.plural, name) not in self.jobs:
            raise NotFound(f"x: {api.kind} {namespace}/{name} not found", reason="NotFound")
        return self.jobs[(api.plural, name)]

    def list_pods(self, namespace, selector):
        return [
            p for p in self.pods if selector.split(",")[0].split("=")[1] in p["metadata"]["name"]
        ]

    def list_events(self, namespace, field_selector=None):
        return self.events

    def read_log(self, pod, namespace, *, container, tail_lines=None, previous=False, **_):
        assert container == "node"
        if (pod, previous) not in self.logs:
            raise NotFound(f"logs: pod {pod} not found", reason="NotFound")
        return self.logs[(pod, previous)]


def test_find_job_looks_in_both_apis():
    tj, pj = trainjob(), {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}
    kind, job = find_job(FakeCluster({("trainjobs", "tj"): tj}), "tj", "ml")
    assert kind is TRAINJOB_KIND and job is tj
    # A cluster serving only PyTorchJobs: the TrainJob API's 404 is not an error.
    fake = FakeCluster({("pytorchjobs", "tj"): pj}, served=("pytorchjobs",))
    assert find_job(fake, "tj", "ml")[0] is PYTORCHJOB_KIND
    both = FakeCluster({("trainjobs", "tj"): tj, ("pytorchjobs", "tj"): pj})
    with pytest.raises(UserError, match=r"^status: ml/tj is both a PyTorchJob and a TrainJob"):
        find_job(both, "tj", "ml", where="status")
    assert find_job(both, "tj", "ml", "trainjob")[0] is TRAINJOB_KIND
    with pytest.raises(NotFound, match=r"job ml/tj not found \(got no PyTorchJob or TrainJob"):
        find_job(FakeCluster(), "tj", "ml")


def test_status_explains_missing_pods_from_the_trainjob_controllers_event():
    event = {
        "type": "Warning",
        "reason": "TrainJobResourcesCreationFailed",
        "message": 'TrainJob resources reconciliation failed: admission webhook "vjobset.kb.io" '
        "denied the request: JobSet name is too long",
        "involvedObject": {"kind": "TrainJob", "name": "tj"},
        "lastTimestamp": "2026-11-22T10:00:03Z",
        "metadata": {"uid": "e1"},
    }
    fake = FakeCluster({("trainjobs", "tj"): trainjob()}, events=[event])
    st = job_status(fake, "tj", "ml")
    assert (st["kind"], st["condition"], st["replicas"]) == ("TrainJob", "Pending", [])
    assert [p["pod"] for p in st["pending"]] == ["tj-node-0-0", "tj-node-0-1"]
    assert st["pending"][0]["reason"].startswith("no pod: TrainJobResourcesCreationFailed: ")
    # Suspended on purpose: no pods is no news.
    fake.jobs[("trainjobs", "tj")] = trainjob(cond("Suspended"))
    assert job_status(fake, "tj", "ml")["pending"] == []


def test_status_reads_progress_from_rank_0_container_node():
    fake = FakeCluster(
        {("trainjobs", "tj"): trainjob(jobs=job_counts(active=1, ready=1))}, pods=[pod(1), pod(0)]
    )
    fake.logs[("tj-node-0-0-abc0d", False)] = (
        '{"event": "train", "step": 10, "max_steps": 100, "steps_per_s": 2.0}\n'
    )
    st = job_status(fake, "tj", "ml", "trainjob")
    assert st["condition"] == "Running" and st["progress"]["step"] == 10
    assert st["progress"]["eta_s"] == 45.0


def test_status_and_list_show_the_progress_the_trainjob_itself_reports(monkeypatch, capsys):
    """status.trainerStatus (Trainer's progress API, posted by rank 0): `status` has it whole
    (`-o json`: reported_progress) and in one line, `list` its percentage; a job without it (a
    PyTorchJob, or a TrainJob whose pods post nothing) shows none. The e2e test on the real
    node: test_trainjob.py's quickstart."""
    from controller.cli import cluster as cli_cluster
    from controller.cli.main import main
    from controller.jobs.read.explain import format_reported

    reported = {
        "progressPercentage": 45,
        "estimatedRemainingSeconds": 192,
        "metrics": [{"name": "step", "value": "45"}, {"name": "loss", "value": "0.2347"}],
    }
    assert format_reported(reported) == "45%  ETA 3m12s  step 45  loss 0.2347"
    dated = format_reported({**reported, "lastUpdatedTime": "2026-11-22T10:00:00Z"})
    assert dated.startswith("45%  ETA 3m12s  step 45  loss 0.2347  (updated ")
    assert dated.endswith(" ago)")
    assert PYTORCHJOB_KIND.reported_progress({"status": {"trainerStatus": reported}}) is None

    tj = trainjob(jobs=job_counts(active=1, ready=1))
    tj["status"]["trainerStatus"] = reported
    quiet = {**trainjob(), "metadata": {**trainjob()["metadata"], "name": "quiet"}}

    class Cluster(FakeCluster):
        def default_namespace(self):
            return "ml"

        def list_jobs(self, namespace, selector=None, api=None):
            return [job for (plural, _), job in self.jobs.items() if plural == api.plural]

    fake = Cluster({("trainjobs", "tj"): tj, ("trainjobs", "quiet"): quiet}, pods=[pod(0)])
    fake.logs[("tj-node-0-0-abc0d", False)] = ""
    assert job_status(fake, "tj", "ml", "trainjob")["reported_progress"] == reported
    assert job_status(fake, "quiet", "ml", "trainjob")["reported_progress"] is None
    monkeypatch.setattr(cli_cluster, "cluster_of", lambda args: fake)

    assert main(["status", "tj", "--api", "trainjob"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == "reported in the TrainJob: 45%  ETA 3m12s  step 45  loss 0.2347"
    assert main(["list", "--api", "trainjob"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[0] == ["NAME", "KIND", "STATUS", "QUEUE", "NODES", "PROGRESS", "AGE"]
    assert [row[:6] for row in rows[1:]] == [  # no queue: QUEUE is "-"
        ["quiet", "TrainJob", "Pending", "-", "2", "-"],
        ["tj", "TrainJob", "Running", "-", "2", "45%"],
    ]


def test_the_history_of_a_wait_stands_in_for_pods_the_job_deleted():
    from controller.jobs.status import failure_report

    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    failed_pod = pod(1, state=waiting, last=exited(1, "2026-11-22T10:02:00Z"), restarts=6)
    fake = FakeCluster()
    fake.logs[(failed_pod["metadata"]["name"], True)] = "step 3\nValueError: boom\n"
    seen = PodHistory()
    seen.see(fake, pod(0), "ml")
    seen.see(fake, failed_pod, "ml")  # the watch saw it fail: its log tail is kept now
    assert seen.tail(failed_pod["metadata"]["name"]) == ["step 3", "ValueError: boom"]
    fake.logs.clear()  # the Job deleted the pod: nothing left to read
    job = trainjob(cond("Failed", message="jobset failed due to job node failing"))
    text = failure_report(Snapshot(fake, job, pods=[pod(0)]), seen)
    assert "replica node-1 (pod tj-node-0-1-abc1d) exit code 1" in text
    assert text.endswith("  | step 3\n  | ValueError: boom")


#: What the kubelet sends for a container already removed: a 200, and this is all of it.
GONE = "unable to retrieve container logs for containerd://f419c2720a5e28ae7f8e8c7e841f0e8f\n"


def test_a_run_whose_pod_went_before_its_log_was_read_is_told_by_the_lines_streamed():
    """A Job at its backoff limit deletes its pods as the failed run ends (backoffLimit 0 or 1:
    at once), so the read of the failed run's log gets only the kubelet's answer: the lines
    ``wait``'s follower streamed from that run stand in, not the kubelet's answer."""
    from controller.jobs.status import failure_report

    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    failed_pod = pod(0, state=waiting, last=exited(1, "2026-11-22T10:02:00Z"), restarts=1)
    name = failed_pod["metadata"]["name"]
    fake = FakeCluster()
    fake.logs[(name, True)] = GONE
    seen = PodHistory()
    seen.stream(("pod-0", 0), ["[rank 0] step 5", "Traceback (most recent call last):"])
    seen.stream(("pod-0", 1), ["[rank 0] INFO the next run"])  # the run after it: not this one
    seen.stream(("pod-0", 0), ["RuntimeError: injected failure at call 6 on rank 0"])
    seen.see(fake, failed_pod, "ml")  # the watch saw run 0 fail; its read got the answer only
    assert seen.tail(name) is None and seen.run_tails == {}  # the answer is not kept as a tail
    fake.logs[(name, False)] = fake.logs[(name, True)] = GONE
    job = trainjob(cond("Failed", message="jobset failed due to job node failing"))
    text = failure_report(Snapshot(fake, job, pods=[failed_pod]), seen)
    assert "replica node-0 (pod tj-node-0-0-abc0d) exit code 1" in text
    assert text.endswith(
        "  | [rank 0] step 5\n  | Traceback (most recent call last):\n"
        "  | RuntimeError: injected failure at call 6 on rank 0"
    ), text
    assert "unable to retrieve" not in text

    # Nothing streamed either: the report says the log is gone, not that it is the answer.
    text = failure_report(Snapshot(fake, job, pods=[failed_pod]), PodHistory())
    assert text.endswith(f"  | (log unavailable: {GONE.strip()})"), text


def test_with_no_pod_left_the_report_gives_the_controllers_events():
    from controller.jobs.status import failure_report

    job_event = {
        "type": "Warning",
        "reason": "BackoffLimitExceeded",
        "message": "Job has reached the specified backoff limit",
        "involvedObject": {"kind": "Job", "name": "tj-node-0"},
        "lastTimestamp": "2026-11-22T10:03:00Z",
        "metadata": {"uid": "e2"},
    }
    fake = FakeCluster(events=[job_event])
    job = trainjob(cond("Failed", message="jobset failed"))
    text = failure_report(Snapshot(fake, job, pods=[]))
    assert text.splitlines() == [
        "job ml/tj Failed: jobset failed",
        "events:",
        "  job/tj-node-0: BackoffLimitExceeded: Job has reached the specified backoff limit",
    ]


# ---------------------------------------------------------------------------------------------
# CLI wiring


@pytest.mark.parametrize("command", ["wait", "status", "logs", "delete", "events", "plot"])
def test_every_command_that_takes_a_name_takes_api(command):
    from controller.cli.main import build_parser

    args = build_parser().parse_args([command, "tj", "--api", "trainjob"])
    assert (args.name, args.api) == ("tj", "trainjob")
    assert build_parser().parse_args([command, "tj"]).api is None  # look in both


def test_list_takes_api_and_submit_reads_it_from_the_spec(capsys):
    from controller.cli.main import build_parser

    assert build_parser().parse_args(["list", "--api", "pytorchjob"]).api == "pytorchjob"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["submit", "spec.yaml", "--api", "trainjob"])
    assert "--api" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["status", "tj", "--api", "tfjob"])


def test_render_prints_a_trainjob_for_api_trainjob(capsys):
    import yaml

    from controller.cli.main import main
    from tests.controller.conftest import REPO

    quickstart = str(REPO / "examples" / "quickstart.yaml")
    assert main(["render", quickstart, "--set", "api=trainjob"]) == 0
    job = yaml.safe_load(capsys.readouterr().out)
    assert (job["kind"], job["spec"]["trainer"]["numNodes"]) == ("TrainJob", 2)
    assert main(["render", quickstart, "--set", "api=trainjob", "--set", "backoff_limit=2"]) == 2
    assert capsys.readouterr().err.startswith("error: backoff_limit: a TrainJob cannot carry it")
