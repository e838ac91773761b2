"""A node that failed the job twice is left behind: the faults of the job's ranks, by node, kept
on the job itself, and the job's next pods kept off a node that had ``avoid_node_after`` of them.

A fault is a rank of the job that was stuck when the job restarted itself (the watchdog's
culprit), slow in the pre-flight when that restarts the job, or lost: its process died while
its peers trained (rank 0 asks every rank through the c10d store; the ones that do not answer
are the lost ones). Rank 0 records it, one per node per run, in the job's annotation
``ddpjob.io/node-faults`` (``trainer/contract.py``), which ``status`` reads.

Where a node has had ``avoid_node_after`` faults, rank 0 patches a node affinity onto the job
that the operator gives the pods it creates next: preferred, weight 100, ``metadata.name NotIn``
the avoided nodes, so the scheduler places them elsewhere while other nodes can hold them, and
on the avoided node when none can (a job that fits only there still runs). The annotation
``ddpjob.io/avoided-nodes`` names them. Why this way, and not another:

- A PyTorchJob's pod templates may change while it runs (its webhook validates an update as a
  create), and the training operator builds each pod it (re)creates from the template it reads
  then: the pods that replace the ones that exit 138 carry the patch. A JSON merge patch with
  the job's ``resourceVersion`` fails on a concurrent change (409) and is tried again.
- A TrainJob's pods restart in place (its Jobs' ``restartPolicy: OnFailure``): the container
  starts again on the same node, and no pod is created while the job lives. Its Jobs' templates
  are immutable, and JobSet (v0.12) resumes suspended Jobs with new labels, annotations, node
  selectors, tolerations and scheduling gates only, not affinity. So a TrainJob's faults are
  recorded and ``status`` lists the nodes it would avoid, and nothing is patched.
- A job in a Kueue queue is not patched either: Kueue compares a running job's pod templates
  with its Workload's and replaces a Workload that no longer matches (the job is stopped and
  queued again). Its faults are recorded.
- Tainting or cordoning the node would keep every workload off it, and needs cluster-wide
  rights on nodes: this needs ``get`` and ``patch`` of the job in its namespace only (the Role
  ``ddpjob-trainer`` in k8s/rbac.yaml).

Nothing here fails the run or the restart: a patch the API refuses is said in the ``bad_node``
event's ``problem`` and on stderr, once per fault.
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from trainer.contract import (
    AVOIDED_NODES_ANNOTATION,
    BAD_NODE,
    JOB_API_ENV,
    JOB_NAME_ENV,
    NAMESPACE_ENV,
    NODE_FAULTS_ANNOTATION,
    NODE_FAULTS_KEPT,
    TORCHELASTIC_RESTART_COUNT,
    read_node_faults,
)
from trainer.health.watchdog import where

log = logging.getLogger(__name__)

#: Where a pod's service-account token, its CA and its namespace are mounted.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: The job APIs' resource paths (the operators' contract: controller/kubeflow.py names them
#: for the controller).
RESOURCES = {
    "pytorchjob": "/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{name}",
    "trainjob": "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}",
}
#: Kueue's queue label on a job.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: One request's bound, and the tries of a patch that meets a concurrent change.
REQUEST_TIMEOUT_S = 10.0
PATCH_TRIES = 4
#: How long rank 0 waits for the other ranks to say they are alive after a peer was lost.
LOST_WAIT_S = 5.0
#: The preferred anti-affinity's weight (the most a preferred term can weigh).
WEIGHT = 100


class ApiProblem(Exception):
    """The job could not be read or patched: one line that says why and what would fix it;
    ``status``: the API's HTTP status, where it answered."""

    def __init__(self, line: str, status: int | None = None):
        super().__init__(line)
        self.status = status


# ---------------------------------------------------------------------------------------------
# The record (pure)


def add_fault(faults: list[dict[str, Any]], fault: dict[str, Any]) -> list[dict[str, Any]]:
    """``faults`` with ``fault``: one per node per run (a run that loses two ranks of one pod
    has one fault there), the newest :data:`NODE_FAULTS_KEPT`."""
    same = [f for f in faults if (f.get("node"), f.get("run")) == (fault["node"], fault["run"])]
    if same:
        return list(faults)
    return [*faults, fault][-NODE_FAULTS_KEPT:]


def to_avoid(faults: list[dict[str, Any]], after: int) -> list[str]:
    """The nodes with at least ``after`` faults, in the order they reached it."""
    counts: collections.Counter[str] = collections.Counter()
    avoided: list[str] = []
    for f in faults:
        node = f.get("node")
        if not node:
            continue
        counts[node] += 1
        if after and counts[node] >= after and node not in avoided:
            avoided.append(node)
    return avoided


