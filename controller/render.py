"""Render a JobSpec into the Kubeflow PyTorchJob (kubeflow.org/v1) the training operator runs.

Pure: the same spec gives the same dict, key order included. No clock, no randomness, no API.
The Helm chart (charts/ddpjob) renders the identical object from ``render --values``; a test holds
them equal. Shape decisions, with the operator source they follow:

- Replicas: a ``Master`` (1) and ``nodes - 1`` ``Worker`` (omitted when nodes == 1). The operator
  injects MASTER_ADDR/RANK/WORLD_SIZE only when a Master exists.
- Elastic: ``Worker`` replicas only (= nodes), no Master. The operator's rendezvous endpoint is
  ``<name>-worker-0:<pytorchjob-port>`` and min/maxReplicas (and its HPA / scale subresource)
  count Worker pods, so a Master would sit outside the elastic range. ``elasticPolicy`` carries
  minReplicas, maxReplicas, rdzvBackend c10d and maxRestarts; *not* ``nProcPerNode``: it is
  deprecated and the operator's webhook rejects it beside ``spec.nprocPerNode``.
- ``spec.nprocPerNode`` is a string (the v1 field is ``*string``).
- No key ever carries null: optional fields are left out.
- Trainer settings become args: sorted ``key=value`` with dotted keys for sections, values written
  as YAML scalars/flow collections that ``python -m trainer`` (yaml.safe_load) reads back to the
  same value (see :func:`trainer_args`).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel

from controller.spec import JobSpec

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER_NAME = "pytorch"  # the operator finds the training container by this name
PORT_NAME = "pytorchjob-port"  # ... and MASTER_PORT / the rendezvous port by this port name
PORT = 23456  # the operator's default
DEFAULT_COMMAND = ("python", "-m", "trainer")
UID = 1000  # the trainer image's non-root user

# Standard labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/)
LABEL_NAME = "app.kubernetes.io/name"  # the application: always ddpjob
LABEL_INSTANCE = "app.kubernetes.io/instance"  # this job: the spec's name
LABEL_COMPONENT = "app.kubernetes.io/component"  # the part of ddpjob: the trainer
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"  # ddpjob here, Helm in the chart
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"  # Kueue admits the job through this LocalQueue


def render_pytorchjob(spec: JobSpec) -> dict[str, Any]:
    """The PyTorchJob for ``spec`` as a plain dict, ready for ``yaml.safe_dump`` or the API."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": job_metadata(spec),
        "spec": job_spec(spec),
    }


def job_labels(spec: JobSpec) -> dict[str, str]:
    """Labels on the PyTorchJob: the standard ones, the Kueue queue, then the user's."""
    # The queue label goes on the job only: on pods, Kueue's pod integration could admit them
    # one by one.
    queue = {LABEL_QUEUE: spec.queue} if spec.queue else {}
    return {**_standard_labels(spec), **queue, **spec.labels}


def pod_labels(spec: JobSpec) -> dict[str, str]:
    """Labels on every pod: the standard ones and the user's (`kubectl get pods -l ...`)."""
    return {**_standard_labels(spec), **spec.labels}


def _standard_labels(spec: JobSpec) -> dict[str, str]:
    return {
        LABEL_NAME: "ddpjob",
        LABEL_INSTANCE: spec.name,
        LABEL_COMPONENT: "trainer",
        LABEL_PART_OF: "ddpjob",
        LABEL_MANAGED_BY: "ddpjob",
    }


def job_metadata(spec: JobSpec) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": job_labels(spec),
    }
    if spec.annotations:
        meta["annotations"] = dict(spec.annotations)
    return meta


def job_spec(spec: JobSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"runPolicy": run_policy(spec)}
    if spec.elastic:
        out["elasticPolicy"] = elastic_policy(spec)
    out["nprocPerNode"] = str(spec.nproc_per_node)
    out["pytorchReplicaSpecs"] = replica_specs(spec)
    return out


