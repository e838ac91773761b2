"""Which pod runs global rank 0 of a job, for the commands that read one pod's log once
(``logs`` without ``-f``, ``status``'s progress, ``plot``). ``logs -f`` decides as it follows
(``controller.jobs.follow``).

A fixed-size job's rank 0 is its Master pod. An elastic job (Workers only) has none: the
rendezvous decides, at every (re)start, which worker runs global rank 0, and only that process
prints the trainer's JSON events (its ``start`` event names its pod's ``hostname``). So rank 0's
pod is the worker whose log carries the newest event: read from each worker's tail, or, when no
tail has one (a rank 0 printing many plain lines), from each whole log, streamed.
"""

from __future__ import annotations

from typing import Any

from controller.errors import ClusterError
from controller.jobs.read.apis import PYTORCHJOB_KIND, JobKind, selects
from controller.jobs.read.explain import is_elastic, node_rank
from controller.jobs.read.loglines import split_timestamp
from controller.kube.client import Cluster
from controller.kube.logstream import LogStreamBroken
from controller.kubeflow import CONTAINER, LABEL_JOB_NAME, LABEL_REPLICA_TYPE
from trainer.contract import START, is_event, parse_event


def rank0_pod(
    cluster: Cluster,
    namespace: str,
    job: dict[str, Any],
    kind: JobKind = PYTORCHJOB_KIND,
    *,
    pods: list[dict[str, Any]] | None = None,
    tail_lines: int = 200,
    scan: bool = False,
) -> tuple[dict[str, Any] | None, list[str] | None]:
    """The pod of global rank 0 (None if there is none yet) and, for an elastic job, the last
    ``tail_lines`` lines of its log (with their timestamps) that were read to find it, else None.
    ``pods``: the job's pods, where already read (else the pods asked for are listed).
    ``scan``: when no worker's tail shows an event, look for ``start`` events in whole logs."""
    name = job["metadata"]["name"]
    if not is_elastic(job):  # a fixed-size job (either API): node rank 0's pod
        selector = kind.rank_selector(name, 0)
        rank0 = _pods(cluster, namespace, selector, pods)
        return (rank0[-1] if rank0 else None), None
    workers = _pods(
        cluster, namespace, f"{LABEL_JOB_NAME}={name},{LABEL_REPLICA_TYPE}=worker", pods
    )
    started = [
        p for p in sorted(workers, key=node_rank) if p.get("status", {}).get("phase") != "Pending"
    ]
    best: tuple[tuple[str, int], dict[str, Any], list[str]] | None = None
    for pod in started:
        try:
            text = cluster.read_log(
                pod["metadata"]["name"],
                namespace,
                container=CONTAINER,
                tail_lines=tail_lines,
                timestamps=True,
            )
        except ClusterError:
            continue
        split = [split_timestamp(line) for line in text.splitlines()]
        stamps = [ts for ts, body in split if ts is not None and parse_event(body) is not None]
        if stamps and (best is None or stamps[-1] > best[0]):
            best = (stamps[-1], pod, text.splitlines())
    if best is not None:
        return best[1], best[2]
    if scan:
        newest: tuple[tuple[str, int], dict[str, Any]] | None = None
        for pod in started:
            stamp = _last_start(cluster, namespace, pod["metadata"]["name"])
            if stamp is not None and (newest is None or stamp > newest[0]):
                newest = (stamp, pod)
        if newest is not None:
            return newest[1], None
    return None, None


def _pods(
    cluster: Cluster, namespace: str, selector: str, pods: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """The pods ``selector`` selects: among ``pods`` where read, else listed."""
    if pods is None:
        return cluster.list_pods(namespace, selector)
    return [p for p in pods if selects(selector, p)]


def _last_start(cluster: Cluster, namespace: str, pod: str) -> tuple[str, int] | None:
    """The timestamp of the last ``start`` event in a pod's whole log (read as a stream)."""
    last = None
    try:
        stream = cluster.stream_log(pod, namespace, container=CONTAINER, follow=False)
    except (LogStreamBroken, ClusterError):
        return None
    try:
        for batch in stream.batches():
            for line in batch:
                ts, body = split_timestamp(line)
                if is_event(body, START):
                    last = ts
    except LogStreamBroken:
        pass
    finally:
        stream.close()
    return last
