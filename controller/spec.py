"""The job spec: one YAML file that says what to train, on how many pods, with what resources.

Validated once, here, before anything is rendered or submitted. Every model forbids unknown keys
(a typo fails at its exact path) and every field carries a description, which flows into the
JSON Schema (``python -m controller schema``) that editors use for completion.

The ``trainer`` section *is* the trainer's own ``TrainConfig``: a bad trainer setting fails on the
laptop with the same message the pod would print.

    spec = load_spec_data(yaml.safe_load(text))   # or controller.cli.load_spec(path)
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from controller.errors import UserError
from controller.kubeflow import (
    DEFAULT_RUNTIME,
    TRAINJOB_REPLICATED_JOB,
    WORKDIR_ANNOTATIONS,
    WORKDIR_ENV,
)
from controller.quantity import QUANTITY, parse_quantity
from trainer.config import TrainConfig, format_errors
from trainer.contract import GRACE_PERIOD_ENV
from trainer.sizing import Estimate, estimate

# --------------------------------------------------------------------------------------------
# Names and formats Kubernetes insists on

# The operator's webhook checks the job name as a DNS-1035 label (starts with a letter).
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# A label name, or the name part of a label or annotation key: at most 63 characters.
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")
# A label or annotation key: an optional DNS subdomain prefix and `/`, then a label name.
LABEL_KEY = re.compile(rf"({DNS1123_SUBDOMAIN.pattern}/)?{LABEL_NAME.pattern}")
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")

# Set by the training operator in every pod; a user value would be overwritten or conflict.
OPERATOR_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "PYTHONUNBUFFERED")
OPERATOR_ENV_PREFIX = "PET_"
# Set by the renderer from the spec's own fields; a user value would contradict them.
RENDERED_ENV = {GRACE_PERIOD_ENV: "grace_period_s"}
# Volumes and mount paths the renderer adds itself (see controller.render).
RESERVED_VOLUMES = ("dshm", "tmp")
RESERVED_MOUNTS = ("/dev/shm", "/tmp")
# Label keys the renderer, the operators, JobSet or the Job controller set; a user label with
# one of these keys would fight them.
RESERVED_LABEL_PREFIXES = (
    "app.kubernetes.io/",
    "kueue.x-k8s.io/",
    "training.kubeflow.org/",
    "trainer.kubeflow.org/",
    "jobset.sigs.k8s.io/",
    "batch.kubernetes.io/",
)
# Pod, service and host names hold 63 characters: `<name>-worker-<index>` (PyTorchJob) and
# `<name>-node-0-<index>-<5 random>` (TrainJob: JobSet's webhook checks exactly this).
_POD_NAME_MAX = 63

# What a TrainJob (Trainer v2.3) cannot carry, and why. Setting one of these with
# `api: trainjob` is an error that says so; left unset, their PyTorchJob defaults mean nothing
# for a TrainJob (docs/spec-and-cli.md has the full mapping). runtimePatches, the only way a
# TrainJob changes its runtime's pods, reach labels, annotations, serviceAccountName, volumes,
# container volumeMounts/securityContext, imagePullSecrets, securityContext, nodeSelector,
# affinity, tolerations, schedulingGates and terminationGracePeriodSeconds: nothing else.
PYTORCHJOB_ONLY = {
    "elastic": "Trainer v2.3's torch runtime runs a fixed numNodes; it has no elastic policy",
    "gang": (
        "a TrainJob is gang-scheduled by its runtime's podGroupPolicy; runtimePatches cannot "
        "set schedulerName"
    ),
    "priority_class": (
        "runtimePatches cannot set priorityClassName; name a Kueue queue too and it becomes "
        "the job's WorkloadPriorityClass (the kueue.x-k8s.io/priority-class label)"
    ),
    "restart_policy": (
        "a TrainJob's pods restart as its runtime's Job says (torch-distributed: OnFailure, in "
        "place; 137, 138 and 143 recover); runtimePatches cannot set restartPolicy"
    ),
    "backoff_limit": (
        "retries are the runtime Job's backoffLimit (torch-distributed: Kubernetes' default "
        "6); runtimePatches cannot set it"
    ),
    "ttl_after_finished_s": (
        "a TrainJob has no TTL and runtimePatches cannot set the JobSet's ttlSecondsAfterFinished"
    ),
    "clean_pod_policy": (
        "when a TrainJob ends JobSet deletes its active Jobs and their pods; there is no "
        "policy to choose"
    ),
}


def _quantity(value: Any, *, positive: bool = True) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError("must be a Kubernetes quantity such as 500m, 2, 512Mi or 16Gi")
    text = str(value).strip()
    if parse_quantity(text) <= 0 and positive:
        raise ValueError("must be greater than 0")
    return text


def _label_key(key: str) -> str | None:
    """None if ``key`` is a valid label/annotation key, else what is wrong with it."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return "key prefix must be a DNS subdomain (e.g. example.com/)"
    if not name or len(name) > 63 or not LABEL_NAME.fullmatch(name):
        return "key name must be 1-63 characters: letters, digits, -, _, . (alphanumeric ends)"
    return None


