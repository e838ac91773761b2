"""Create a job and what goes with it: the job, then each object owned by it (a workdir's
ConfigMap, what ``monitoring`` asks for), or none of them.

The job comes first, so the others can name it as their owner (its uid exists only once the job
does) and Kubernetes' garbage collector deletes them with the job, by ``delete``, a TTL or
``submit --replace``. Its pods may exist a moment before a workdir's ConfigMap: they wait in
ContainerCreating until the kubelet can mount it, a retry of a second or so. When the API server
refuses one of them (a quota, RBAC, a size limit lower than ours), the job is deleted again and
the refusal is raised: nothing of the submit is left. A client killed in between leaves a job
whose pods wait for a ConfigMap, which ``status`` shows and ``delete`` removes: never an object
that nothing owns.

An object of the same name still there is, after ``submit --replace`` or a ``delete`` a moment
ago, the previous job's, which the garbage collector removes right after that job: its create is
tried again for :data:`GONE_WITHIN_S` seconds (the CLI may create ConfigMaps, not read them, so
it cannot ask whose it is), then refused like any other.
"""

from __future__ import annotations

import time
from typing import Any

from controller.errors import ClusterError, DdpjobError
from controller.kube.client import Cluster, api_of

#: How long a previous job's objects may take to follow that job.
GONE_WITHIN_S = 30.0


def create(
    cluster: Cluster, manifest: dict[str, Any], beside: list[dict[str, Any]]
) -> dict[str, Any]:
    """Create ``manifest``'s job, then each of ``beside`` owned by it; the job as created. On a
    refusal of one of them the job is deleted (and the others with it) and the error raised."""
    job = cluster.create_job(manifest)
    try:
        for obj in beside:
            _create_owned(cluster, obj, job)
    except DdpjobError:
        meta = job["metadata"]
        cluster.delete_job(meta["name"], meta["namespace"], api=api_of(job))
        raise
    return job


def _create_owned(cluster: Cluster, obj: dict[str, Any], job: dict[str, Any]) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while True:
        try:
            cluster.create_beside(obj, job)
            return
        except ClusterError as e:
            if e.reason != "AlreadyExists":
                raise
            if time.monotonic() >= deadline:
                meta = obj["metadata"]
                raise ClusterError(
                    f"submit: {obj['kind']} {meta['namespace']}/{meta['name']} already exists "
                    f"and did not go within {GONE_WITHIN_S:.0f} s, so it is not a deleted "
                    "job's (got 409 AlreadyExists). Delete it, or give the job another name",
                    reason="InTheWay",
                ) from e
            time.sleep(0.5)
