"""The two job APIs as two small adapters: what differs between a PyTorchJob and a TrainJob when
ddpjob finds a job's pods, names its replicas, picks rank 0, reads its state and explains why it
waits. Everything else in ``controller.jobs`` is written once, against :class:`JobKind`.

Pure: API dicts in (exactly what ``kubectl get -o json`` prints), words and numbers out.

What differs, PyTorchJob (training operator v1) | TrainJob (Trainer v2.3 + JobSet):

- pods of the job: ``training.kubeflow.org/job-name=<job>`` |
  ``jobset.sigs.k8s.io/jobset-name=<job>``
- rank 0: replica type master, index 0 | replicated job ``node``, completion index 0
- node rank of a pod: master 0, worker i -> i + 1 | ``batch.kubernetes.io/job-completion-index``
- replica names: ``master-0``, ``worker-1`` | ``node-0``, ``node-1``
- training container: ``pytorch`` | ``node``
- state: the last True condition (Created, Running, Restarting, Succeeded, Failed, Suspended) |
  the Complete, Failed and Suspended conditions, else Running or Created from ``jobsStatus``
- why pods are missing: the job's Warning events | the TrainJob's
  (``TrainJobResourcesCreationFailed``), its JobSet's and its Job's (``FailedCreate``)
"""

from __future__ import annotations

from typing import Any

from controller.kubeflow import (
    CONTAINER,
    LABEL_JOB_COMPLETION_INDEX,
    LABEL_JOB_NAME,
    LABEL_JOBSET_NAME,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_TYPE,
    LABEL_REPLICATED_JOB_NAME,
    OPERATOR_POD_SELECTOR,
    OPERATOR_VERSION,
    PYTORCHJOB,
    TRAINER_POD_SELECTOR,
    TRAINER_VERSION,
    TRAINJOB,
    TRAINJOB_CONTAINER,
    TRAINJOB_REPLICATED_JOB,
    JobAPI,
)

#: The state names ``status``, ``wait`` and ``list`` show for an ended job, whatever the API.
SUCCEEDED, FAILED = "Succeeded", "Failed"


def _true_conditions(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in job.get("status", {}).get("conditions") or [] if c.get("status") == "True"]


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    return pod.get("metadata", {}).get("labels") or {}


def selects(selector: str, obj: dict[str, Any]) -> bool:
    """Whether the equality-based label selector ``k=v,k2=v2`` (as the adapters write them)
    selects ``obj``: what the API server answers to a list with it, for objects already read."""
    labels = _labels(obj)
    return all(
        labels.get(key) == value
        for key, _, value in (term.partition("=") for term in selector.split(","))
    )


