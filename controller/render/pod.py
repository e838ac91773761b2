"""The pod of a training job, as both job APIs carry it: labels, the training container, its
resources, env, volumes and the restricted security context.

Pure: spec in, plain dict out. ``pytorchjob.py`` wraps :func:`pod_template` in Master/Worker
replicas; ``trainjob.py`` puts the container's pieces into ``spec.trainer`` and the same
:func:`pod_metadata` and :func:`pod_spec` into its runtime patch. No key ever carries null:
optional fields are left out.
"""

from __future__ import annotations

from typing import Any

from controller.kubeflow import (
    CONTAINER,
    DEFAULT_COMMAND,
    LABEL_PRIORITY_CLASS,
    LABEL_QUEUE,
    PORT,
    PORT_NAME,
    TRAINER_UID,
)
from controller.render.args import trainer_args
from controller.spec import JobSpec
from trainer.contract import (
    GRACE_PERIOD_ENV,
    IMAGE_ENV,
    JOB_API_ENV,
    JOB_NAME_ENV,
    NAMESPACE_ENV,
    NODE_NAME_ENV,
)

# Standard labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/)
LABEL_NAME = "app.kubernetes.io/name"  # the application: always ddpjob
LABEL_INSTANCE = "app.kubernetes.io/instance"  # this job: the spec's name
LABEL_COMPONENT = "app.kubernetes.io/component"  # the part of ddpjob: the trainer
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"  # ddpjob here, Helm in the chart


# With a queue, ``priority_class`` is Kueue's WorkloadPriorityClass (LABEL_PRIORITY_CLASS), not
# the pods' PriorityClass: Kueue's KEP-973 advises against pod priority for workload priority,
# and a TrainJob cannot set it.


def job_labels(spec: JobSpec) -> dict[str, str]:
    """Labels on the job: the standard ones, the Kueue queue and priority, then the user's."""
    # The queue label goes on the job only: on pods, Kueue's pod integration could admit them
    # one by one.
    queue = {LABEL_QUEUE: spec.queue} if spec.queue else {}
    if spec.queue and spec.priority_class:
        queue[LABEL_PRIORITY_CLASS] = spec.priority_class
    return {**standard_labels(spec), **queue, **spec.labels}


def suspended(spec: JobSpec) -> bool:
    """A job with a queue is created suspended: Kueue starts it when the queue admits it (its
    webhook would suspend it anyway; said here, the manifest shows what will happen)."""
    return spec.suspend or bool(spec.queue)


def pod_priority_class(spec: JobSpec) -> str | None:
    """The pods' PriorityClass: ``priority_class`` unless a queue makes it Kueue's."""
    return None if spec.queue else spec.priority_class


def pod_labels(spec: JobSpec) -> dict[str, str]:
    """Labels on every pod: the standard ones and the user's (`kubectl get pods -l ...`)."""
    return {**standard_labels(spec), **spec.labels}


def standard_labels(spec: JobSpec) -> dict[str, str]:
    """The app.kubernetes.io labels of everything the job is made of."""
    return {
        LABEL_NAME: "ddpjob",
        LABEL_INSTANCE: spec.name,
        LABEL_COMPONENT: "trainer",
        LABEL_PART_OF: "ddpjob",
        LABEL_MANAGED_BY: "ddpjob",
    }


#: The annotations a Prometheus' ``kubernetes-pods`` scrape job reads (the Prometheus community's
#: convention; the local cluster's Prometheus reads them too).
SCRAPE, PORT_ANNOTATION, PATH = "prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path"
METRICS_PATH = "/metrics"


def metrics_port(spec: JobSpec) -> int | None:
    """The port every pod serves its ranks' metrics on (None: the trainer serves none)."""
    prometheus = spec.trainer.prometheus
    return None if prometheus.serve is False else prometheus.port


def pod_annotations(spec: JobSpec) -> dict[str, str]:
    """The pods' prometheus.io annotations where the trainer serves metrics, then the user's."""
    port = metrics_port(spec)
    if port is None:
        return dict(spec.annotations)
    scrape = {SCRAPE: "true", PORT_ANNOTATION: str(port), PATH: METRICS_PATH}
    return {**scrape, **spec.annotations}


def job_metadata(spec: JobSpec) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": job_labels(spec),
    }
    if spec.annotations:
        meta["annotations"] = dict(spec.annotations)
    return meta


def pod_template(spec: JobSpec, rank0: bool = True) -> dict[str, Any]:
    """A PyTorchJob replica's pod: the one training container, whole; ``rank0``: the pod rank 0
    runs in, which mounts the ``rank0_only`` volumes too."""
    return {"metadata": pod_metadata(spec), "spec": pod_spec(spec, container(spec, rank0), rank0)}


def pod_metadata(spec: JobSpec) -> dict[str, Any]:
    """Every pod's labels (the standard ones and the user's) and annotations (the scrape's,
    then the user's)."""
    meta: dict[str, Any] = {"labels": pod_labels(spec)}
    if pod_annotations(spec):
        meta["annotations"] = pod_annotations(spec)
    return meta