# --------------------------------------------------------------------------------------------
# The same rules in JSON Schema: editors read them from controller/spec.schema.json, and the
# chart's values.schema.json inherits them (controller/render/values_schema.py). They are added
# with json_schema_extra, which changes no validation: the validators below stay the rules, and
# the schema describes them as far as JSON Schema can (not the rules across fields).


def json_pattern(rx: re.Pattern[str]) -> str:
    """``rx`` as a JSON Schema ``pattern``: anchored (a JSON Schema pattern searches; our
    validators fullmatch), without Python's named groups, so that Go (helm), ECMAScript (editors)
    and Python read it alike."""
    return "^" + re.sub(r"\(\?P<\w+>", "(", rx.pattern) + "$"


def _on(json_type: str, **rules: Any) -> Callable[[dict[str, Any]], None]:
    """json_schema_extra adding ``rules`` to the ``json_type`` schema of a field, also inside
    ``X | None`` (pydantic writes ``anyOf: [X, null]``; the rules belong to the X branch)."""

    def extra(schema: dict[str, Any]) -> None:
        branches = [b for b in schema.get("anyOf", []) if b.get("type") == json_type]
        (branches[0] if branches else schema).update(rules)

    return extra


def _any_of(*prefixes: str) -> str:
    """A pattern for text starting with one of ``prefixes``. Escapes only what must be: the
    ``\\-`` that re.escape writes is an error in ECMAScript's unicode mode (editors)."""
    escaped = (re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", p) for p in prefixes)
    return "^(" + "|".join(escaped) + ")"


_DNS_LABEL = {"pattern": json_pattern(DNS1123_LABEL), "maxLength": 63}
_OBJECT_NAME = {"pattern": json_pattern(DNS1123_SUBDOMAIN), "maxLength": 253}
# Quantities may be written as YAML numbers (`cpu: 4`); editors should accept that too. A
# pattern applies to strings only and exclusiveMinimum to numbers only.
_QUANTITY_SCHEMA: dict[str, Any] = {
    "type": ["string", "number"],
    "pattern": json_pattern(QUANTITY),
    "exclusiveMinimum": 0,
}
_ENV_NAMES = {
    "pattern": json_pattern(ENV_NAME),
    "not": {
        "anyOf": [
            {"enum": [*OPERATOR_ENV, *RENDERED_ENV]},
            {"pattern": _any_of(OPERATOR_ENV_PREFIX)},
        ]
    },
}
# 253 (prefix) + "/" + 63 (name); the pattern bounds the name alone.
_LABEL_KEYS = {"pattern": json_pattern(LABEL_KEY), "maxLength": 317}
_LABEL_VALUES = {"type": "string", "pattern": "^(" + LABEL_NAME.pattern + ")?$"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------------------
# Sections


class Resources(_Model):
    """What each pod (one node of the job) asks for; limits and requests are set equal."""

    gpus: int = Field(
        0, ge=0, le=16, description="NVIDIA GPUs per pod (`nvidia.com/gpu`); 0 runs on CPU."
    )
    cpu: str = Field(
        "1",
        description="CPU cores per pod as a Kubernetes quantity (`4`, `500m`).",
        json_schema_extra=_QUANTITY_SCHEMA,
    )
    memory: str = Field(
        "2Gi",
        description="Memory per pod as a Kubernetes quantity (`16Gi`, `512Mi`).",
        json_schema_extra=_QUANTITY_SCHEMA,
    )

    gpu_memory: str | None = Field(
        None,
        description=(
            "Memory of each GPU as a Kubernetes quantity (`80Gi`), for `validate`, `doctor` and "
            "`submit` to check that the model's training state fits (a built-in task's); not "
            "part of the pods. Without GPUs the check uses memory / nproc_per_node."
        ),
        json_schema_extra=_on("string", **_QUANTITY_SCHEMA),
    )

    @field_validator("cpu", "memory", "gpu_memory", mode="before")
    @classmethod
    def _is_quantity(cls, v: Any) -> str | None:
        return None if v is None else _quantity(v)


class SecretKeyRef(_Model):
    """One key of a Kubernetes Secret, exposed to the trainer as an environment variable."""

    secret: str = Field(
        description="Name of the Secret in the job's namespace.",
        json_schema_extra=_OBJECT_NAME,
    )
    key: str = Field(
        description="Key inside the Secret.",
        json_schema_extra={"pattern": json_pattern(SECRET_KEY), "maxLength": 253},
    )

    @field_validator("secret")
    @classmethod
    def _secret_name(cls, v: str) -> str:
        if len(v) > 253 or not DNS1123_SUBDOMAIN.fullmatch(v):
            raise ValueError("must be a Secret name (lowercase DNS subdomain)")
        return v

    @field_validator("key")
    @classmethod
    def _key_form(cls, v: str) -> str:
        if not SECRET_KEY.fullmatch(v) or len(v) > 253:
            raise ValueError("must be a Secret key: letters, digits, -, _ and .")
        return v


class Volume(_Model):
    """A PersistentVolumeClaim mounted into every pod (data sets, checkpoints)."""

    name: str = Field(
        description="Volume name inside the pod (DNS-1123 label), e.g. `ckpt`.",
        json_schema_extra={**_DNS_LABEL, "not": {"enum": list(RESERVED_VOLUMES)}},
    )
    claim: str = Field(
        description="Name of an existing PersistentVolumeClaim in the namespace.",
        json_schema_extra=_OBJECT_NAME,
    )
    mount_path: str = Field(
        description="Absolute path inside the container, e.g. `/ckpt`.",
        json_schema_extra={"pattern": "^/", "not": {"pattern": _any_of(*RESERVED_MOUNTS) + "/*$"}},
    )
    read_only: bool = Field(False, description="Mount read-only (data sets shared by many jobs).")
    rank0_only: bool = Field(
        False,
        description=(
            "PyTorchJob only: mount it on rank 0's pod alone (the Master), not on the Workers. "
            "For a ReadWriteOnce claim that holds checkpoint.dir: only rank 0 writes and reads "
            "checkpoints (it broadcasts the state on resume). A volume every pod mounts needs a "
            "ReadWriteMany claim once pods run on several nodes."
        ),
    )
    sub_path: str | None = Field(
        None,
        description="Mount only this sub-directory of the volume.",
        # Relative, and no `..` among its parts.
        json_schema_extra=_on("string", **{"not": {"pattern": r"^/|(^|/)\.\.(/|$)"}}),
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if len(v) > 63 or not DNS1123_LABEL.fullmatch(v):
            raise ValueError("must be a DNS-1123 label: lowercase letters, digits and -")
        if v in RESERVED_VOLUMES:
            raise ValueError(f"is used by ddpjob itself; pick another name than {v}")
        return v

    @field_validator("claim")
    @classmethod
    def _claim(cls, v: str) -> str:
        if len(v) > 253 or not DNS1123_SUBDOMAIN.fullmatch(v):
            raise ValueError("must be a PersistentVolumeClaim name (lowercase DNS subdomain)")
        return v

    @field_validator("mount_path")
    @classmethod
    def _mount_path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must be an absolute path")
        if v.rstrip("/") in RESERVED_MOUNTS:
            raise ValueError(f"is mounted by ddpjob itself ({v} is an emptyDir)")
        return v

    @field_validator("sub_path")
    @classmethod
    def _sub_path(cls, v: str | None) -> str | None:
        if v is not None and (v.startswith("/") or ".." in v.split("/")):
            raise ValueError("must be a relative path without ..")
        return v


class Toleration(_Model):
    """Lets pods schedule onto tainted nodes (e.g. GPU pools tainted `nvidia.com/gpu`)."""

    key: str | None = Field(None, description="Taint key to match; empty with Exists = all.")
    operator: Literal["Equal", "Exists"] = Field(
        "Equal", description="`Equal` matches key and value; `Exists` matches the key alone."
    )
    value: str | None = Field(None, description="Taint value to match (with Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects."
    )
    toleration_s: int | None = Field(
        None, ge=0, description="With NoExecute: how long the pod stays after the taint appears."
    )

    @model_validator(mode="after")
    def _exists_has_no_value(self) -> Toleration:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("operator Exists takes no value; remove value or use Equal")
        if self.key is None and self.operator != "Exists":
            raise ValueError("an empty key needs operator Exists")
        return self


class Gang(_Model):
    """Gang scheduling: start all pods together or none (Volcano / scheduler-plugins)."""

    scheduler_name: str | None = Field(
        None,
        description=(
            "Pod schedulerName, e.g. `volcano` or `scheduler-plugins-scheduler`; empty lets the "
            "operator fill in its --gang-scheduler-name."
        ),
    )
    min_available: int | None = Field(
        None,
        ge=1,
        description=(
            "Pods that must be schedulable at once; default: all nodes (elastic: min_nodes)."
        ),
    )


class Elastic(_Model):
    """torchrun elastic training: the job keeps going while pods come and go within a range."""

    min_nodes: int = Field(ge=1, description="Fewest pods the job runs with.")
    max_nodes: int = Field(ge=1, description="Most pods the job scales up to.")
    max_restarts: int = Field(
        3, ge=0, description="Worker-group restarts torchrun allows before failing the job."
    )


def check_labels(v: dict[str, str]) -> dict[str, str]:
    """Kubernetes label keys and values, or a ValueError naming the first that is not one."""
    for key, value in v.items():
        if problem := _label_key(key):
            raise ValueError(f"{key}: {problem}")
        if value and (len(value) > 63 or not LABEL_NAME.fullmatch(value)):
            raise ValueError(
                f"{key}: value must be at most 63 letters, digits, -, _, . "
                f"(alphanumeric ends) (got {value})"
            )
    return v


class Monitoring(_Model):
    """What a Prometheus run by the Prometheus Operator, and Grafana, need to find the job's
    metrics (the pods' own prometheus.io annotations serve any other Prometheus)."""

    pod_monitor: bool = Field(
        False,
        description=(
            "Also create a PodMonitor (monitoring.coreos.com/v1) for the job's pods, for a "
            "Prometheus of the Prometheus Operator (which does not read prometheus.io "
            "annotations). The cluster needs the Operator's CRDs."
        ),
    )
    pod_monitor_labels: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Labels on the PodMonitor: what the Prometheus' podMonitorSelector asks for "
            "(kube-prometheus-stack: `release: <its release name>`)."
        ),
        json_schema_extra={"propertyNames": _LABEL_KEYS, "additionalProperties": _LABEL_VALUES},
    )
    grafana_dashboard: bool = Field(
        False,
        description=(
            "Also create a ConfigMap with ddpjob's Grafana dashboard, labelled "
            '`grafana_dashboard: "1"` (what Grafana\'s dashboard sidecar looks for): throughput, '
            "loss, step-time quantiles per rank, goodput, stuck and straggler ranks, GPU use."
        ),
    )

    @field_validator("pod_monitor_labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return check_labels(v)


# --------------------------------------------------------------------------------------------
# The spec


class JobSpec(_Model):
    """A distributed training job: rendered into one Kubeflow PyTorchJob or TrainJob, or run
    locally."""

    model_config = ConfigDict(extra="forbid", title="ddpjob job spec")

    name: str = Field(
        description=(
            "Job name: a DNS-1035 label (lowercase letters, digits, -; starts with a letter), "
            "short enough that `<name>-worker-<index>` fits in 63 characters."
        ),
        json_schema_extra={"pattern": json_pattern(DNS1035_LABEL), "maxLength": 63},
    )
    namespace: str = Field(
        "default", description="Kubernetes namespace to run in.", json_schema_extra=_DNS_LABEL
    )
    image: str = Field(
        description="Container image with the trainer (and your code).",
        json_schema_extra={"pattern": r"^\S+$"},
    )
    api: Literal["pytorchjob", "trainjob"] = Field(
        "pytorchjob",
        description=(
            "The Kubeflow job API: `pytorchjob` (training operator v1, kubeflow.org/v1 "
            "PyTorchJob) or `trainjob` (Kubeflow Trainer v2.3, trainer.kubeflow.org/v1alpha1 "
            "TrainJob). `--set api=trainjob` switches a spec."
        ),
    )
    runtime: str = Field(
        DEFAULT_RUNTIME,
        description=(
            "TrainJob only: the ClusterTrainingRuntime to run on (`runtimeRef`). It must have "
            "the torch ML policy and replicated job `node` with container `node`, as upstream's "
            "torch-distributed does."
        ),
        json_schema_extra=_OBJECT_NAME,
    )
    command: list[str] | None = Field(
        None,
        description="Container command; default `python -m trainer`.",
        json_schema_extra=_on("array", minItems=1),
    )
    args: list[str] | None = Field(
        None,
        description=(
            "Container args; default: the `trainer` settings below as sorted `key=value` "
            "strings. Set either args or trainer, not both."
        ),
    )
    trainer: TrainConfig = Field(
        default_factory=TrainConfig,
        description="Trainer settings (the trainer's own schema); passed as key=value args.",
    )
    workdir: str | None = Field(
        None,
        description=(
            "Your project's folder, shipped with the job so the stock image runs it: a path "
            "relative to the spec file's folder (`--workdir DIR` on submit, run and render: "
            "relative to where you run it). Packed as git would commit it (tracked files and "
            "untracked ones .gitignore keeps, as on disk now); outside git everything but "
            "`.git`, `.venv`, `__pycache__`, `checkpoints/` and `runs/`; either way less what a "
            "`.ddpjobignore` at its top lists. Every pod unpacks it at `/workdir`, the working "
            "directory and the head of PYTHONPATH, so `command: [python, train.py]`, "
            "`torchrun train.py`, `-m mypkg.train` and `task: mypkg.tasks:build` run your code."
        ),
        json_schema_extra=_on("string", minLength=1),
    )
    workdir_store: str | None = Field(
        None,
        description=(
            "Where the workdir's archive goes. Empty: a ConfigMap `<name>-workdir` created with "
            "the job and owned by it (deleted with it), up to about 1 MB packed. "
            "`s3://bucket/prefix`: the object `prefix/<digest>.tar.gz`, uploaded only when not "
            "there yet; the pods read it with the credentials and endpoint of `env` and "
            "`secret_env` (AWS_*, as checkpoint.dir s3:// does), and this machine uploads with "
            "its own AWS_* environment (`pip install 'ddpjob[s3]'`)."
        ),
        json_schema_extra=_on("string", pattern=r"^s3://[^/]+"),
    )
    nodes: int = Field(1, ge=1, le=1024, description="Pods in the job, the master included (>= 1).")
    nproc_per_node: int = Field(
        1,
        ge=1,
        le=64,
        description="Processes per pod (usually = GPUs per pod); > 1 runs torchrun in the pod.",
    )
    resources: Resources = Field(
        default_factory=Resources, description="CPU, memory and GPUs per pod."
    )
    shm_size: str = Field(
        "1Gi",
        json_schema_extra=_QUANTITY_SCHEMA,
        description=(
            "Size of the memory-backed /dev/shm (DataLoader workers and NCCL need more than "
            "the container runtime's 64Mi). Counts against resources.memory."
        ),
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables for the trainer, in this order (values are strings).",
        # Numbers and booleans are accepted and turned into strings (`OMP_NUM_THREADS: 4`).
        json_schema_extra={
            "propertyNames": _ENV_NAMES,
            "additionalProperties": {"type": ["string", "number", "boolean"]},
        },
    )
    secret_env: dict[str, SecretKeyRef] = Field(
        default_factory=dict,
        description=(
            "Environment variables read from Secret keys. Only the reference is written into "
            "the manifest, never the value."
        ),
        json_schema_extra={"propertyNames": _ENV_NAMES},
    )
    volumes: list[Volume] = Field(
        default_factory=list, description="PersistentVolumeClaims to mount (data, checkpoints)."
    )
    grace_period_s: int | None = Field(
        None,
        ge=1,
        description=(
            "Seconds a pod has between SIGTERM (preemption, deletion) and SIGKILL: its "
            "terminationGracePeriodSeconds, passed to the trainer as DDPJOB_GRACE_PERIOD_S. "
            "The last checkpoint is written within it (the trainer warns once when a write "
            "took longer); raise it for large states on slow storage. Default: Kubernetes' 30."
        ),
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the pods must match.",
        json_schema_extra={"propertyNames": _LABEL_KEYS, "additionalProperties": _LABEL_VALUES},
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints the pods tolerate."
    )
    priority_class: str | None = Field(
        None,
        description=(
            "Without a queue (PyTorchJob only): the pods' PriorityClass (and the gang's). With "
            "a queue (both APIs): Kueue's WorkloadPriorityClass, the job's "
            "`kueue.x-k8s.io/priority-class` label, which orders and preempts within the queue; "
            "the pods then get no priorityClassName."
        ),
        json_schema_extra=_on("string", **_OBJECT_NAME),
    )
    service_account: str | None = Field(
        None,
        description="ServiceAccount the pods run as; default: the namespace's default.",
        json_schema_extra=_on("string", **_OBJECT_NAME),
    )
    image_pull_secrets: list[str] = Field(
        default_factory=list,
        description="Secrets with registry credentials to pull the image.",
        json_schema_extra={"items": {"type": "string", **_OBJECT_NAME}},
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra labels on the job and its pods.",
        json_schema_extra={
            # Not the keys ddpjob and the operator set (the validator's _unique_names).
            "propertyNames": {
                **_LABEL_KEYS,
                "not": {"pattern": _any_of(*RESERVED_LABEL_PREFIXES)},
            },
            "additionalProperties": _LABEL_VALUES,
        },
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Extra annotations on the job and its pods.",
        json_schema_extra={"propertyNames": _LABEL_KEYS},
    )
    queue: str | None = Field(
        None,
        description=(
            "Kueue LocalQueue name: sets the `kueue.x-k8s.io/queue-name` label (and the gang's "
            "queue with gang scheduling) and creates the job suspended; Kueue starts it when "
            "the queue admits it."
        ),
        json_schema_extra=_on("string", **_OBJECT_NAME),
    )
    gang: Gang | None = Field(
        None, description="PyTorchJob only: gang scheduling, all pods start together or none do."
    )
    elastic: Elastic | None = Field(
        None,
        description=(
            "PyTorchJob only: elastic training, Worker pods only, torchrun rendezvous (c10d) "
            "between min_nodes and max_nodes."
        ),
    )
    restart_policy: Literal["ExitCode", "OnFailure", "Never", "Always"] = Field(
        "ExitCode",
        description=(
            "PyTorchJob only: when the operator restarts a pod. ExitCode: retry exit codes 130, "
            "137 (killed), 138 (the trainer lost a peer) and 143 (preempted); fail on the "
            "others. A TrainJob's pods restart as its runtime's Job says."
        ),
    )
    backoff_limit: int = Field(
        3,
        ge=0,
        description=(
            "PyTorchJob only: pod restarts allowed before the job is marked Failed (a "
            "TrainJob's is its runtime Job's backoffLimit)."
        ),
    )
    active_deadline_s: int | None = Field(
        None, gt=0, description="Fail the job after this many seconds of running."
    )
    ttl_after_finished_s: int | None = Field(
        None,
        ge=0,
        description=(
            "PyTorchJob only: delete the finished job (and its pods) after this many seconds."
        ),
    )
    clean_pod_policy: Literal["None", "Running", "All"] | None = Field(
        None,
        description=(
            "PyTorchJob only: pods deleted when the job finishes: Running frees stragglers' GPUs "
            "and keeps finished pods' logs; All deletes every pod; None keeps all. Default: "
            "Running, or None for an elastic job, where Running is refused: the operator ends an "
            "elastic job when any worker succeeds, and Running would then delete the workers "
            "still finishing, rank 0 and its log possibly among them."
        ),
    )
    suspend: bool = Field(
        False,
        description=(
            "Create the job suspended (a job with a queue always is: Kueue un-suspends it when "
            "admitted)."
        ),
    )
    monitoring: Monitoring = Field(
        default_factory=Monitoring,
        description="A PodMonitor and a Grafana dashboard beside the job (both off by default).",
    )

    # -- single fields -------------------------------------------------------------------------

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not DNS1035_LABEL.fullmatch(v):
            raise ValueError(
                "must be a DNS-1035 label: lowercase letters, digits and -, starting with a "
                "letter and ending with a letter or digit"
            )
        # The operator's webhook checks this for a one-pod job too (no worker names to fit).
        if len(v) > 63:
            raise ValueError("must be at most 63 characters (a DNS-1035 label)")
        return v

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if len(v) > 63 or not DNS1123_LABEL.fullmatch(v):
            raise ValueError("must be a DNS-1123 label: lowercase letters, digits and -")
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not v or v != v.strip() or any(c.isspace() for c in v):
            raise ValueError("must be an image reference without spaces, e.g. repo/trainer:1.0")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("must not be empty; leave it out for the default trainer")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must be a folder's path, e.g. `.`; leave it out for none")
        return v

    @field_validator("workdir_store")
    @classmethod
    def _workdir_store(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"s3://[^/\s]+(/\S*)?", v):
            raise ValueError(
                "must be s3://bucket or s3://bucket/prefix; leave it out for a ConfigMap"
            )
        return v

    @field_validator("shm_size", mode="before")
    @classmethod
    def _shm(cls, v: Any) -> str:
        return _quantity(v)

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_as_strings(cls, v: Any) -> Any:
        # YAML reads `OMP_NUM_THREADS: 4` as an int and `true` as a bool; the pod wants strings.
        if isinstance(v, dict):
            return {k: _env_string(x) for k, x in v.items()}
        return v

    @field_validator("env", "secret_env")
    @classmethod
    def _env_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if not ENV_NAME.fullmatch(key):
                raise ValueError(f"{key} is not a valid environment variable name")
            if key in OPERATOR_ENV or key.startswith(OPERATOR_ENV_PREFIX):
                raise ValueError(f"{key} is set by the training operator; remove it")
            if key in RENDERED_ENV:
                raise ValueError(f"{key} is set from {RENDERED_ENV[key]}; set that instead")
        return v

    @field_validator("node_selector", "labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return check_labels(v)

    @field_validator("annotations")
    @classmethod
    def _annotation_keys(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if problem := _label_key(key):
                raise ValueError(f"{key}: {problem}")
        return v

    @field_validator("priority_class", "service_account", "queue", "runtime")
    @classmethod
    def _object_name(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 253 or not DNS1123_SUBDOMAIN.fullmatch(v)):
            raise ValueError("must be a Kubernetes object name (lowercase DNS subdomain)")
        return v

    @field_validator("image_pull_secrets")
    @classmethod
    def _pull_secrets(cls, v: list[str]) -> list[str]:
        for name in v:
            if len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
                raise ValueError(f"{name} is not a Secret name (lowercase DNS subdomain)")
        return v

    # -- rules across fields: each message states the equation that failed ---------------------

    @model_validator(mode="after")
    def _cross(self) -> JobSpec:
        problems = [
            *self._name_fits(),
            *self._topology(),
            *self._resources_fit(),
            *self._unique_names(),
            *self._args_or_trainer(),
            *self._api_fits(),
            *self._elastic_keeps_pods(),
            *self._rank0_volumes(),
            *self._monitored(),
            *self._workdir_fits(),
        ]
        if problems:
            # One ValueError carries every problem; spec_errors() splits it back into lines.
            raise ValueError("\n".join(problems))
        return self

    def _monitored(self) -> list[str]:
        if self.monitoring.pod_monitor and self.trainer.prometheus.serve is False:
            return [
                "monitoring.pod_monitor: the pods serve no metrics to monitor (got "
                "trainer.prometheus.serve: false). Remove one of the two"
            ]
        return []

    def _name_fits(self) -> list[str]:
        if self.api == "trainjob":
            # JobSet's webhook: the longest pod name, with the Job controller's 5-character
            # suffix, is a DNS-1035 label.
            longest = f"{self.name}-{TRAINJOB_REPLICATED_JOB}-0-{self.nodes - 1}-abcde"
        else:
            workers = self.elastic.max_nodes if self.elastic else self.nodes - 1
            if workers < 1:
                return []
            longest = f"{self.name}-worker-{workers - 1}"
        if len(longest) <= _POD_NAME_MAX:
            return []
        room = _POD_NAME_MAX - len(longest) + len(self.name)
        return [
            f"name: {longest!r} is {len(longest)} characters; pod and service names hold "
            f"{_POD_NAME_MAX}. Shorten name to at most {room} characters"
        ]

    def _topology(self) -> list[str]:
        out = []
        if self.elastic:
            e = self.elastic
            if not e.min_nodes <= self.nodes <= e.max_nodes:
                out.append(
                    f"elastic: min_nodes ({e.min_nodes}) <= nodes ({self.nodes}) <= "
                    f"max_nodes ({e.max_nodes}) does not hold"
                )
        min_available = self.gang.min_available if self.gang else None
        if min_available is not None and min_available > self.nodes:
            out.append(
                f"gang.min_available: min_available ({min_available}) <= "
                f"nodes ({self.nodes}) does not hold"
            )
        gpus = self.resources.gpus
        if gpus and self.nproc_per_node > gpus:
            out.append(
                f"nproc_per_node: nproc_per_node ({self.nproc_per_node}) <= resources.gpus "
                f"({gpus}) does not hold; one process drives one GPU"
            )
        if not gpus and self.trainer.device == "cuda":
            out.append(
                "trainer.device: cuda needs resources.gpus > 0 (got 0). Set resources.gpus "
                "or device auto"
            )
        if not gpus and self.trainer.backend == "nccl":
            out.append("trainer.backend: nccl needs resources.gpus > 0 (got 0). Use gloo or auto")
        return out

    def _resources_fit(self) -> list[str]:
        shm = parse_quantity(self.shm_size)
        memory = parse_quantity(self.resources.memory)
        if shm > memory:
            return [
                f"shm_size: shm_size ({self.shm_size}) <= resources.memory "
                f"({self.resources.memory}) does not hold; /dev/shm counts against memory"
            ]
        return []

    def _unique_names(self) -> list[str]:
        out = []
        for field in ("name", "mount_path"):
            seen: set[str] = set()
            for v in self.volumes:
                value = getattr(v, field).rstrip("/") or "/"
                if value in seen:
                    out.append(f"volumes: {field} {value} is used twice")
                seen.add(value)
        both = sorted(set(self.env) & set(self.secret_env))
        if both:
            out.append(f"secret_env: {', '.join(both)} also set in env; keep one")
        for key in self.labels:
            if key.startswith(RESERVED_LABEL_PREFIXES):
                out.append(f"labels: {key} is set by ddpjob or the operator; remove it")
        return out

    def _elastic_keeps_pods(self) -> list[str]:
        if self.elastic and self.clean_pod_policy == "Running":
            return [
                "clean_pod_policy: Running deletes the pods still running when the job ends, "
                "and the operator ends an elastic job as soon as any worker succeeds: rank 0 "
                "and its log may go with them (got Running with elastic). Remove "
                "clean_pod_policy (an elastic job keeps its pods), or set None or All"
            ]
        return []

    def _args_or_trainer(self) -> list[str]:
        if self.args is not None and self.trainer.model_fields_set:
            return ["args: set either args or trainer, not both (trainer settings become the args)"]
        return []

    def _api_fits(self) -> list[str]:
        """Fields the spec sets that the chosen API cannot carry: each named, with why."""
        if self.api == "pytorchjob":
            if "runtime" in self.model_fields_set:
                return [
                    f"runtime: only a TrainJob runs on a runtime (got api pytorchjob, runtime "
                    f"{self.runtime}). Set api: trainjob, or remove runtime"
                ]
            return []
        # With a queue, priority_class is Kueue's (a job label), which a TrainJob carries.
        kueue_fields = {"priority_class"} if self.queue else set()
        return [
            f"{field}: a TrainJob cannot carry it: {why} (got {_shown(getattr(self, field))}). "
            "Remove it, or use api: pytorchjob"
            for field, why in PYTORCHJOB_ONLY.items()
            if field in self.model_fields_set and field not in kueue_fields
        ]

    def _rank0_volumes(self) -> list[str]:
        """A volume for rank 0's pod alone needs a pod that is rank 0's before the job starts."""
        if self.api == "trainjob":
            got = "api trainjob"
            why = (
                "a TrainJob's pods share one template (runtimePatches patch replicated job "
                "node), so a volume is on every pod or on none"
            )
        elif self.elastic:
            got, why = "elastic", "an elastic job has no Master; its rendezvous picks rank 0"
        else:
            return []
        return [
            f"volumes.{i}.rank0_only: {why} (got {got}, volume {v.name}). Use "
            "checkpoint.dir: s3://..., or a ReadWriteMany claim mounted on every pod"
            for i, v in enumerate(self.volumes)
            if v.rank0_only
        ]

    def _workdir_fits(self) -> list[str]:
        out = []
        if self.workdir_store and not self.workdir:
            out.append(
                f"workdir_store: names where the workdir goes (got {self.workdir_store}), but no "
                "workdir is set. Set workdir, or remove workdir_store"
            )
        if self.workdir:
            for key in sorted(set(self.annotations) & set(WORKDIR_ANNOTATIONS)):
                out.append(f"annotations: {key} is set by ddpjob from the workdir; remove it")
            for name in sorted(set(self.secret_env) & set(WORKDIR_ENV)):
                out.append(f"secret_env: {name} is set by ddpjob from the workdir; remove it")
            for name in sorted(set(self.env) & (set(WORKDIR_ENV) - {"PYTHONPATH"})):
                out.append(f"env: {name} is set by ddpjob from the workdir; remove it")
        return out

    # -- derived values the renderer and the local runner share --------------------------------

    @property
    def worker_replicas(self) -> int:
        """Worker pods: nodes - 1 beside the Master, or all nodes in elastic mode (no Master)."""
        return self.nodes if self.elastic else self.nodes - 1

    @property
    def pod_cleanup(self) -> str:
        """The PyTorchJob's cleanPodPolicy: the spec's, else None for an elastic job (keep every
        worker: the job ends when any worker succeeds) and Running for the rest."""
        if self.clean_pod_policy is not None:
            return self.clean_pod_policy
        return "None" if self.elastic else "Running"

    @property
    def world_size(self) -> int:
        """Processes in the job: nodes x nproc_per_node."""
        return self.nodes * self.nproc_per_node

    def model_state(self) -> Estimate | None:
        """One rank's model state (trainer.sizing) and the memory it has: a GPU's
        (``resources.gpu_memory``), or without GPUs the pod's memory over its processes. None
        for a task of one's own, or a spec that gives ``args`` instead of trainer settings.
        An elastic job is reckoned at its fewest pods (the largest shards)."""
        if self.args is not None:
            return None
        t, r = self.trainer, self.resources
        if r.gpus:
            room = "a {size} GPU"
            room_bytes = int(parse_quantity(r.gpu_memory)) if r.gpu_memory else None
        else:
            room = "the {size} of resources.memory a process has"
            room_bytes = int(parse_quantity(r.memory) / self.nproc_per_node)
        nodes = self.elastic.min_nodes if self.elastic else self.nodes
        return estimate(t, nodes * self.nproc_per_node, room_bytes, room)


def _shown(value: Any) -> str:
    """A field's value as the error line shows it: a section as its YAML-ish dict."""
    if isinstance(value, BaseModel):
        return str(value.model_dump(exclude_none=True))
    return str(value)


def _env_string(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return value


# --------------------------------------------------------------------------------------------
# Validation with readable errors


def validate_spec(data: Any) -> JobSpec:
    """Validate a parsed YAML document into a JobSpec, or raise UserError (one line a problem)."""
    if data is None:
        raise UserError("(top level): the spec is empty; it needs at least name and image")
    if not isinstance(data, dict):
        raise UserError(f"(top level): expected a mapping of keys (got {type(data).__name__})")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise UserError(spec_errors(e)) from None


def spec_errors(err: ValidationError) -> list[str]:
    """``<dotted.path>: <what> (got <x>)`` lines, with a hint for misspelt keys."""
    lines: list[str] = []
    for e, line in zip(err.errors(), format_errors(err), strict=True):
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "value_error" and isinstance(e.get("input"), dict):
            # A rule across fields: the message names its fields; the input is the whole mapping.
            for part in msg.split("\n"):
                lines.append(part if not loc else f"{loc}: {part}")
        elif e["type"] == "extra_forbidden":
            lines.append(line + _did_you_mean(e["loc"]))
        else:
            lines.append(line)
    return lines


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    model: Any = JobSpec
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        ann = model.model_fields.get(part)
        model = _model_in(ann.annotation) if ann else None
    if model is None:
        return ""
    key = str(loc[-1])
    close = difflib.get_close_matches(key, list(model.model_fields), n=3, cutoff=0.5)
    if not close:
        return ""
    # Typos keep the start of a word: prefer the candidate sharing the longest prefix.
    best = max(close, key=lambda c: _shared_prefix(c, key))
    return f". Did you mean {best}?"


def _shared_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``X``, ``X | None`` or ``list[X]``, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the spec (draft 2020-12); ``make generate`` checks it in at
    controller/spec.schema.json."""
    schema = JobSpec.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def load_spec(path: str, overrides: list[str] | None = None) -> JobSpec:
    """Read and validate a spec file (plus ``key=value`` overrides); UserError on any mistake.

    The one place a spec enters the controller: every command that takes a SPEC calls this.
    """
    from trainer.config import ConfigError, deep_merge, parse_overrides, read_yaml

    try:
        data = read_yaml(path)
        if overrides:
            if not isinstance(data, dict):
                data = {} if data is None else data
            if isinstance(data, dict):
                data = deep_merge(data, parse_overrides(overrides))
    except ConfigError as e:
        raise UserError(e.problems) from None
    return validate_spec(data)