def avoid_affinity(nodes: list[str]) -> dict[str, Any]:
    """A pod affinity that prefers any node but ``nodes`` (by name, not by a label that may
    differ from it)."""
    term = {
        "weight": WEIGHT,
        "preference": {
            "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": list(nodes)}]
        },
    }
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}


def job_patch(
    api: str, job: dict[str, Any], faults: list[dict[str, Any]], avoid: list[str]
) -> tuple[dict[str, Any], str | None]:
    """The merge patch that records ``faults`` on ``job`` and, on a PyTorchJob outside a queue,
    gives its pod templates the affinity that avoids ``avoid``; and why the pods are not told,
    where they are not (None: they are, or there is nothing to avoid)."""
    meta = job.get("metadata", {})
    annotations = {NODE_FAULTS_ANNOTATION: json.dumps(faults, separators=(",", ":"))}
    patch: dict[str, Any] = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
    why_not = None
    if avoid and api == "trainjob":
        why_not = (
            "a TrainJob's pods restart in place and its Jobs take no new affinity: "
            "re-create the job to move it"
        )
    elif avoid and (meta.get("labels") or {}).get(QUEUE_LABEL):
        why_not = "Kueue re-queues a running job whose pods change: re-create the job to move it"
    elif avoid:
        annotations[AVOIDED_NODES_ANNOTATION] = json.dumps(avoid)
        affinity = avoid_affinity(avoid)
        replicas = job.get("spec", {}).get("pytorchReplicaSpecs") or {}
        patch["spec"] = {
            "pytorchReplicaSpecs": {
                rtype: {"template": {"spec": {"affinity": affinity}}} for rtype in replicas
            }
        }
    patch["metadata"]["annotations"] = annotations
    return patch, why_not


# ---------------------------------------------------------------------------------------------
# The job on the API server


