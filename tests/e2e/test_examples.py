"""The examples run as written on the local cluster: no `--set image=`, nothing pulled.

The cluster holds this checkout's trainer image under the name the examples give it
(``localkube.builds.images.published_ref()``, ``kind load``-style); these runs only shorten the
training, which proves nothing here. ``submit examples/quickstart.yaml --wait --follow`` is in
test_submit.py. ``helm install`` of what ``render --values`` writes: the chart's manifest of
each example is render's (tests/packaging/test_chart.py), and such a release runs on the node
under the examples' image name in test_real_node.py (and, with a workdir, test_workdir.py).
"""

from __future__ import annotations

import json

import pytest
import yaml

from localkube.builds import images
from localkube.node import containerd, kubelet
from tests.e2e.helpers import REPO, ddpjob, events

SHORT = (
    *("--set", "trainer.max_steps=20", "--set", "trainer.warmup_steps=2"),
    *("--set", "trainer.eval_every=0"),
)


def _image_id(ref: str) -> str:
    """The image ID the node's containerd holds under ``ref``."""
    proc = containerd.ctr("images", "ls", f"name=={ref}")
    lines = proc.stdout.decode().splitlines()[1:]
    assert lines, f"{ref} is not on the node"
    return lines[0].split()[2]


def _ran_our_image(cluster, pods: list[dict]) -> None:
    """Each pod ran on the node, under the examples' name, this checkout's image."""
    published = images.published_ref()
    assert _image_id(published) == _image_id(cluster.trainer_image())
    for pod in pods:
        assert pod["spec"]["nodeName"] == kubelet.NODE_NAME
        (container,) = pod["spec"]["containers"]
        assert container["image"] == published
        (status,) = pod["status"]["containerStatuses"]
        assert status["imageID"], status


def test_every_example_and_the_chart_name_the_image_the_cluster_holds():
    """What the node is given (images.published_ref) is what users copy: the examples' image
    and the chart's default. (custom-task.yaml names an image of its own, built FROM ours with
    the plug-in copied in: on this cluster, `python -m localkube load` it.)"""
    paths = [*sorted((REPO / "examples").glob("*.yaml")), REPO / "charts/ddpjob/values.yaml"]
    named = {p.name: yaml.safe_load(p.read_text())["image"] for p in paths}
    assert named.pop("custom-task.yaml").startswith(images.PUBLISHED_REPOSITORY + "-custom:")
    assert set(named.values()) == {images.published_ref()}, named


@pytest.mark.slow
@pytest.mark.whole_node
def test_the_trainjob_example_as_written_succeeds(cluster, namespace):
    example = REPO / "examples" / "trainjob.yaml"
    assert yaml.safe_load(example.read_text())["image"] == images.published_ref()
    r = ddpjob(cluster, "submit", str(example), "-n", namespace, "--wait", *SHORT, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"job {namespace}/trainjob Succeeded" in r.stdout
    selector = "jobset.sigs.k8s.io/jobset-name=trainjob"
    pods = cluster.get_json("pods", "-n", namespace, "-l", selector)["items"]
    assert len(pods) == 2
    _ran_our_image(cluster, pods)
    st = json.loads(ddpjob(cluster, "status", "trainjob", "-n", namespace, "-o", "json").stdout)
    assert st["condition"] == "Succeeded" and st["progress"]["step"] == 20


@pytest.mark.slow
@pytest.mark.whole_node
def test_the_workdir_example_as_written_runs_its_own_code_on_the_stock_image(cluster, namespace):
    """examples/workdir/: the project folder beside the spec is not in the image; the job
    ships it (a ConfigMap owned by the job) and both pods train its task, reading its data
    (the task's settings file: a missing one would fail the build of the task)."""
    example = REPO / "examples" / "workdir" / "workdir.yaml"
    assert yaml.safe_load(example.read_text())["image"] == images.published_ref()
    r = ddpjob(cluster, "submit", str(example), "-n", namespace, "--wait", *SHORT, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"job {namespace}/workdir Succeeded" in r.stdout
    assert f"-> ConfigMap {namespace}/workdir-workdir" in r.stdout
    log = cluster.kubectl("logs", "workdir-master-0", "-n", namespace, "-c", "pytorch").stdout
    (start,) = events(log, "start")
    assert start["world_size"] == 2 and start["config"]["task"] == "sinefit.task:build"
    (done,) = events(log, "done")
    assert (done["reason"], done["step"]) == ("completed", 20)
    selector = "training.kubeflow.org/job-name=workdir"
    pods = cluster.get_json("pods", "-n", namespace, "-l", selector)["items"]
    _ran_our_image(cluster, pods)
    for pod in pods:  # the image's own code is not what ran: the pod unpacked the project
        (container,) = pod["spec"]["containers"]
        assert container["command"][:3] == ["python", "-m", "trainer.workdir"]
