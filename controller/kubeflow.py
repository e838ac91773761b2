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

#: Every job API ddpjob renders and watches.
JOB_APIS = (PYTORCHJOB,)

# ------------------------------------------------------------------------------------------
# The trainer image (ours, but every renderer and the chart must agree on it)

#: The image's non-root user and group: runAsUser/runAsGroup/fsGroup of every pod.
TRAINER_UID = 1000
DEFAULT_COMMAND = ("python", "-m", "trainer")
