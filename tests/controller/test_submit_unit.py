"""submit's creates (controller/jobs/submit.py): the job, then what goes with it (a workdir's
ConfigMap, what monitoring asks for) owned by it, or none of them. The API server's answers are
played by a stand-in that counts each call; the real API server's are in
tests/e2e/test_workdir.py (a quota refusing the ConfigMap)."""

from __future__ import annotations

import pytest

from controller.errors import ClusterError, Conflict, Forbidden
from controller.jobs import submit

JOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "wd", "namespace": "ml"},
}
CONFIG_MAP = {"kind": "ConfigMap", "metadata": {"name": "wd-workdir", "namespace": "ml"}}
MONITOR = {"kind": "PodMonitor", "metadata": {"name": "wd", "namespace": "ml"}}


class Answers:
    """Creates the job; answers the creates beside it with ``answers`` in turn (an exception
    to raise, or None to accept)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls: list[str] = []

    def create_job(self, manifest):
        self.calls.append("create job")
        return {**manifest, "metadata": {**manifest["metadata"], "uid": "u-1"}}

    def create_beside(self, manifest, owner):
        self.calls.append(f"create {manifest['kind']} owned by {owner['metadata']['uid']}")
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer

    def delete_job(self, name, namespace, api):
        self.calls.append(f"delete job {namespace}/{name} ({api.kind})")


def test_what_goes_with_the_job_comes_after_it_and_names_it_as_owner():
    cluster = Answers(None, None)
    job = submit.create(cluster, JOB, [CONFIG_MAP, MONITOR])
    assert job["metadata"]["uid"] == "u-1"
    assert cluster.calls == [
        "create job",
        "create ConfigMap owned by u-1",
        "create PodMonitor owned by u-1",
    ]


def test_a_refusal_takes_the_job_back_and_creates_nothing_after_it():
    refused = Forbidden("submit: ConfigMap ml/wd-workdir: exceeded quota", reason="Forbidden")
    cluster = Answers(refused)
    with pytest.raises(Forbidden):
        submit.create(cluster, JOB, [CONFIG_MAP, MONITOR])
    assert cluster.calls == [
        "create job",
        "create ConfigMap owned by u-1",
        "delete job ml/wd (PyTorchJob)",
    ]


def test_a_deleted_jobs_configmap_still_there_is_waited_for(monkeypatch):
    monkeypatch.setattr(submit.time, "sleep", lambda s: None)
    exists = Conflict("submit: ConfigMap ml/wd-workdir already exists", reason="AlreadyExists")
    cluster = Answers(exists, exists, None)
    submit.create(cluster, JOB, [CONFIG_MAP])
    assert cluster.calls == ["create job", *["create ConfigMap owned by u-1"] * 3]


def test_one_that_stays_is_refused_without_the_replace_hint(monkeypatch):
    monkeypatch.setattr(submit, "GONE_WITHIN_S", 0.0)
    exists = Conflict("submit: ConfigMap ml/wd-workdir already exists", reason="AlreadyExists")
    cluster = Answers(exists)
    with pytest.raises(ClusterError) as e:
        submit.create(cluster, JOB, [CONFIG_MAP])
    assert not isinstance(e.value, Conflict)  # the CLI's Conflict advice is --replace
    assert str(e.value).startswith("submit: ConfigMap ml/wd-workdir already exists and did not")
    assert cluster.calls[-1] == "delete job ml/wd (PyTorchJob)"
