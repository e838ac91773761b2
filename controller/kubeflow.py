"""The contract of the Kubeflow operators ddpjob drives: API names, labels, container, port.

One place for what the operator's source decides and ddpjob only follows. The renderer, the
API layer, the job logic, doctor and the local cluster (``localkube``) all read it from here.
Two launchers: the training operator v1 (PyTorchJob) and Kubeflow Trainer v2 (TrainJob, which
runs each job as a JobSet).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer import contract


@dataclass(frozen=True)
class JobAPI:
    """A custom resource ddpjob submits or reads: where the API server serves it."""

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
OPERATOR_VERSION = "v1.9.4"

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

#: The upstream manifests label the operator's pod with this (manifests/base/deployment.yaml).
OPERATOR_POD_SELECTOR = "control-plane=kubeflow-training-operator"

# ------------------------------------------------------------------------------------------
# Kubeflow Trainer v2 (TrainJob), v2.3, and the JobSet it creates for every TrainJob.
# Read from github.com/kubeflow/trainer/v2@v2.3.0: pkg/constants/constants.go and
# pkg/runtime/framework/plugins/torch/torch.go.

TRAINJOB = JobAPI("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")
TRAINJOB_CRD = TRAINJOB.crd
#: The cluster-scoped runtime a TrainJob's ``spec.runtimeRef`` names (its default kind).
CLUSTER_TRAINING_RUNTIME = JobAPI(
    "trainer.kubeflow.org", "v1alpha1", "ClusterTrainingRuntime", "clustertrainingruntimes"
)
#: The namespaced runtime (``runtimeRef.kind: TrainingRuntime``).
TRAINING_RUNTIME = JobAPI("trainer.kubeflow.org", "v1alpha1", "TrainingRuntime", "trainingruntimes")
JOBSET = JobAPI("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
#: The versions the local cluster builds (and the TrainJob API ddpjob renders for).
TRAINER_VERSION = "v2.3.0"
JOBSET_VERSION = "v0.12.0"

#: Upstream's runtime for torchrun-style jobs (manifests/base/runtimes/torch_distributed.yaml).
DEFAULT_RUNTIME = "torch-distributed"
#: The torch plugin puts its env on the container of this name in the replicated job of this
#: name (constants.Node); a TrainJob's ``spec.trainer`` (image, command, env) lands there too.
TRAINJOB_CONTAINER = "node"
TRAINJOB_REPLICATED_JOB = "node"

#: Labels on every pod of a TrainJob: the JobSet (= TrainJob name), its replicated job, and the
#: Indexed Job's completion index (= PET_NODE_RANK; also an annotation, which the env reads).
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
LABEL_REPLICATED_JOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

#: The only env the torch plugin injects; it starts no torchrun and sets no MASTER_ADDR, RANK or
#: WORLD_SIZE. The webhook refuses these names in ``spec.trainer.env``.
ENV_NNODES = contract.PET_NNODES  # trainer.numNodes
ENV_NPROC_PER_NODE = contract.PET_NPROC_PER_NODE  # numProcPerNode, else "auto" with GPUs, else CPUs
ENV_NODE_RANK = contract.PET_NODE_RANK  # fieldRef to the job-completion-index annotation
ENV_MASTER_ADDR = contract.PET_MASTER_ADDR  # <trainjob>-node-0-0.<trainjob>
ENV_MASTER_PORT = contract.PET_MASTER_PORT
TRAINJOB_RESERVED_ENV = contract.TRAINJOB_VARS
#: PET_MASTER_PORT's value and the container port the plugin adds (constants.ContainerTrainerPort).
TRAINJOB_MASTER_PORT = 29500


def trainjob_master_addr(trainjob: str) -> str:
    """Rank 0's DNS name: pod hostname ``<jobset>-<replicated job>-<job index>-<pod index>``
    under the JobSet's headless Service ``<jobset>`` (set by JobSet's mutating webhook)."""
    return f"{trainjob}-{TRAINJOB_REPLICATED_JOB}-0-0.{trainjob}"


#: The pod label JobSet adds beside the completion index: which of the replicated job's Jobs.
LABEL_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
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
# Kueue (the queue a shared cluster admits jobs through), v0.19: its API kueue.x-k8s.io/v1beta2.
# Read from sigs.k8s.io/kueue@v0.19.2: apis/kueue/v1beta2, pkg/controller/constants.

KUEUE_VERSION = "v0.19.2"
WORKLOAD = JobAPI("kueue.x-k8s.io", "v1beta2", "Workload", "workloads")
LOCAL_QUEUE = JobAPI("kueue.x-k8s.io", "v1beta2", "LocalQueue", "localqueues")
CLUSTER_QUEUE = JobAPI("kueue.x-k8s.io", "v1beta2", "ClusterQueue", "clusterqueues")
WORKLOAD_PRIORITY_CLASS = JobAPI(
    "kueue.x-k8s.io", "v1beta2", "WorkloadPriorityClass", "workloadpriorityclasses"
)
#: The visibility API (an APIService Kueue serves when its VisibilityOnDemand gate is on, as in
#: upstream's install): a LocalQueue's pending workloads with their positions.
VISIBILITY_GROUP_VERSION = "visibility.kueue.x-k8s.io/v1beta2"

#: On the job: the LocalQueue Kueue admits it through ...
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
#: ... and its WorkloadPriorityClass (KEP-973), which orders and preempts within the queue.
LABEL_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
#: On the Workload Kueue makes for a job: the job's UID.
LABEL_JOB_UID = "kueue.x-k8s.io/job-uid"
#: Kueue's controller pod in the upstream manifests (config/default).
KUEUE_POD_SELECTOR = "app.kubernetes.io/name=kueue,control-plane=controller-manager"

# ------------------------------------------------------------------------------------------
# The trainer image (ours, but every renderer and the chart must agree on it)

#: The image's non-root user and group: runAsUser/runAsGroup/fsGroup of every pod.
TRAINER_UID = 1000
DEFAULT_COMMAND = ("python", "-m", "trainer")

# ------------------------------------------------------------------------------------------
# A shipped working directory (controller/workdir.py packs it, trainer/workdir.py unpacks it)

#: Where every pod unpacks the workdir: an emptyDir, the trainer's working directory and the
#: head of its PYTHONPATH (``run --local --container`` mounts the unpacked copy here too).
WORKDIR_PATH = "/workdir"
#: The emptyDir behind it, and the ConfigMap's volume with the archive, mounted read-only.
WORKDIR_VOLUME = "workdir"
WORKDIR_ARCHIVE_VOLUME = "workdir-archive"
WORKDIR_ARCHIVE_PATH = "/var/run/ddpjob/workdir"
#: On the job: which code ran. The archive's digest; inside git, the commit and whether the
#: packed files differed from it ("true"/"false").
ANNOTATION_WORKDIR_DIGEST = "ddpjob/workdir-digest"
ANNOTATION_WORKDIR_COMMIT = "ddpjob/workdir-git-commit"
ANNOTATION_WORKDIR_DIRTY = "ddpjob/workdir-git-dirty"
WORKDIR_ANNOTATIONS = (
    ANNOTATION_WORKDIR_DIGEST,
    ANNOTATION_WORKDIR_COMMIT,
    ANNOTATION_WORKDIR_DIRTY,
)
#: In the trainer's env: the same facts, for the goodput ledger; and PYTHONPATH, whose head
#: the workdir becomes (a PYTHONPATH of the spec's env follows it).
WORKDIR_ENV = (
    contract.WORKDIR_DIGEST_ENV,
    contract.WORKDIR_COMMIT_ENV,
    contract.WORKDIR_DIRTY_ENV,
    "PYTHONPATH",
)
