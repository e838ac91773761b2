"""The Kubeflow SDK (`kubeflow-training` from PyPI) reads the jobs we submit: what we render is
an ordinary PyTorchJob to every other tool."""

from __future__ import annotations

import pytest

from localkube.handle import wait_until
from tests.e2e.helpers import ddpjob, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_kubeflow_sdk_reads_our_job(real_node, namespace, tmp_path):
    from kubeflow.training import TrainingClient

    cluster = real_node
    spec = write_spec(cluster, tmp_path, "compat", namespace, max_steps=20)
    r = ddpjob(cluster, "submit", str(spec), "--wait")
    assert r.returncode == 0, r.stderr

    sdk = TrainingClient(config_file=str(cluster.kubeconfig), namespace=namespace)
    job = sdk.wait_for_job_conditions("compat", wait_timeout=30, polling_interval=1)
    assert job.metadata.name == "compat"
    assert sdk.is_job_succeeded("compat")
    got = sdk.get_job("compat")
    assert got.spec.pytorch_replica_specs["Master"].replicas == 1
    assert got.spec.pytorch_replica_specs["Worker"].replicas == 1
    assert got.spec.pytorch_replica_specs["Master"].template.spec.containers[0].name == "pytorch"
    logs, _ = sdk.get_job_logs("compat")
    assert list(logs) == ["compat-master-0"]
    assert '"event": "done"' in logs["compat-master-0"]

    # The same pods kubectl lists. A Worker still running when the Master finished is deleted
    # by cleanPodPolicy: Running, so both lists are read once no pod of the job runs or is
    # being deleted, and compared, not assumed.
    def settled() -> bool:
        return all(
            p["status"].get("phase") != "Running" and not p["metadata"].get("deletionTimestamp")
            for p in cluster.job_pods("compat", namespace)
        )

    wait_until("the job's pods settled after cleanPodPolicy", settled, timeout=60)
    listed = cluster.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout.split()
    pods = sdk.get_job_pod_names("compat", is_master=False)
    assert "compat-master-0" in pods
    assert sorted(f"pod/{p}" for p in pods) == sorted(listed)