def pod_spec(spec: JobSpec, training: dict[str, Any], rank0: bool = True) -> dict[str, Any]:
    """The pod-level fields of both APIs' pods, in one order, around the ``training`` container
    (a PyTorchJob's whole container; for a TrainJob, what patches its runtime's). A TrainJob's
    spec never sets what a TrainJob cannot carry (a pod priority class, gang scheduling):
    ``controller.spec`` refuses it."""
    pod: dict[str, Any] = {}
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account
    if pod_priority_class(spec):
        pod["priorityClassName"] = pod_priority_class(spec)
    if spec.gang and spec.gang.scheduler_name:
        pod["schedulerName"] = spec.gang.scheduler_name
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = tolerations(spec)
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = image_pull_secrets(spec)
    if spec.grace_period_s is not None:
        pod["terminationGracePeriodSeconds"] = spec.grace_period_s
    pod["securityContext"] = pod_security_context()
    pod["containers"] = [training]
    pod["volumes"] = volumes(spec, rank0)
    return pod


def pod_security_context() -> dict[str, Any]:
    """The pod's half of the restricted Pod Security profile, as the image's user."""
    return {
        "runAsNonRoot": True,
        "runAsUser": TRAINER_UID,
        "runAsGroup": TRAINER_UID,
        "fsGroup": TRAINER_UID,  # PVCs are writable by the trainer's user
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """The container's half of the restricted profile."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }


def tolerations(spec: JobSpec) -> list[dict[str, Any]]:
    return [_toleration(t) for t in spec.tolerations]


def image_pull_secrets(spec: JobSpec) -> list[dict[str, str]]:
    return [{"name": n} for n in spec.image_pull_secrets]


def _toleration(t: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if t.key is not None:
        out["key"] = t.key
    out["operator"] = t.operator
    if t.value is not None:
        out["value"] = t.value
    if t.effect is not None:
        out["effect"] = t.effect
    if t.toleration_s is not None:
        out["tolerationSeconds"] = t.toleration_s
    return out


def container(spec: JobSpec, rank0: bool = True) -> dict[str, Any]:
    """The one training container, named ``pytorch`` with the port the operator looks up."""
    c: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "command": container_command(spec),
    }
    args = container_args(spec)
    if args:
        c["args"] = args
    env = container_env(spec)
    if env:
        c["env"] = env
    c["ports"] = [{"name": PORT_NAME, "containerPort": PORT}]
    c["resources"] = resources(spec)
    c["securityContext"] = container_security_context()
    c["volumeMounts"] = volume_mounts(spec, rank0)
    return c


def container_command(spec: JobSpec) -> list[str]:
    return list(spec.command or DEFAULT_COMMAND)


def container_args(spec: JobSpec) -> list[str]:
    """The spec's args, else its trainer settings as ``key=value`` strings."""
    return list(spec.args) if spec.args is not None else trainer_args(spec.trainer)


def container_env(spec: JobSpec) -> list[dict[str, Any]]:
    """What the trainer reads of its pod and job: its node (which the ``stuck`` and
    ``straggler`` events name), the job's name, namespace, API and image (the metrics' labels,
    the MLflow run's name and tags); first, so the user's values may say ``$(NODE_NAME)``, and
    each not where the user sets it. Then the user's env in the spec's order, Secret references
    (never their values), and the grace period for the trainer, where the spec sets one."""
    own = {
        NODE_NAME_ENV: {"valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        JOB_NAME_ENV: {"value": spec.name},
        NAMESPACE_ENV: {"valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        JOB_API_ENV: {"value": spec.api},
        IMAGE_ENV: {"value": spec.image},
    }
    env: list[dict[str, Any]] = [
        {"name": name, **source}
        for name, source in own.items()
        if name not in spec.env and name not in spec.secret_env
    ]
    env += [{"name": k, "value": v} for k, v in spec.env.items()]
    for name, ref in spec.secret_env.items():
        env.append(
            {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
        )
    if spec.grace_period_s is not None:
        env.append({"name": GRACE_PERIOD_ENV, "value": str(spec.grace_period_s)})
    return env


def resources(spec: JobSpec) -> dict[str, Any]:
    r = spec.resources
    limits: dict[str, Any] = {}
    if r.gpus > 0:
        limits["nvidia.com/gpu"] = r.gpus
    limits["cpu"] = r.cpu
    limits["memory"] = r.memory
    return {"limits": limits, "requests": {"cpu": r.cpu, "memory": r.memory}}


def mounted(spec: JobSpec, rank0: bool = True) -> list[Any]:
    """The spec's volumes on a pod: all on rank 0's, all but the ``rank0_only`` ones elsewhere."""
    return [v for v in spec.volumes if rank0 or not v.rank0_only]


def volumes(spec: JobSpec, rank0: bool = True) -> list[dict[str, Any]]:
    vols: list[dict[str, Any]] = [
        # NCCL and DataLoader workers share memory through /dev/shm; the runtime gives 64Mi.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
        # A writable scratch dir (torch.compile caches, tempfiles) for the non-root user.
        {"name": "tmp", "emptyDir": {}},
    ]
    for v in mounted(spec, rank0):
        vols.append({"name": v.name, "persistentVolumeClaim": {"claimName": v.claim}})
    return vols


def volume_mounts(spec: JobSpec, rank0: bool = True) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    for v in mounted(spec, rank0):
        m: dict[str, Any] = {"name": v.name, "mountPath": v.mount_path}
        if v.sub_path:
            m["subPath"] = v.sub_path
        if v.read_only:
            m["readOnly"] = True
        mounts.append(m)
    return mounts