def run_policy(spec: JobSpec) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "cleanPodPolicy": spec.clean_pod_policy,
        "backoffLimit": spec.backoff_limit,
    }
    if spec.active_deadline_s is not None:
        policy["activeDeadlineSeconds"] = spec.active_deadline_s
    if spec.ttl_after_finished_s is not None:
        policy["ttlSecondsAfterFinished"] = spec.ttl_after_finished_s
    policy["suspend"] = spec.suspend
    if spec.gang:
        default_min = spec.elastic.min_nodes if spec.elastic else spec.nodes
        scheduling: dict[str, Any] = {"minAvailable": spec.gang.min_available or default_min}
        if spec.queue:
            scheduling["queue"] = spec.queue
        if spec.priority_class:
            scheduling["priorityClass"] = spec.priority_class
        policy["schedulingPolicy"] = scheduling
    return policy


def elastic_policy(spec: JobSpec) -> dict[str, Any]:
    assert spec.elastic is not None
    return {
        "minReplicas": spec.elastic.min_nodes,
        "maxReplicas": spec.elastic.max_nodes,
        "rdzvBackend": "c10d",
        "maxRestarts": spec.elastic.max_restarts,
    }


def replica_specs(spec: JobSpec) -> dict[str, Any]:
    """Master (1) + Worker (nodes - 1); elastic: Worker (nodes) only. Each gets its own template."""
    replicas: dict[str, Any] = {}
    if not spec.elastic:
        replicas["Master"] = _replica(spec, 1)
    if spec.worker_replicas > 0:
        replicas["Worker"] = _replica(spec, spec.worker_replicas)
    return replicas


def _replica(spec: JobSpec, count: int) -> dict[str, Any]:
    # A fresh template per replica type: shared dicts would come out as YAML anchors.
    return {"replicas": count, "restartPolicy": spec.restart_policy, "template": pod_template(spec)}


def pod_template(spec: JobSpec) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": pod_labels(spec)}
    if spec.annotations:
        meta["annotations"] = dict(spec.annotations)
    return {"metadata": meta, "spec": pod_spec(spec)}


