"""A project folder that is not in the image runs on the real node with the stock image: the
workdir shipped with the job (controller/workdir.py packs it, trainer/workdir.py unpacks it in
every pod), both job APIs, driven through the CLI as a user would.

The project is a git repository in the test's folder: a task plug-in package (``mypkg``) that
imports its own helper module and reads a data file beside it, a ``.gitignore``d secret and
``.git`` itself. Each rank prints one probe line from the task's ``build``: the marker it read,
its working directory and every file it sees there, so the tests read from the pods themselves
which code ran and what reached them.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from controller import kubeflow
from tests.e2e.helpers import ddpjob, events, write_spec
from tests.projects import git_repository
from trainer.contract import split_rank

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"

TASK = '''\
"""A task whose build says which code, data and files each rank sees."""

import json
import os
from pathlib import Path

from mypkg import shapes


def build(**_):
    files = sorted(
        str(p.relative_to(".")) for p in Path(".").rglob("*") if p.is_file() or p.is_symlink()
    )
    probe = {
        "marker": Path("data/marker.txt").read_text().strip(),
        "helper": shapes.VERSION,
        "cwd": os.getcwd(),
        "files": files,
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "digest": os.environ.get("DDPJOB_WORKDIR_DIGEST", ""),
    }
    print(json.dumps({"workdir_probe": probe}), flush=True)
    return shapes.task()
'''

SHAPES = '''\
"""The project's own helper module: a tiny regression the trainer runs."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

VERSION = "{version}"


class Line:
    def build_model(self):
        return nn.Linear(4, 1)

    def build_datasets(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 4, generator=g)
        y = x.sum(dim=1, keepdim=True)
        return TensorDataset(x, y), TensorDataset(x[:32], y[:32])

    def loss(self, model, batch):
        x, y = batch
        return F.mse_loss(model(x), y), {{}}


def task():
    return Line()
