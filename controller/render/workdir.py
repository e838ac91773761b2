"""A shipped working directory in a rendered job: the same pods, plus the folder at /workdir.

Pure: the job ``pytorchjob.py`` or ``trainjob.py`` rendered, the spec and what was packed
(``controller.workdir.Shipped``: the digest and where the archive is) in; the job with the
workdir out. Render never reads the folder: the CLI packs it and hands the result over.

Every pod gets an emptyDir at ``/workdir`` (and, for the ConfigMap road, the job's ConfigMap
mounted read-only), and its training container's command becomes ``python -m trainer.workdir
SOURCE --digest D --into /workdir -- <command>``: it fetches the archive, checks its digest,
unpacks it, changes into ``/workdir`` and execs the command with its args, as PID 1. The
trainer's ``PYTHONPATH`` starts with ``/workdir`` (a PYTHONPATH in the spec's env follows);
``DDPJOB_WORKDIR_*`` tell it which code it runs, and the job's annotations (``ddpjob/workdir-*``)
tell status and list.

Why the container's own command and not an init container: a PyTorchJob's operator
(``restartPolicy: ExitCode``) reads a failed pod's exit code from the training container, and
one whose init container failed has none, which it counts as retryable: a pod whose archive does
not match would be re-created for ever. In the container, a mismatch is exit 2, which fails the
job at once and which wait and status explain with the line that says why. A TrainJob could not
have one of the job's image anyway: Trainer v2.3's runtimePatches patch a container by name with
env, volumeMounts and a securityContext only, never an image or a command, and set no
``workingDir``. A container restarted in place (the TrainJob
runtime's OnFailure) finds /workdir already unpacked and keeps it.
"""

from __future__ import annotations

import copy
from typing import Any

from controller.kubeflow import (
    ANNOTATION_WORKDIR_COMMIT,
    ANNOTATION_WORKDIR_DIGEST,
    ANNOTATION_WORKDIR_DIRTY,
    WORKDIR_ARCHIVE_PATH,
    WORKDIR_ARCHIVE_VOLUME,
    WORKDIR_PATH,
    WORKDIR_VOLUME,
)
from controller.spec import JobSpec
from controller.workdir import CONFIGMAP_KEY, Shipped
from trainer.contract import WORKDIR_COMMIT_ENV, WORKDIR_DIGEST_ENV, WORKDIR_DIRTY_ENV

#: The module the pods run to fetch, check and unpack the archive.
FETCH_COMMAND = ("python", "-m", "trainer.workdir")


def with_workdir(job: dict[str, Any], spec: JobSpec, shipped: Shipped) -> dict[str, Any]:
    """``job`` (as ``render_job`` gives it for ``spec``) with the shipped workdir in every pod."""
    job = copy.deepcopy(job)
    job["metadata"].setdefault("annotations", {}).update(annotations(shipped))
    if spec.api == "trainjob":
        _trainjob(job["spec"], shipped)
    else:
        for replica in job["spec"]["pytorchReplicaSpecs"].values():
            _pytorchjob_pod(replica["template"]["spec"], shipped)
    return job


def config_map_of(job: dict[str, Any]) -> str | None:
    """The ConfigMap a rendered job's pods read their workdir from, if any (either API)."""
    if job["kind"] == "TrainJob":
        (patch,) = job["spec"].get("runtimePatches", [{}])[:1] or [{}]
        jobs = patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {})
        pods = [r["template"]["spec"]["template"]["spec"] for r in jobs.get("replicatedJobs", [])]
    else:
        pods = [r["template"]["spec"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    for pod in pods:
        for v in pod.get("volumes", []):
            if v["name"] == WORKDIR_ARCHIVE_VOLUME and "configMap" in v:
                return v["configMap"]["name"]
    return None


def annotations(shipped: Shipped) -> dict[str, str]:
    """The job's record of which code it runs."""
    out = {ANNOTATION_WORKDIR_DIGEST: shipped.digest}
    if shipped.commit:
        out[ANNOTATION_WORKDIR_COMMIT] = shipped.commit
    if shipped.dirty is not None:
        out[ANNOTATION_WORKDIR_DIRTY] = "true" if shipped.dirty else "false"
    return out


def source(shipped: Shipped) -> str:
    """Where the pod reads the archive: the ConfigMap's file, or the object's URL."""
    if shipped.url:
        return shipped.url
    return f"{WORKDIR_ARCHIVE_PATH}/{CONFIGMAP_KEY}"


def fetch_command(shipped: Shipped) -> list[str]:
    return [*FETCH_COMMAND, source(shipped), "--digest", shipped.digest, "--into", WORKDIR_PATH]


def env(
    shipped: Shipped, user_env: list[dict[str, Any]], path: str = WORKDIR_PATH
) -> list[dict[str, Any]]:
    """``user_env`` (the container's, in order) with PYTHONPATH headed by ``path`` (in the
    user's place where they set one) and the trainer's ``DDPJOB_WORKDIR_*`` after it."""
    out, found = [], False
    for entry in user_env:
        if entry["name"] == "PYTHONPATH" and "value" in entry:
            entry = {**entry, "value": f"{path}:{entry['value']}"}
            found = True
        out.append(entry)
    if not found:
        out.append({"name": "PYTHONPATH", "value": path})
    out.append({"name": WORKDIR_DIGEST_ENV, "value": shipped.digest})
    if shipped.commit:
        out.append({"name": WORKDIR_COMMIT_ENV, "value": shipped.commit})
    if shipped.dirty is not None:
        out.append({"name": WORKDIR_DIRTY_ENV, "value": "true" if shipped.dirty else "false"})
    return out


def volumes(shipped: Shipped) -> list[dict[str, Any]]:
    vols: list[dict[str, Any]] = [{"name": WORKDIR_VOLUME, "emptyDir": {}}]
    if shipped.config_map:
        vols.append(
            {"name": WORKDIR_ARCHIVE_VOLUME, "configMap": {"name": shipped.config_map}},
        )
    return vols


def mounts(shipped: Shipped) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": WORKDIR_VOLUME, "mountPath": WORKDIR_PATH}]
    if shipped.config_map:
        out.append(
            {"name": WORKDIR_ARCHIVE_VOLUME, "mountPath": WORKDIR_ARCHIVE_PATH, "readOnly": True}
        )
    return out


def _pytorchjob_pod(pod: dict[str, Any], shipped: Shipped) -> None:
    (trainer,) = pod["containers"]
    trainer["command"] = [*fetch_command(shipped), "--", *trainer["command"]]
    trainer["env"] = env(shipped, trainer.get("env", []))
    trainer["volumeMounts"] += mounts(shipped)
    pod["volumes"] += volumes(shipped)


def _trainjob(job_spec: dict[str, Any], shipped: Shipped) -> None:
    trainer = job_spec["trainer"]
    trainer["command"] = [*fetch_command(shipped), "--", *trainer["command"]]
    trainer["env"] = env(shipped, trainer["env"])
    (patch,) = job_spec["runtimePatches"]
    (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = replicated["template"]["spec"]["template"]["spec"]
    (node,) = pod["containers"]
    node["volumeMounts"] += mounts(shipped)
    pod["volumes"] += volumes(shipped)
