"""A shipped workdir in the rendered job (controller/render/workdir.py) and in the spec.

What every pod of either API gets: the folder at /workdir, unpacked by the training container's
own command before it execs the user's, the digest checked; the trainer's working directory and
PYTHONPATH; the job's record of which code it runs. Render takes what was packed as data
(``Shipped``): no folder is read here.
"""

from __future__ import annotations

import pytest

from controller.errors import UserError
from controller.kubeflow import WORKDIR_PATH
from controller.render.job import render_job
from controller.render.workdir import config_map_of
from controller.spec import validate_spec
from controller.workdir import Shipped
from tests.controller.conftest import minimal

DIGEST = "sha256:" + "ab" * 32
IN_CONFIG_MAP = Shipped(DIGEST, config_map="job-workdir", commit="c" * 40, dirty=False)
IN_STORE = Shipped(DIGEST, url=f"s3://b/p/{'ab' * 32}.tar.gz")
FETCH = ["python", "-m", "trainer.workdir"]


def _spec(**fields):
    return validate_spec(minimal(nodes=2, workdir=".", **fields))


def _env(container) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_a_pytorchjob_pod_unpacks_in_its_own_command_then_execs_the_users():
    """No init container: the operator would re-create for ever a pod whose init container
    failed (it reads the exit code of the training container only)."""
    job = render_job(_spec(env={"A": "1"}, command=["python", "train.py"]), IN_CONFIG_MAP)
    assert job["metadata"]["annotations"] == {
        "ddpjob/workdir-digest": DIGEST,
        "ddpjob/workdir-git-commit": "c" * 40,
        "ddpjob/workdir-git-dirty": "false",
    }
    for rtype in ("Master", "Worker"):
        pod = job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]
        assert "initContainers" not in pod
        (trainer,) = pod["containers"]
        assert trainer["command"] == [
            *FETCH, "/var/run/ddpjob/workdir/workdir.tar.gz", "--digest", DIGEST,
            "--into", WORKDIR_PATH, "--", "python", "train.py",
        ]  # fmt: skip
        env = _env(trainer)
        assert env["A"] == "1" and env["PYTHONPATH"] == WORKDIR_PATH
        assert env["DDPJOB_WORKDIR_DIGEST"] == DIGEST and env["DDPJOB_WORKDIR_DIRTY"] == "false"
        assert trainer["volumeMounts"][-2:] == [
            {"name": "workdir", "mountPath": WORKDIR_PATH},
            {"name": "workdir-archive", "mountPath": "/var/run/ddpjob/workdir", "readOnly": True},
        ]
        assert pod["volumes"][-2:] == [
            {"name": "workdir", "emptyDir": {}},
            {"name": "workdir-archive", "configMap": {"name": "job-workdir"}},
        ]
    assert config_map_of(job) == "job-workdir"


def test_a_trainjob_node_unpacks_in_its_own_command_then_execs_the_users():
    """As a PyTorchJob's: runtimePatches could give an init container no image or command,
    nor set workingDir, anyway."""
    job = render_job(_spec(api="trainjob", command=["torchrun", "train.py"]), IN_CONFIG_MAP)
    trainer = job["spec"]["trainer"]
    assert trainer["command"] == [
        *FETCH, "/var/run/ddpjob/workdir/workdir.tar.gz", "--digest", DIGEST,
        "--into", WORKDIR_PATH, "--", "torchrun", "train.py",
    ]  # fmt: skip
    assert _env(trainer)["PYTHONPATH"] == WORKDIR_PATH
    (patch,) = job["spec"]["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = rjob["template"]["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    (node,) = pod["containers"]
    assert [m["name"] for m in node["volumeMounts"]][-2:] == ["workdir", "workdir-archive"]
    assert [v["name"] for v in pod["volumes"]][-2:] == ["workdir", "workdir-archive"]
    assert config_map_of(job) == "job-workdir"


def test_an_object_store_needs_no_volume_and_the_pods_get_its_url():
    job = render_job(_spec(workdir_store="s3://b/p"), IN_STORE)
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    (trainer,) = pod["containers"]
    assert trainer["command"][3] == IN_STORE.url
    assert [v["name"] for v in pod["volumes"]][-1] == "workdir"
    assert [m["name"] for m in trainer["volumeMounts"]][-1] == "workdir"
    assert config_map_of(job) is None
    assert "ddpjob/workdir-git-commit" not in job["metadata"]["annotations"]


def test_a_users_pythonpath_follows_the_workdir():
    job = render_job(_spec(env={"PYTHONPATH": "/opt/lib", "B": "2"}), IN_CONFIG_MAP)
    (trainer,) = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    names = [e["name"] for e in trainer["env"]]
    assert names.count("PYTHONPATH") == 1 and names.index("PYTHONPATH") < names.index("B")
    assert _env(trainer)["PYTHONPATH"] == f"{WORKDIR_PATH}:/opt/lib"


def test_without_a_workdir_nothing_changes_and_with_one_render_needs_the_archive():
    plain = validate_spec(minimal(nodes=2))
    job = render_job(plain)
    assert "annotations" not in job["metadata"]
    assert "initContainers" not in job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    with pytest.raises(ValueError, match="needs what was packed"):
        render_job(_spec())


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        (
            {"workdir_store": "s3://b/p"},
            "workdir_store: names where the workdir goes (got s3://b/p), but no workdir is set. "
            "Set workdir, or remove workdir_store",
        ),
        (
            {"workdir": ".", "workdir_store": "gs://b"},
            "workdir_store: must be s3://bucket or s3://bucket/prefix; leave it out for a "
            "ConfigMap (got gs://b)",
        ),
        (
            {"workdir": ".", "annotations": {"ddpjob/workdir-digest": "x"}},
            "annotations: ddpjob/workdir-digest is set by ddpjob from the workdir; remove it",
        ),
        (
            {"workdir": ".", "env": {"DDPJOB_WORKDIR_DIGEST": "x"}},
            "env: DDPJOB_WORKDIR_DIGEST is set by ddpjob from the workdir; remove it",
        ),
        ({"workdir": " "}, "workdir: must be a folder's path, e.g. `.`; leave it out for none"),
    ],
)
def test_the_spec_refuses_what_the_workdir_cannot_carry(fields, problem):
    with pytest.raises(UserError) as e:
        validate_spec(minimal(**fields))
    assert any(line.startswith(problem) for line in e.value.problems), e.value.problems