class JobKind:
    """What ddpjob needs to know about one job API. Subclasses fill in the class attributes and
    the methods that differ; the shared ones read conditions the same way for both."""

    api: JobAPI
    #: The name the CLI and the spec use (``api: pytorchjob``).
    name: str
    #: The training container in every pod of the job.
    container: str
    #: The controller's pod in the upstream manifests, and what to install when it is missing.
    controller_selector: str
    controller_name: str
    version: str
    #: Condition types that mean the job ended, mapped to SUCCEEDED / FAILED.
    terminal_conditions: dict[str, str]
    #: After the job is deleted and its pods are gone, how long to watch for pods created again
    #: by a controller that has not seen the deletion yet (0: they are not).
    pods_recreated_within_s: float = 0.0

    # -- pods ---------------------------------------------------------------------------------

    def pods_selector(self, job_name: str) -> str:
        """A label selector for every pod of the job."""
        raise NotImplementedError

    def rank_selector(self, job_name: str, rank: int) -> str:
        """A label selector for the pod(s) of node rank ``rank``."""
        raise NotImplementedError

    def node_rank(self, pod: dict[str, Any]) -> int:
        raise NotImplementedError

    def replica_name(self, pod: dict[str, Any]) -> str:
        raise NotImplementedError

    def expected_replicas(self, job: dict[str, Any]) -> list[str]:
        """Replica names the job should have pods for (``replica_name`` of each)."""
        raise NotImplementedError

    def pod_name_of(self, job_name: str, replica: str) -> str:
        """How to name a replica that has no pod yet (its pod name, or the name's stem)."""
        raise NotImplementedError

    def nodes(self, job: dict[str, Any]) -> int | None:
        """How many pods the job runs (None when the job does not say)."""
        raise NotImplementedError

    # -- state --------------------------------------------------------------------------------

    def terminal(self, job: dict[str, Any]) -> str | None:
        """SUCCEEDED or FAILED once the job has ended, else None."""
        for c in _true_conditions(job):
            if c.get("type") in self.terminal_conditions:
                return self.terminal_conditions[c["type"]]
        return None

    def condition(self, job: dict[str, Any]) -> str:
        """The job's state in one word (the terminal ones named SUCCEEDED / FAILED)."""
        raise NotImplementedError

    def condition_message(self, job: dict[str, Any], state: str) -> str:
        """The message of the condition behind ``state`` ("" when none says more)."""
        wanted = {state} | {t for t, s in self.terminal_conditions.items() if s == state}
        for c in job.get("status", {}).get("conditions") or []:
            if c.get("type") in wanted and c.get("status") == "True":
                return c.get("message", "") or c.get("reason", "")
        return ""

    def start_time(self, job: dict[str, Any]) -> str | None:
        return job.get("status", {}).get("startTime") or job.get("metadata", {}).get(
            "creationTimestamp"
        )

    def owners(self, job_name: str) -> tuple[str, ...]:
        """Objects between the job and its pods whose events say why pods are missing."""
        return (job_name,)

    def reported_progress(self, job: dict[str, Any]) -> dict[str, Any] | None:
        """The progress the job's own status carries (what the training pods reported to the
        job's controller), or None: only a TrainJob has such a field."""
        return None

    def build_failures(self, job_name: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Warning events of the job (and what its controller made) about creating its pods."""
        owners = self.owners(job_name)
        return [
            e
            for e in events
            if e.get("type") == "Warning" and e.get("involvedObject", {}).get("name") in owners
        ]


class PyTorchJobKind(JobKind):
    api = PYTORCHJOB
    name = "pytorchjob"
    container = CONTAINER
    controller_selector = OPERATOR_POD_SELECTOR
    controller_name = "training operator"
    version = OPERATOR_VERSION
    terminal_conditions = {"Succeeded": SUCCEEDED, "Failed": FAILED}

    def pods_selector(self, job_name: str) -> str:
        return f"{LABEL_JOB_NAME}={job_name}"

    def rank_selector(self, job_name: str, rank: int) -> str:
        rtype, index = ("master", 0) if rank == 0 else ("worker", rank - 1)
        return (
            f"{LABEL_JOB_NAME}={job_name},{LABEL_REPLICA_TYPE}={rtype},"
            f"{LABEL_REPLICA_INDEX}={index}"
        )

    def node_rank(self, pod: dict[str, Any]) -> int:
        """The operator's RANK for this pod: master 0, worker i -> i + 1."""
        labels = _labels(pod)
        index = int(labels.get(LABEL_REPLICA_INDEX, 0))
        return index if labels.get(LABEL_REPLICA_TYPE) == "master" else index + 1

    def replica_name(self, pod: dict[str, Any]) -> str:
        labels = _labels(pod)
        rtype, index = labels.get(LABEL_REPLICA_TYPE), labels.get(LABEL_REPLICA_INDEX)
        if rtype is None or index is None:
            return pod.get("metadata", {}).get("name", "?")
        return f"{rtype}-{index}"

    def expected_replicas(self, job: dict[str, Any]) -> list[str]:
        return [
            f"{rtype.lower()}-{i}"
            for rtype, rspec in job.get("spec", {}).get("pytorchReplicaSpecs", {}).items()
            for i in range(int(rspec.get("replicas", 1)))
        ]

    def pod_name_of(self, job_name: str, replica: str) -> str:
        return f"{job_name}-{replica}"

    def nodes(self, job: dict[str, Any]) -> int | None:
        specs = job.get("spec", {}).get("pytorchReplicaSpecs", {})
        return sum(int(s.get("replicas", 1)) for s in specs.values())

    def condition(self, job: dict[str, Any]) -> str:
        if job.get("metadata", {}).get("deletionTimestamp"):
            return "Deleting"
        conds = _true_conditions(job)
        return conds[-1]["type"] if conds else "Pending"


class TrainJobKind(JobKind):
    api = TRAINJOB
    name = "trainjob"
    container = TRAINJOB_CONTAINER
    controller_selector = TRAINER_POD_SELECTOR
    controller_name = "Trainer controller"
    version = TRAINER_VERSION
    terminal_conditions = {"Complete": SUCCEEDED, "Failed": FAILED}
    # The Trainer controller creates the JobSet again while the TrainJob is being deleted: on
    # the local cluster in 9 deletes of 9, 1 to 6 times each. Foreground deletion waits for
    # those, but the last can come as the TrainJob goes (the JobSet deleted at t, created
    # again at t + 0.08 s, its Job and two pods at t + 0.1-0.23 s, collected 1.7 s later).
    pods_recreated_within_s = 5.0

    def pods_selector(self, job_name: str) -> str:
        return f"{LABEL_JOBSET_NAME}={job_name}"

    def rank_selector(self, job_name: str, rank: int) -> str:
        return (
            f"{LABEL_JOBSET_NAME}={job_name},{LABEL_REPLICATED_JOB_NAME}={TRAINJOB_REPLICATED_JOB},"
            f"{LABEL_JOB_COMPLETION_INDEX}={rank}"
        )

    def node_rank(self, pod: dict[str, Any]) -> int:
        """PET_NODE_RANK: the Indexed Job's completion index."""
        return int(_labels(pod).get(LABEL_JOB_COMPLETION_INDEX, 0))

    def replica_name(self, pod: dict[str, Any]) -> str:
        labels = _labels(pod)
        rjob, index = labels.get(LABEL_REPLICATED_JOB_NAME), labels.get(LABEL_JOB_COMPLETION_INDEX)
        if rjob is None or index is None:
            return pod.get("metadata", {}).get("name", "?")
        return f"{rjob}-{index}"

    def expected_replicas(self, job: dict[str, Any]) -> list[str]:
        nodes = self.nodes(job)
        return [f"{TRAINJOB_REPLICATED_JOB}-{i}" for i in range(nodes or 0)]

    def pod_name_of(self, job_name: str, replica: str) -> str:
        # JobSet names the Job <jobset>-node-0; the Job names its pods <job>-<index>-<random>.
        index = replica.rpartition("-")[2]
        return f"{job_name}-{TRAINJOB_REPLICATED_JOB}-0-{index}"

    def nodes(self, job: dict[str, Any]) -> int | None:
        n = (job.get("spec", {}).get("trainer") or {}).get("numNodes")
        return int(n) if n is not None else None

    def condition(self, job: dict[str, Any]) -> str:
        """No Running condition exists: derived from the child Job counts in ``jobsStatus``."""
        if job.get("metadata", {}).get("deletionTimestamp"):
            return "Deleting"
        ended = self.terminal(job)
        if ended:
            return ended
        if any(c.get("type") == "Suspended" for c in _true_conditions(job)):
            return "Suspended"
        jobs = job.get("status", {}).get("jobsStatus") or []
        if jobs and all(int(j.get("ready") or 0) + int(j.get("succeeded") or 0) for j in jobs):
            return "Running"  # every child Job has all its pods ready (or done)
        if jobs:
            return "Created"  # the JobSet exists; its pods are pending or (re)starting
        return "Pending"  # no JobSet yet: being built, or it cannot be (see the events)

    def start_time(self, job: dict[str, Any]) -> str | None:
        # A TrainJob has no startTime; a resume resets the clock, as activeDeadlineSeconds does.
        for c in job.get("status", {}).get("conditions") or []:
            if c.get("type") == "Suspended" and c.get("status") == "False":
                return c.get("lastTransitionTime")
        return job.get("metadata", {}).get("creationTimestamp")

    def reported_progress(self, job: dict[str, Any]) -> dict[str, Any] | None:
        """``status.trainerStatus`` (Trainer v2.2+, feature gate TrainJobStatus, KEP-2779):
        ``progressPercentage``, ``estimatedRemainingSeconds``, ``metrics`` (name/value strings)
        and ``lastUpdatedTime``, as rank 0 last posted them
        (``trainer/telemetry/progress_api.py``)."""
        return job.get("status", {}).get("trainerStatus") or None

    def owners(self, job_name: str) -> tuple[str, ...]:
        # The TrainJob and its JobSet share the name (TrainJobResourcesCreationFailed is the
        # TrainJob's); the Job (FailedCreate, BackoffLimitExceeded) is <job>-node-0.
        return (job_name, f"{job_name}-{TRAINJOB_REPLICATED_JOB}-0")


PYTORCHJOB_KIND = PyTorchJobKind()
TRAINJOB_KIND = TrainJobKind()
KINDS: dict[str, JobKind] = {k.name: k for k in (PYTORCHJOB_KIND, TRAINJOB_KIND)}


def kind_of(obj: dict[str, Any]) -> JobKind:
    """The adapter for a job dict or manifest, by its apiVersion and kind."""
    for k in KINDS.values():
        if obj.get("apiVersion") == k.api.api_version and obj.get("kind") == k.api.kind:
            return k
    raise ValueError(f"not a job ddpjob knows (got {obj.get('apiVersion')} {obj.get('kind')})")
