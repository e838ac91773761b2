"""The Kubeflow SDK v2 (`kubeflow` from PyPI, ``TrainerClient``) reads the TrainJobs ddpjob submits:
what we render is an ordinary TrainJob to every other tool. ``get_job``, ``list_jobs``,
``get_job_logs`` (followed while the job runs, and read after it ended), ``wait_for_job_status``
and ``get_job_events``, each compared with what the cluster itself says."""

from __future__ import annotations

import logging
import threading

import pytest

from controller import kubeflow
from localkube.handle import wait_until
from tests.e2e.helpers import ddpjob
from tests.e2e.test_trainjob import _trainjob_spec
from trainer.contract import is_event, parse_event

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _rank0_pod(cluster, name: str, namespace: str) -> str:
    selector = f"{kubeflow.LABEL_JOBSET_NAME}={name},{kubeflow.LABEL_JOB_COMPLETION_INDEX}=0"
    (pod,) = cluster.get_json("pods", "-n", namespace, "-l", selector)["items"]
    return pod["metadata"]["name"]


def test_trainer_client_reads_a_trainjob_ddpjob_submitted(real_node, namespace, tmp_path, caplog):
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    cluster, name = real_node, "sdk"
    spec = _trainjob_spec(cluster, tmp_path, name, namespace, max_steps=60, log_every=2)
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr

    with caplog.at_level(logging.WARNING, logger="kubeflow"):
        sdk = TrainerClient(
            KubernetesBackendConfig(config_file=str(cluster.kubeconfig), namespace=namespace)
        )
    # It found upstream's kubeflow-trainer-public ConfigMap (localkube installs it).
    assert not [x for x in caplog.records if "version info is not available" in x.getMessage()]

    def rank0_started():
        step = next((s for s in sdk.get_job(name).steps if s.name == "node-0"), None)
        return step if step is not None and step.status in ("Running", "Succeeded") else None

    wait_until("rank 0's pod running, as the SDK sees it", rank0_started, 300, 0.5)
    followed: list[str] = []
    follow_error: list[BaseException] = []

    def follow() -> None:
        try:
            followed.extend(sdk.get_job_logs(name, follow=True))
        except BaseException as e:  # surfaces in the test
            follow_error.append(e)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()

    job = sdk.wait_for_job_status(name, timeout=600, polling_interval=1)
    assert job.status == "Complete"
    follower.join(timeout=60)
    assert not follower.is_alive(), "get_job_logs(follow=True) did not end after the job did"
    assert not follow_error, follow_error

    # get_job: what the TrainJob and its pods say.
    job = sdk.get_job(name)
    assert (job.name, job.status, job.num_nodes) == (name, "Complete", 2)
    assert job.runtime.name == kubeflow.DEFAULT_RUNTIME
    assert job.runtime.trainer.framework == "torch"
    pods = cluster.get_json("pods", "-n", namespace, "-l", f"{kubeflow.LABEL_JOBSET_NAME}={name}")[
        "items"
    ]
    by_index = {p["metadata"]["labels"][kubeflow.LABEL_JOB_COMPLETION_INDEX]: p for p in pods}
    assert sorted((s.name, s.pod_name, s.status) for s in job.steps) == sorted(
        (f"node-{i}", p["metadata"]["name"], p["status"]["phase"]) for i, p in by_index.items()
    )
    assert {s.device_count for s in job.steps} == {"1"}  # from PET_NPROC_PER_NODE

    # list_jobs: ours, and nothing else in the namespace.
    assert [j.name for j in sdk.list_jobs()] == [name]

    # get_job_logs: rank 0's log, the same lines kubectl and ddpjob print.
    truth = cluster.kubectl("logs", "-n", namespace, _rank0_pod(cluster, name, namespace))
    lines = truth.stdout.splitlines()
    assert list(sdk.get_job_logs(name)) == lines
    assert followed == lines, (len(followed), len(lines))
    done = [parse_event(x) for x in lines if is_event(x, "done")]
    assert done and done[-1]["reason"] == "completed" and done[-1]["step"] == 60
    ours = ddpjob(cluster, "logs", name, "-n", namespace)
    assert ours.returncode == 0 and ours.stdout.splitlines() == lines, ours.stderr

    # The TrainJob's own progress, which rank 0 posted (Trainer's progress API): what the SDK's
    # TrainJob model (kubeflow_trainer_api, the one get_job parses with) reads. SDK 0.5.0's
    # get_job does not copy it into its TrainJob type.
    from kubeflow_trainer_api import models

    cr = sdk.backend.custom_api.get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name
    )
    reported = models.TrainerV1alpha1TrainJob.from_dict(cr).status.trainer_status
    said = [line for line in lines if "progress:" in line]  # rank 0 on a failed post
    assert reported is not None, (cr["status"], said)
    assert (reported.progress_percentage, reported.estimated_remaining_seconds) == (100, 0), (
        reported,
        said,
    )
    assert {m.name for m in reported.metrics} >= {"loss", "samples_per_s", "step"}

    # get_job_events: the kubelet's events of rank 0's pod are among them.
    events = sdk.get_job_events(name)
    rank0 = _rank0_pod(cluster, name, namespace)
    assert {"Pulled", "Created", "Started"} <= {
        e.reason for e in events if e.involved_object_name == rank0
    }, [(e.involved_object_kind, e.involved_object_name, e.reason) for e in events]
