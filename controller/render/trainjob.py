"""Render a JobSpec into the Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1,
Trainer v2.3) that runs on a torch ClusterTrainingRuntime.

Pure: the same spec gives the same dict, key order included. The Helm chart renders the identical
object from ``render --values`` (``api: trainjob``); a test holds them equal. Shape decisions, with
the Trainer source they follow:

- ``spec.trainer`` carries what the TrainJob API has fields for: image, command, args, env (the
  user's, then Secret references), numNodes, numProcPerNode (an int: the torch plugin's "auto"
  would count CPUs) and resourcesPerNode (limits = requests, as for the PyTorchJob). The plugin
  merges them into the runtime's ``node`` container and adds PET_NNODES, PET_NPROC_PER_NODE,
  PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT and port 29500 itself.
- ``PYTHONUNBUFFERED=1`` comes first in env: the training operator v1 sets it in every pod,
  Trainer v2 does not, and a block-buffered stdout would hold rank 0's lines back from ``logs -f``.
- Everything else the pod needs goes into one ``runtimePatches`` entry (manager ``ddpjob/spec``),
  a strategic merge into the runtime's JobSet template, which reaches only: pod labels and
  annotations, serviceAccountName, nodeSelector, tolerations, imagePullSecrets,
  terminationGracePeriodSeconds, the pod and container securityContext, volumes and the
  container's volumeMounts (/dev/shm, /tmp, PVCs).
- Job labels: the standard ones, the Kueue queue and, with it, the WorkloadPriorityClass (on the
  TrainJob only, as Kueue's TrainJob integration reads them), then the user's. Pods get the
  standard and user labels through the patch.
- ``suspend`` and ``activeDeadlineSeconds`` are the TrainJob's own fields; with a queue the
  TrainJob is created suspended and Kueue starts it.
- What a TrainJob cannot carry (elastic, gang, priority class without a queue, restart policy,
  backoff limit, TTL, clean pod policy) never reaches here: ``controller.spec`` refuses it,
  saying why.
- No key ever carries null: optional fields are left out.
"""

from __future__ import annotations

from typing import Any

from controller.kubeflow import (
    CLUSTER_TRAINING_RUNTIME,
    RUNTIME_PATCH_MANAGER,
    TRAINJOB,
    TRAINJOB_CONTAINER,
    TRAINJOB_REPLICATED_JOB,
)
from controller.render.pod import (
    container_args,
    container_command,
    container_env,
    container_security_context,
    job_metadata,
    pod_metadata,
    pod_spec,
    resources,
    suspended,
    volume_mounts,
)
from controller.spec import JobSpec

#: Set first in the trainer's env, as the training operator v1 does in every pod.
UNBUFFERED = {"name": "PYTHONUNBUFFERED", "value": "1"}


def render_trainjob(spec: JobSpec) -> dict[str, Any]:
    """The TrainJob for ``spec`` as a plain dict, ready for ``yaml.safe_dump`` or the API."""
    assert spec.api == "trainjob", "render_trainjob takes a spec with api: trainjob"
    return {
        "apiVersion": TRAINJOB.api_version,
        "kind": TRAINJOB.kind,
        "metadata": job_metadata(spec),
        "spec": job_spec(spec),
    }


def job_spec(spec: JobSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "runtimeRef": {
            "name": spec.runtime,
            "apiGroup": CLUSTER_TRAINING_RUNTIME.group,
            "kind": CLUSTER_TRAINING_RUNTIME.kind,
        },
        "trainer": trainer(spec),
        "runtimePatches": [runtime_patch(spec)],
        "suspend": suspended(spec),
    }
    if spec.active_deadline_s is not None:
        out["activeDeadlineSeconds"] = spec.active_deadline_s
    return out


def trainer(spec: JobSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "image": spec.image,
        "command": container_command(spec),
    }
    args = container_args(spec)
    if args:
        out["args"] = args
    out["env"] = [dict(UNBUFFERED), *container_env(spec)]
    out["numNodes"] = spec.nodes
    out["numProcPerNode"] = spec.nproc_per_node
    out["resourcesPerNode"] = resources(spec)
    return out


def runtime_patch(spec: JobSpec) -> dict[str, Any]:
    """The pod settings the TrainJob API has no field for, patched into replicated job node:
    the pod-level fields of ``pod.py``, around a patch of the runtime's ``node`` container."""
    node = {
        "name": TRAINJOB_CONTAINER,
        "securityContext": container_security_context(),
        "volumeMounts": volume_mounts(spec),
    }
    pod = {"metadata": pod_metadata(spec), "spec": pod_spec(spec, node)}
    replicated_job = {"name": TRAINJOB_REPLICATED_JOB, "template": {"spec": {"template": pod}}}
    return {
        "manager": RUNTIME_PATCH_MANAGER,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated_job]}}},
    }