def pod_spec(spec: JobSpec) -> dict[str, Any]:
    pod: dict[str, Any] = {}
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account
    if spec.priority_class:
        pod["priorityClassName"] = spec.priority_class
    if spec.gang and spec.gang.scheduler_name:
        pod["schedulerName"] = spec.gang.scheduler_name
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [_toleration(t) for t in spec.tolerations]
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    pod["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "fsGroup": UID,  # PVCs are writable by the trainer's user
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod["containers"] = [container(spec)]
    pod["volumes"] = volumes(spec)
    return pod


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


def container(spec: JobSpec) -> dict[str, Any]:
    """The one training container, named ``pytorch`` with the port the operator looks up."""
    c: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "command": list(spec.command or DEFAULT_COMMAND),
    }
    args = spec.args if spec.args is not None else trainer_args(spec.trainer)
    if args:
        c["args"] = list(args)
    env = container_env(spec)
    if env:
        c["env"] = env
    c["ports"] = [{"name": PORT_NAME, "containerPort": PORT}]
    c["resources"] = resources(spec)
    c["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }
    c["volumeMounts"] = volume_mounts(spec)
    return c


def container_env(spec: JobSpec) -> list[dict[str, Any]]:
    """The user's env in the spec's order, then Secret references (never their values)."""
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in spec.env.items()]
    for name, ref in spec.secret_env.items():
        env.append(
            {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
        )
    return env


def resources(spec: JobSpec) -> dict[str, Any]:
    r = spec.resources
    limits: dict[str, Any] = {}
    if r.gpus > 0:
        limits["nvidia.com/gpu"] = r.gpus
    limits["cpu"] = r.cpu
    limits["memory"] = r.memory
    return {"limits": limits, "requests": {"cpu": r.cpu, "memory": r.memory}}


def volumes(spec: JobSpec) -> list[dict[str, Any]]:
    vols: list[dict[str, Any]] = [
        # NCCL and DataLoader workers share memory through /dev/shm; the runtime gives 64Mi.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
        # A writable scratch dir (torch.compile caches, tempfiles) for the non-root user.
        {"name": "tmp", "emptyDir": {}},
    ]
    for v in spec.volumes:
        vols.append({"name": v.name, "persistentVolumeClaim": {"claimName": v.claim}})
    return vols


def volume_mounts(spec: JobSpec) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    for v in spec.volumes:
        m: dict[str, Any] = {"name": v.name, "mountPath": v.mount_path}
        if v.sub_path:
            m["subPath"] = v.sub_path
        if v.read_only:
            m["readOnly"] = True
        mounts.append(m)
    return mounts


# --------------------------------------------------------------------------------------------
# Trainer settings -> args


def trainer_args(config: BaseModel) -> list[str]:
    """The settings the user set, as sorted ``key=value`` strings with dotted section keys.

    Only fields the spec set are passed (the trainer's defaults stay the trainer's). Each value is
    written so that ``yaml.safe_load`` in ``python -m trainer`` reads back exactly the value the
    spec validated: plain words stay plain, other strings are double-quoted, floats always carry a
    dot (PyYAML reads ``1e-05`` as a string), dicts and lists become YAML flow collections.
    """
    pairs = sorted(_flatten(config, ""))
    return [f"{key}={value}" for key, value in pairs]


def _flatten(model: BaseModel, prefix: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for name in model.model_fields_set:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out.extend(_flatten(value, f"{prefix}{name}."))
        else:
            out.append((prefix + name, encode_value(value)))
    return out


_PLAIN = re.compile(r"[A-Za-z_/][-A-Za-z0-9_./:@+]*")


def encode_value(value: Any, *, nested: bool = False) -> str:
    """``value`` as YAML text that ``yaml.safe_load`` turns back into ``value``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _encode_float(value)
    if isinstance(value, str):
        if not nested and _PLAIN.fullmatch(value) and _reads_back(value):
            return value
        return quote(value)
    if isinstance(value, dict):
        items = (f"{quote(str(k))}: {encode_value(v, nested=True)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(encode_value(v, nested=True) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__} as a trainer argument")


# Characters PyYAML reads literally inside double quotes; everything else is escaped. Line
# breaks (\x85, \u2028, \u2029) are printable but would be folded, so they are escaped too.
_YAML_LITERAL = re.compile("[\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def quote(text: str) -> str:
    """``text`` as a YAML double-quoted scalar that reads back to exactly ``text``."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif _YAML_LITERAL.match(ch):
            out.append(ch)
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def _encode_float(value: float) -> str:
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"  # YAML 1.1 floats need a dot: 1e-05 would read back as a string
    return mantissa + e + exponent


def _reads_back(text: str) -> bool:
    import yaml  # already imported by trainer.config; local to keep the module's top light

    try:
        return yaml.safe_load(text) == text
    except yaml.YAMLError:
        return False


# Plain scalars that YAML readers other than PyYAML take for something other than a string: Go's
# yaml (kubectl, helm) reads y/n as booleans and 1e-05, 0o17, 0b1, 1_000 as numbers. PyYAML
# would write them unquoted, so quote them ourselves.
_GO_NON_STRING = re.compile(
    r"""^(?:[yYnN]|[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"""
    r"""|[-+]?0[xX][0-9a-fA-F_]+|[-+]?0[oO][0-7_]+|[-+]?0[bB][01_]+|[-+]?\.(?:inf|Inf|INF)"""
    r"""|\.(?:nan|NaN|NAN)|~|null|Null|NULL|true|True|TRUE|false|False|FALSE"""
    r"""|yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF)$"""
)


def to_yaml(obj: Any) -> str:
    """Block-style YAML with the dict's own key order (what ``render -o yaml`` prints).

    Strings that Go's YAML would read as booleans or numbers are double-quoted, so
    ``render | kubectl apply -f -`` and ``render --values`` mean the same to Go as to Python.
    """
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
        style = '"' if _GO_NON_STRING.match(data) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, str_representer)
    return yaml.dump(obj, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)