class JobApi:
    """The trainer's own job, read and patched with the pod's service account."""

    def __init__(self, api: str, url: str, token_file: Path, ca_file: Path):
        self.api, self.url, self.token_file = api, url, token_file
        self.context = ssl.create_default_context(cafile=str(ca_file))

    @classmethod
    def in_cluster(cls) -> JobApi:
        """From the pod: its job (``DDPJOB_JOB_API``, ``DDPJOB_JOB_NAME``, ``DDPJOB_NAMESPACE``:
        controller/render/pod.py), the API server (``KUBERNETES_SERVICE_*``) and its service
        account's token; ApiProblem where one is missing."""
        api, name = os.environ.get(JOB_API_ENV, ""), os.environ.get(JOB_NAME_ENV, "")
        namespace = os.environ.get(NAMESPACE_ENV, "")
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if api not in RESOURCES or not name or not namespace:
            raise ApiProblem(
                f"not in a ddpjob pod (no {JOB_API_ENV}, {JOB_NAME_ENV} and {NAMESPACE_ENV})"
            )
        if not host:
            raise ApiProblem("not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST)")
        token, ca = SERVICE_ACCOUNT_DIR / "token", SERVICE_ACCOUNT_DIR / "ca.crt"
        if not token.is_file():
            raise ApiProblem(
                f"no service-account token in {SERVICE_ACCOUNT_DIR}: give the pods "
                "service_account: ddpjob-trainer (k8s/rbac.yaml), with its token mounted"
            )
        host = f"[{host}]" if ":" in host else host
        path = RESOURCES[api].format(namespace=namespace, name=name)
        return cls(api, f"https://{host}:{port}{path}", token, ca)

    def get(self) -> dict[str, Any]:
        return self._request("GET", None)

    def merge_patch(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("PATCH", body)

    def _request(self, method: str, body: dict[str, Any] | None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token_file.read_text().strip()}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/merge-patch+json")
        try:
            with urllib.request.urlopen(
                request, timeout=REQUEST_TIMEOUT_S, context=self.context
            ) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            raise ApiProblem(_http_problem(e, method, self.url), e.code) from e
        except (OSError, ValueError) as e:
            raise ApiProblem(f"{method} {self.url}: {type(e).__name__}: {e}") from e


def _http_problem(e: urllib.error.HTTPError, method: str, url: str) -> str:
    try:
        message = json.loads(e.read()).get("message") or ""
    except (ValueError, OSError):
        message = ""
    line = f"{method} {url}: {e.code} {e.reason}" + (f": {message}" if message else "")
    if e.code == 403:
        line += (
            ". Run the pods as a service account allowed to get and patch their job "
            "(service_account: ddpjob-trainer, k8s/rbac.yaml)"
        )
    return line


# ---------------------------------------------------------------------------------------------
# Rank 0's part


class BadNodes:
    """Rank 0's record of the job's faults by node; on other ranks it does nothing.

    ``places``: every rank's ``{"hostname", "node"}`` (``watchdog.where``), in rank order, to
    name a lost rank's node. ``job``: how to reach the job (for tests: another JobApi)."""

    def __init__(
        self,
        after: int,
        is_main: bool,
        report: Any,
        places: list[dict[str, Any]],
        job: JobApi | None = None,
    ):
        self.after, self.enabled = after, is_main and after > 0
        self.report, self.places, self._job = report, places, job
        self.run = uuid.uuid4().hex[:8]  # this run of the job: one fault per node per run
        self.rank, self.store = 0, None  # this rank, and the group's store (track_nodes)

    def fault(self, cause: str, *, rank: int | None, node: str | None, pod: str | None) -> None:
        """Rank ``rank`` on ``node`` failed the job (``cause``): record it on the job and, where
        its node has had ``after`` faults, keep the job's next pods off it."""
        if not self.enabled or rank is None:
            return
        if not node and 0 <= rank < len(self.places):
            node, pod = self.places[rank].get("node"), pod or self.places[rank].get("hostname")
        fields: dict[str, Any] = {"node": node, "rank": rank, "pod": pod, "cause": cause}
        if not node:
            self._say(fields, None, [], "the rank's node is not known (not in a pod)")
            return
        fault = {**fields, "at": round(time.time(), 3), "run": self.run}
        try:
            faults, avoid, why_not = self._record(fault)
        except ApiProblem as e:
            self._say(fields, None, [], str(e))
            return
        self._say(fields, faults, avoid, why_not)

    def peer_lost(self, cause: str) -> None:
        """This rank lost a peer (``cause``: the error), on its way out: every rank but 0 says
        it is alive in the store; rank 0 waits :data:`LOST_WAIT_S` for them, and each rank that
        did not is a fault of its node. None when more than half are silent (then it cannot
        tell which), nor when the store is gone too (rank 0's process held it)."""
        store, world_size = self.store, len(self.places)
        if store is None or world_size < 2:
            return
        prefix = f"ddpjob/lost/{os.environ.get(TORCHELASTIC_RESTART_COUNT, '0')}/"
        try:
            store.set_timeout(datetime.timedelta(seconds=LOST_WAIT_S))
            if not self.enabled:
                store.set(f"{prefix}alive/{self.rank}", "1")
                store.add(f"{prefix}alive", 1)
                return
            silent = _silent_ranks(store, prefix, world_size)
        except Exception as e:  # the store went with the peer
            log.warning("bad nodes: cannot tell which rank was lost (%s)", e)
            return
        if not silent or len(silent) > max(1, (world_size - 1) // 2):
            return
        for rank in silent:
            self.fault(f"lost: rank {rank} ({cause})", rank=rank, node=None, pod=None)

    def _record(self, fault: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str], str | None]:
        job_api = self._job or JobApi.in_cluster()
        self._job = job_api
        for attempt in range(PATCH_TRIES):
            job = job_api.get()
            faults = add_fault(read_node_faults(job)[0], fault)
            avoid = to_avoid(faults, self.after)
            patch, why_not = job_patch(job_api.api, job, faults, avoid)
            try:
                job_api.merge_patch(patch)
                return faults, avoid if why_not is None else [], why_not
            except ApiProblem as e:  # 409: the job changed since it was read
                if e.status != 409 or attempt == PATCH_TRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _say(
        self,
        fields: dict[str, Any],
        faults: list[dict[str, Any]] | None,
        avoid: list[str],
        problem: str | None,
    ) -> None:
        node = fields["node"]
        count = sum(1 for f in faults or [] if f.get("node") == node) if faults else None
        self.report.event(
            BAD_NODE,
            **fields,
            faults=count,
            after=self.after,
            avoided=node in avoid,
            nodes=avoid,
            problem=problem,
        )
        if problem:
            log.warning("bad node %s (rank %s): not kept off: %s", node, fields["rank"], problem)
        elif node in avoid:
            log.warning(
                "bad node %s: %d faults of this job there; its next pods avoid %s",
                node,
                count,
                ", ".join(avoid),
            )


def track_nodes(after: int, env: Any, report: Any) -> BadNodes:
    """Every rank's BadNodes (collective: rank 0 learns every rank's pod and node, when
    ``after`` asks for it and there are other ranks)."""
    places: list[dict[str, Any]] = [where()]
    store = None
    if after > 0 and env.world_size > 1 and env.distributed:
        import torch.distributed as dist

        from trainer import distributed as dist_

        places = dist_.gather_objects(where(), what="places") or [{}] * env.world_size
        store = dist.distributed_c10d._get_default_store()
    bad = BadNodes(after, env.is_main, report, places)
    bad.rank, bad.store = env.rank, store
    return bad


def _silent_ranks(store: Any, prefix: str, world_size: int) -> list[int]:
    deadline = time.monotonic() + LOST_WAIT_S
    while store.add(f"{prefix}alive", 0) < world_size - 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    return [r for r in range(1, world_size) if not store.check([f"{prefix}alive/{r}"])]
