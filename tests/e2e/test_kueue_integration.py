"""A cluster whose Kueue does not manage the job's kind, as a user meets one: since v0.19
upstream's configuration leaves ``kubeflow.org/pytorchjob`` out, and a job with ``queue:`` of a
kind Kueue ignores is created suspended and stays so, with no Workload, forever.

The local cluster's Kueue reads its configuration from a file (``.cluster/kueue/config.yaml``):
the test writes one whose ``integrations.frameworks`` is ``batch/job`` alone and restarts Kueue
(its webhooks refuse every job while it is down: ``disruptive``). Then ``doctor`` of a spec with
a queue fails naming the fix, for a PyTorchJob and a TrainJob; ``submit`` refuses with that line
(exit 1: the cluster's Kueue is at fault, not the spec) and creates nothing; a job submitted
anyway (``--no-preflight``) is held with no Workload, and ``status`` and ``wait`` say why. A
manifest install keeps the configuration in ConfigMap ``kueue-system/kueue-manager-config``:
with one there, doctor reads it too, and one that lists the kind while the running Kueue ignores
it is said to need a restart. With the configuration put back and Kueue restarted, doctor says
Kueue manages both kinds. The same checks on API dicts: tests/controller/test_queue_unit.py."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
import yaml

from localkube.addons import kueue
from localkube.handle import temporary_namespace
from tests.e2e.helpers import ddpjob, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.disruptive]

CONFIG_MAP = ("kueue-system", "kueue-manager-config")
KEY = "controller_manager_config.yaml"
FRAMEWORKS = {"PyTorchJob": "kubeflow.org/pytorchjob", "TrainJob": "trainer.kubeflow.org/trainjob"}


@contextmanager
def kueue_with_frameworks(cluster, frameworks: list[str]):
    """Kueue restarted with ``integrations.frameworks`` = ``frameworks``; put back (and restarted
    again) at the end, whatever happened."""
    path = cluster.control_plane.state_dir / "kueue" / "config.yaml"
    original = path.read_text()
    config = yaml.safe_load(original)
    config["integrations"]["frameworks"] = frameworks
    path.write_text(yaml.safe_dump(config))
    try:
        cluster.control_plane.restart_component("kueue")
        yield config
    finally:
        path.write_text(original)
        cluster.control_plane.restart_component("kueue")


def _config_map(cluster, tmp_path, config: dict) -> None:
    """ConfigMap kueue-system/kueue-manager-config holding ``config``, as upstream's manifests
    install it (replaced if there)."""
    text = tmp_path / KEY
    text.write_text(yaml.safe_dump(config))
    namespace, name = CONFIG_MAP
    cluster.kubectl("delete", "configmap", name, "-n", namespace, "--ignore-not-found")
    cluster.kubectl("create", "configmap", name, "-n", namespace, f"--from-file={KEY}={text}")


def _kueue_line(out: str, kind: str) -> str:
    (line,) = [x for x in out.splitlines() if x.startswith("[") and f"Kueue ({kind}):" in x]
    return line


def test_doctor_submit_status_and_wait_say_when_kueue_ignores_the_jobs_kind(cluster, tmp_path):
    kueue.require()
    with temporary_namespace(cluster, "kueue-kinds") as ns:
        cluster.kubectl(
            "apply", "-f", "-",
            input_text=json.dumps({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": "user-queue", "namespace": ns},
                "spec": {"clusterQueue": kueue.CLUSTER_QUEUE},
            }),
        )  # fmt: skip
        specs = {
            "PyTorchJob": write_spec(cluster, tmp_path, "held", ns, queue="user-queue"),
            "TrainJob": write_spec(
                cluster, tmp_path, "held-tj", ns, queue="user-queue", api="trainjob"
            ),
        }
        try:
            with kueue_with_frameworks(cluster, ["batch/job"]) as config:
                _while_kueue_ignores_both_kinds(cluster, tmp_path, ns, specs, config)
        finally:
            cluster.kubectl(
                "delete", "configmap", CONFIG_MAP[1], "-n", CONFIG_MAP[0], "--ignore-not-found"
            )
            cluster.kubectl("delete", "trainjobs", "--all", "-n", ns, "--wait=false", check=False)

        # Put back: Kueue manages both again, and says so.
        for kind, spec in specs.items():
            r = ddpjob(cluster, "doctor", str(spec))
            line = _kueue_line(r.stdout, kind)
            assert line.startswith(f"[  ok] Kueue ({kind}): Kueue manages {kind}s"), r.stdout
            assert f"its webhook suspended a dry-run {kind} with a queue" in line


def _while_kueue_ignores_both_kinds(cluster, tmp_path, ns, specs, config) -> None:
    # doctor: one line with the fix, for each kind, and exit 1.
    for kind, spec in specs.items():
        r = ddpjob(cluster, "doctor", str(spec))
        assert r.returncode == 1, r.stdout + r.stderr
        framework = FRAMEWORKS[kind]
        line = _kueue_line(r.stdout, kind)
        assert line.startswith(
            f"[FAIL] Kueue ({kind}): Kueue does not manage {kind}s on this cluster ({framework} "
            "is not among its integrations): a job with queue: stays suspended forever, with no "
            f"Workload. Enable {framework} in Kueue's integrations.frameworks"
        ), r.stdout
        # The local cluster's Kueue reads a file: its webhook tells.
        assert "no ConfigMap kueue-system/kueue-manager-config" in line
        assert f"its webhook left a dry-run {kind} with a queue unsuspended" in line

    # submit: refused before anything is created, with that line; the cluster is at fault: 1.
    r = ddpjob(cluster, "submit", str(specs["PyTorchJob"]))
    assert r.returncode == 1, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: submit: preflight Kueue (PyTorchJob) failed: Kueue does not manage PyTorchJobs"
    ), r.stderr
    assert "Traceback" not in r.stderr
    assert cluster.get_json("pytorchjobs", "-n", ns)["items"] == []

    # Submitted anyway: held with no Workload; status and wait say why.
    r = ddpjob(cluster, "submit", str(specs["PyTorchJob"]), "--no-preflight")
    assert r.returncode == 0, r.stdout + r.stderr
    job = cluster.get_json("pytorchjob", "held", "-n", ns)
    assert job["spec"]["runPolicy"]["suspend"] is True
    st = json.loads(ddpjob(cluster, "status", "held", "-n", ns, "-o", "json").stdout)
    assert st["queue"]["workload"] is None
    assert st["queue"]["problem"].startswith("Kueue does not manage PyTorchJobs on this cluster")
    text = ddpjob(cluster, "status", "held", "-n", ns).stdout
    assert (
        f"queue: queue user-queue -> {kueue.CLUSTER_QUEUE}: Kueue does not manage PyTorchJobs"
        in text
    ), text
    r = ddpjob(cluster, "wait", "held", "-n", ns, "--timeout", "10")
    assert r.returncode == 1, r.stdout + r.stderr
    assert (
        f"job held: queue user-queue -> {kueue.CLUSTER_QUEUE}: Kueue does not manage PyTorchJobs"
        in r.stderr
    ), r.stderr
    assert cluster.get_json("workloads", "-n", ns)["items"] == []
    cluster.kubectl("delete", "pytorchjob", "held", "-n", ns, "--wait=false")

    # A manifest install's ConfigMap: doctor reads it beside the webhook.
    _config_map(cluster, tmp_path, config)
    r = ddpjob(cluster, "doctor", str(specs["PyTorchJob"]))
    line = _kueue_line(r.stdout, "PyTorchJob")
    assert line.startswith("[FAIL] Kueue (PyTorchJob): Kueue does not manage PyTorchJobs")
    assert "(seen: ConfigMap kueue-system/kueue-manager-config lists batch/job;" in line
    # Edited to list it, Kueue not restarted: still ignored, and doctor says to restart it.
    edited = {**config, "integrations": {"frameworks": ["batch/job", "kubeflow.org/pytorchjob"]}}
    _config_map(cluster, tmp_path, edited)
    r = ddpjob(cluster, "doctor", str(specs["PyTorchJob"]))
    assert r.returncode == 1, r.stdout
    line = _kueue_line(r.stdout, "PyTorchJob")
    assert (
        "Its ConfigMap lists kubeflow.org/pytorchjob already: Kueue reads it only at start, "
        "restart it" in line
    ), line
