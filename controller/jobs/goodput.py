"""A job's goodput, read from the cluster: :func:`read_goodput` fetches what
``controller.jobs.read.goodput`` adds up (the job's events, its Kueue Workload, its pods, and
the trainer's newest ``goodput`` event from rank 0's log) and adds it up.
"""

from __future__ import annotations

import time
from typing import Any

from controller.errors import ClusterError
from controller.jobs.rank0 import rank0_pod
from controller.jobs.read.apis import JobKind
from controller.jobs.read.goodput import account, newest_ledger
from controller.jobs.read.queue import queue_name, workload_of
from controller.jobs.read.trainer_events import TrainerEvents
from controller.kube.client import Cluster
from controller.kubeflow import WORKLOAD
from trainer.contract import GOODPUT, parse_event

#: Lines of rank 0's log read for its newest ``goodput`` event (one is printed every window).
TAIL_LINES = 500


def read_goodput(
    cluster: Cluster,
    kind: JobKind,
    job: dict[str, Any],
    *,
    pods: list[dict[str, Any]] | None = None,
    trainer: TrainerEvents | None = None,
    price_per_gpu_hour: float | None = None,
) -> dict[str, Any]:
    """The accounting of ``job`` (``controller.jobs.read.goodput.account``). ``pods`` and
    ``trainer`` (what rank 0's log said) are read here when the caller has not read them."""
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    if pods is None:
        pods = cluster.list_pods(namespace, kind.pods_selector(name))
    ledger = trainer.newest(GOODPUT) if trainer is not None else None
    if ledger is None:
        ledger = _ledger_from_log(cluster, kind, job, namespace)
    try:
        events = cluster.list_events(namespace, field_selector=f"involvedObject.name={name}")
    except ClusterError:
        events = []
    return account(
        kind,
        job,
        pods,
        ledger=ledger,
        events=events,
        workload=_workload(cluster, job, namespace),
        now=time.time(),
        price_per_gpu_hour=price_per_gpu_hour,
    )


def _ledger_from_log(
    cluster: Cluster, kind: JobKind, job: dict[str, Any], namespace: str
) -> dict[str, Any] | None:
    """The newest ``goodput`` event in rank 0's log; in the run before, when the current one
    has not printed one yet (a container just restarted)."""
    pod, tail = rank0_pod(cluster, namespace, job, kind, tail_lines=TAIL_LINES)
    if pod is None:
        return None
    if tail is not None and (found := _newest(tail)) is not None:
        return found
    for previous in (False, True):
        try:
            text = cluster.read_log(
                pod["metadata"]["name"],
                namespace,
                container=kind.container,
                tail_lines=TAIL_LINES,
                previous=previous,
            )
        except ClusterError:  # no log yet, or no run before
            continue
        if (found := _newest(text.splitlines())) is not None:
            return found
    return None


def _newest(lines: list[str]) -> dict[str, Any] | None:
    return newest_ledger([e for line in lines if (e := parse_event(line)) is not None])


def _workload(cluster: Cluster, job: dict[str, Any], namespace: str) -> dict[str, Any] | None:
    if queue_name(job) is None:
        return None
    try:
        return workload_of(job, cluster.list_objects(WORKLOAD, namespace))
    except ClusterError:  # no Kueue, or RBAC: the events still tell
        return None