'''


def make_project(root: Path, version: str = "v1") -> Path:
    """The user's project: a git repository with a package, data, an ignored secret."""
    files = {
        ".gitignore": "secret.txt\n",
        "secret.txt": "do not ship\n",
        "mypkg/__init__.py": "",
        "mypkg/tasks.py": TASK,
        "mypkg/shapes.py": SHAPES.format(version=version),
        "data/marker.txt": f"{version}\n",
    }
    return git_repository(root, files)


#: What reaches every pod of make_project's folder: not .git, not secret.txt.
SHIPPED = [".ddpjob-digest", ".gitignore", "data/marker.txt", "mypkg/__init__.py"]
SHIPPED += ["mypkg/shapes.py", "mypkg/tasks.py"]


def _spec(cluster, tmp_path: Path, name: str, namespace: str, project: Path, api: str) -> Path:
    # A PyTorchJob keeps every pod: it succeeds when its master does, and under the default
    # clean_pod_policy (Running) a worker still exiting then is deleted with the log read below.
    keep = {"clean_pod_policy": "None"} if api == "pytorchjob" else {}
    return write_spec(
        cluster, tmp_path, name, namespace, api=api, max_steps=6, every_steps=0,
        workdir=str(project),
        trainer={"task": "mypkg.tasks:build", "task_args": {}, "batch_size": 16,
                 "resume": "never"},  # each submit trains its 6 steps, edited or not
        **keep,
    )  # fmt: skip


def _pod_logs(cluster, name: str, namespace: str, api: str) -> list[str]:
    """Each pod's log (its trainer container), rank 0's first."""
    if api == "trainjob":
        selector, container = f"{JOBSET_NAME}={name}", kubeflow.TRAINJOB_CONTAINER
    else:
        selector, container = f"training.kubeflow.org/job-name={name}", kubeflow.CONTAINER
    pods = cluster.get_json("pods", "-n", namespace, "-l", selector)["items"]
    pods.sort(key=lambda p: ("master" not in p["metadata"]["name"], p["metadata"]["name"]))
    return [
        cluster.kubectl("logs", p["metadata"]["name"], "-n", namespace, "-c", container).stdout
        for p in pods
    ]


def _probes(log: str) -> list[dict]:
    """The probe lines of one pod's log, read past the rank's name that torchrun's processes'
    lines carry (a TrainJob's)."""
    lines = [split_rank(line)[1] for line in log.splitlines()]
    return [json.loads(x)["workdir_probe"] for x in lines if x.startswith('{"workdir_probe"')]


def _job(cluster, name: str, namespace: str, api: str) -> dict:
    plural = "trainjobs" if api == "trainjob" else "pytorchjobs"
    return cluster.get_json(plural, name, "-n", namespace)


def _config_map(cluster, name: str, namespace: str) -> dict | None:
    return cluster.get_json("configmap", f"{name}-workdir", "-n", namespace, missing_ok=True)


def _submit_and_check(cluster, spec: Path, name: str, namespace: str, api: str, version: str):
    """Submit and wait; every pod ran this version of the project, as shipped, in /workdir.
    The job's digest annotation, for the caller to compare."""
    r = ddpjob(cluster, "submit", str(spec), "--replace", "--wait", "--timeout", "400", timeout=450)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("workdir: ")]
    assert f"-> ConfigMap {namespace}/{name}-workdir" in line and "5 files" in line, line
    logs = _pod_logs(cluster, name, namespace, api)
    assert len(logs) == 2, logs
    digest = _job(cluster, name, namespace, api)["metadata"]["annotations"][
        kubeflow.ANNOTATION_WORKDIR_DIGEST
    ]
    for log in logs:
        (probe,) = _probes(log)
        assert probe["marker"] == version and probe["helper"] == version, probe
        assert probe["cwd"] == kubeflow.WORKDIR_PATH, probe
        assert probe["files"] == SHIPPED, probe  # no .git, no secret.txt
        assert probe["pythonpath"].split(":")[0] == kubeflow.WORKDIR_PATH, probe
        assert probe["digest"] == digest, probe
    (start,) = events(logs[0], "start")
    assert start["world_size"] == 2
    (done,) = events(logs[0], "done")
    assert (done["reason"], done["step"]) == ("completed", 6)
    return digest


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_a_project_folder_runs_with_the_stock_image_and_an_edit_reaches_the_next_submit(
    cluster, namespace, tmp_path, api
):
    name = f"wd-{api[:5]}"
    project = make_project(tmp_path / "project")
    spec = _spec(cluster, tmp_path, name, namespace, project, api)
    first = _submit_and_check(cluster, spec, name, namespace, api, "v1")

    # The ConfigMap is the job's: owned by it, so it goes when the job goes.
    job = _job(cluster, name, namespace, api)
    cm = _config_map(cluster, name, namespace)
    assert cm is not None and cm["immutable"] is True
    (owner,) = cm["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        job["kind"], name, job["metadata"]["uid"],
    )  # fmt: skip
    assert job["metadata"]["annotations"][kubeflow.ANNOTATION_WORKDIR_DIRTY] == "false"

    # An edit, not committed: the next submit runs it, and says the tree was dirty.
    (project / "data" / "marker.txt").write_text("v2\n")
    (project / "mypkg" / "shapes.py").write_text(SHAPES.format(version="v2"))
    second = _submit_and_check(cluster, spec, name, namespace, api, "v2")
    assert second != first
    job = _job(cluster, name, namespace, api)
    assert job["metadata"]["annotations"][kubeflow.ANNOTATION_WORKDIR_DIRTY] == "true"

    st = json.loads(ddpjob(cluster, "status", name, "-n", namespace, "-o", "json").stdout)
    assert st["workdir"]["digest"] == second and st["workdir"]["dirty"] is True, st
    listed = ddpjob(cluster, "list", "-n", namespace, "-o", "wide").stdout
    assert f"{second[:19]} git " in listed and "(dirty)" in listed, listed
    goodput = ddpjob(cluster, "goodput", name, "-n", namespace).stdout
    assert f"code: workdir {second[:19]} git " in goodput, goodput

    r = ddpjob(cluster, "delete", name, "-n", namespace, "--wait", timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    deadline = time.monotonic() + 60  # the garbage collector follows the job's deletion
    while _config_map(cluster, name, namespace) is not None:
        assert time.monotonic() < deadline, "the job's ConfigMap outlived it by 60 s"
        time.sleep(0.5)


def test_an_oversized_folder_exits_2_and_creates_nothing(cluster, namespace, tmp_path):
    name = "wd-big"
    project = make_project(tmp_path / "project")
    (project / "data" / "big.bin").write_bytes(os.urandom(1_500_000))
    spec = _spec(cluster, tmp_path, name, namespace, project, "pytorchjob")
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 2, r.stdout + r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"error: workdir: {project} packs to 1.4 MiB, over the ")
    assert "largest: data/big.bin (1.4 MiB)" in line and "workdir_store: s3://" in line
    left = cluster.kubectl("get", "pytorchjobs,configmaps", "-n", namespace, "-o", "name").stdout
    assert name not in left, left


def test_a_refused_configmap_takes_the_job_back(cluster, namespace, tmp_path):
    """A quota that allows no more ConfigMaps: the job was created first (the ConfigMap names it
    as its owner), so submit deletes it again and says why; nothing of the submit is left."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-configmaps", "namespace": namespace},
        "spec": {"hard": {"count/configmaps": "1"}},  # kube-root-ca.crt is the one
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(quota))
    name = "wd-quota"
    spec = _spec(cluster, tmp_path, name, namespace, make_project(tmp_path / "p"), "pytorchjob")
    r = ddpjob(cluster, "submit", str(spec), "--no-preflight")
    assert r.returncode != 0, r.stdout + r.stderr
    assert f"ConfigMap {namespace}/{name}-workdir" in r.stderr and "quota" in r.stderr, r.stderr
    deadline = time.monotonic() + 60
    while name in cluster.kubectl("get", "pytorchjobs", "-n", namespace, "-o", "name").stdout:
        assert time.monotonic() < deadline, "the job outlived its refused ConfigMap by 60 s"
        time.sleep(0.5)


def test_a_digest_mismatch_fails_the_job_and_wait_says_so(cluster, namespace, tmp_path):
    """The job names one archive, its ConfigMap holds another (made by hand, as a stale or
    tampered copy would be): the container refuses it before the user's code starts, exit 2,
    which the operator does not retry, and ``wait`` explains the failed pod with its line."""
    from controller.workdir import pack

    name = "wd-mismatch"
    project = make_project(tmp_path / "project")
    spec = _spec(cluster, tmp_path, name, namespace, project, "pytorchjob")
    rendered = ddpjob(cluster, "render", str(spec), "-o", "json")
    assert rendered.returncode == 0, rendered.stderr
    (project / "data" / "marker.txt").write_text("tampered\n")
    other = tmp_path / "other.tar.gz"
    with pack(project) as archive:
        other.write_bytes(archive.read_bytes())
    cluster.kubectl(
        "create", "configmap", f"{name}-workdir", "-n", namespace,
        f"--from-file=workdir.tar.gz={other}",
    )  # fmt: skip
    cluster.kubectl("create", "-f", "-", input_text=rendered.stdout)
    r = ddpjob(cluster, "wait", name, "-n", namespace, "--timeout", "300", timeout=330)
    assert r.returncode == 1, r.stdout + r.stderr
    text = r.stdout + r.stderr
    assert "exit code 2 (Error, bad command-line or config)" in text, text
    assert "workdir: the archive's digest is sha256:" in text and ", the job names " in text, text


def _client_env(cluster, secret_key: str | None = None) -> dict[str, str]:
    """This machine's environment for an upload to the local cluster's S3 server (its host
    endpoint), as a user's AWS_* would be; ``secret_key``: a wrong one instead."""
    from localkube.addons import s3

    creds = s3.credentials(cluster.control_plane.state_dir)
    if secret_key is not None:
        creds["AWS_SECRET_ACCESS_KEY"] = secret_key
    return {**cluster.env, **creds, "AWS_ENDPOINT_URL": s3.HOST_ENDPOINT, "AWS_REGION": s3.REGION}


def _cli(env: dict[str, str], *args: str, timeout: float = 450) -> subprocess.CompletedProcess:
    import sys

    from tests.e2e.helpers import REPO

    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def test_an_object_store_uploads_once_and_every_pod_fetches_it(cluster, namespace, tmp_path):
    """workdir_store: s3://... on the cluster's S3 server: the archive goes up once (a second
    submit of the same files finds it), the pods fetch it with the spec's credentials; a store
    that refuses this machine's upload stops submit before anything is created."""
    from localkube.addons import s3
    from tests.e2e.helpers import s3_checkpoints

    name = "wd-s3"
    project = make_project(tmp_path / "project")
    store = f"s3://{s3.BUCKET}/{namespace}/workdir"
    fields = s3_checkpoints(cluster, namespace, name, {}, every_steps=0)
    spec = write_spec(
        cluster, tmp_path, name, namespace, max_steps=6, workdir=str(project),
        workdir_store=store, **{k: v for k, v in fields.items() if k != "trainer"},
        trainer={**fields["trainer"], "task": "mypkg.tasks:build", "task_args": {},
                 "batch_size": 16, "resume": "never"},
        clean_pod_policy="None",  # every pod's log is read below (see _spec)
    )  # fmt: skip

    wrong = _cli(_client_env(cluster, secret_key="wrong"), "submit", str(spec))
    assert wrong.returncode == 2, wrong.stdout + wrong.stderr
    (line,) = [x for x in wrong.stderr.splitlines() if x.startswith("error:")]  # preflight's too
    assert line.startswith(f"error: workdir_store: {store} refused the upload ("), line
    assert name not in cluster.kubectl("get", "pytorchjobs", "-n", namespace, "-o", "name").stdout

    for verdict in ("uploaded", "already there"):
        r = _cli(_client_env(cluster), "submit", str(spec), "--replace", "--wait",
                 "--timeout", "400")  # fmt: skip
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        (line,) = [x for x in r.stdout.splitlines() if x.startswith("workdir: ")]
        assert f"-> {store}/" in line and line.endswith(f".tar.gz ({verdict})"), line
        logs = _pod_logs(cluster, name, namespace, "pytorchjob")
        assert len(logs) == 2, logs
        for log in logs:
            (probe,) = _probes(log)
            assert probe["marker"] == "v1" and probe["files"] == SHIPPED, probe
    assert _config_map(cluster, name, namespace) is None


def test_helm_install_of_render_values_runs_the_same_job(cluster, namespace, tmp_path):
    """`render --values` carries the archive; `helm install` creates the ConfigMap (the
    release's) and the job, whose pods run the project; `helm uninstall` removes both."""
    from tests.e2e.helpers import REPO

    name = "wd-helm"
    project = make_project(tmp_path / "project")
    spec = _spec(cluster, tmp_path, name, namespace, project, "trainjob")
    values = ddpjob(cluster, "render", str(spec), "--values")
    assert values.returncode == 0, values.stderr
    assert "the values (the chart's ConfigMap wd-helm-workdir)" in values.stderr
    (tmp_path / "values.yaml").write_text(values.stdout)
    chart = str(REPO / "charts" / "ddpjob")
    cluster.helm("install", name, chart, "-n", namespace, "-f", str(tmp_path / "values.yaml"))
    try:
        w = ddpjob(cluster, "wait", name, "-n", namespace, "--timeout", "400", timeout=420)
        assert w.returncode == 0, w.stdout + w.stderr
        for log in _pod_logs(cluster, name, namespace, "trainjob"):
            (probe,) = _probes(log)
            assert probe["marker"] == "v1" and probe["files"] == SHIPPED, probe
        assert _config_map(cluster, name, namespace) is not None
    finally:
        cluster.helm("uninstall", name, "-n", namespace, "--wait", check=False)
    assert _config_map(cluster, name, namespace) is None
