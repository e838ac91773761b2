"""The contract of the Kubeflow operators ddpjob drives: API names, labels, container, port.

One place for what the operator's source decides and ddpjob only follows. The renderer, the
API layer, the job logic, doctor and the local cluster (``localkube``) all read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobAPI:
    """A custom resource ddpjob submits: where the API server serves it."""

    group: str
    version: str
    kind: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def crd(self) -> str:
        return f"{self.plural}.{self.group}"


# ------------------------------------------------------------------------------------------
# Kubeflow training operator v1 (PyTorchJob), v1.9

PYTORCHJOB = JobAPI("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
PYTORCHJOB_CRD = PYTORCHJOB.crd
#: The operator version the local cluster builds and the CRD-missing hint installs.
OPERATOR_VERSION = "v1.9.2"

#: Labels the operator puts on every pod of a job.
LABEL_JOB_NAME = "training.kubeflow.org/job-name"
LABEL_REPLICA_TYPE = "training.kubeflow.org/replica-type"  # master | worker
LABEL_REPLICA_INDEX = "training.kubeflow.org/replica-index"
LABEL_JOB_ROLE = "training.kubeflow.org/job-role"  # "master" on the master pod only

#: The operator finds the training container by this name ...
CONTAINER = "pytorch"
#: ... and MASTER_PORT / the rendezvous port by this port name (its default number).
PORT_NAME = "pytorchjob-port"
PORT = 23456

#: Under ``restartPolicy: ExitCode`` these exit codes are retried; every other is permanent
#: (pkg/controller.v1/common: 130 SIGINT, 137 SIGKILL, 138 SIGUSR1, 143 SIGTERM).
RETRYABLE_EXIT_CODES = (130, 137, 138, 143)

#: The upstream manifests label the operator's pod with this (manifests/base/deployment.yaml).
OPERATOR_POD_SELECTOR = "control-plane=kubeflow-training-operator"

# ------------------------------------------------------------------------------------------
# Kubeflow Trainer v2 (TrainJob), v2.3 with JobSet v0.12

TRAINJOB = JobAPI("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")
#: The cluster-scoped runtimes a TrainJob's runtimeRef names (kind ClusterTrainingRuntime).
CLUSTER_TRAINING_RUNTIME = JobAPI(
    "trainer.kubeflow.org", "v1alpha1", "ClusterTrainingRuntime", "clustertrainingruntimes"
)
#: The Trainer release whose API the renderer writes (the minor is pinned: v1alpha1 changes).
TRAINER_VERSION = "v2.3.0"
#: Upstream's runtime for PyTorch (manifests/base/runtimes/torch_distributed.yaml).
DEFAULT_RUNTIME = "torch-distributed"
#: The runtime's replicated job and its training container: both named ``node``.
TRAINJOB_REPLICATED_JOB = "node"
TRAINJOB_CONTAINER = "node"
#: The torch plugin's rendezvous port (PET_MASTER_PORT; pkg/constants ContainerTrainerPort).
TRAINJOB_PORT = 29500
#: The torch plugin injects these into the trainer container; the webhook refuses them in
#: spec.trainer.env. No MASTER_ADDR, RANK or WORLD_SIZE, and no torchrun is started.
TRAINJOB_RESERVED_ENV = (
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
#: Labels JobSet and the Job controller put on every pod of a TrainJob. Rank 0 is the pod with
#: completion index 0 of replicated job ``node`` (the only Job: replicas 1).
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"  # = the TrainJob's name
LABEL_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
LABEL_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: The Warning event reason the TrainJob controller records when it cannot build the JobSet
#: (runtime missing, JobSet refused); the TrainJob's conditions say nothing then.
EVENT_RESOURCES_FAILED = "TrainJobResourcesCreationFailed"
#: The ``manager`` of the runtimePatches entry ddpjob writes: a domain-prefixed path, with
#: no domain claimed (`ddpjob` is a valid DNS subdomain on its own).
RUNTIME_PATCH_MANAGER = "ddpjob/spec"
#: The upstream manifests label the Trainer controller's pod with this.
TRAINER_POD_SELECTOR = "app.kubernetes.io/name=trainer"

#: Every job API ddpjob renders and watches, by the spec's ``api:`` value.
JOB_APIS = (PYTORCHJOB, TRAINJOB)
API_BY_NAME = {"pytorchjob": PYTORCHJOB, "trainjob": TRAINJOB}

# ------------------------------------------------------------------------------------------
# The trainer image (ours, but every renderer and the chart must agree on it)

#: The image's non-root user and group: runAsUser/runAsGroup/fsGroup of every pod.
TRAINER_UID = 1000
DEFAULT_COMMAND = ("python", "-m", "trainer")
