"""Find a job by name, whichever API it is: the commands that take a NAME look it up in every
job API the cluster serves (a GET each), and a name taken in both is a clear error unless
``--api`` says which.
"""

from __future__ import annotations

from typing import Any

from controller.errors import NotFound, UserError
from controller.jobs.read.apis import KINDS, JobKind
from controller.kube.client import Cluster


def find_job(
    cluster: Cluster, name: str, namespace: str, api: str | None = None, *, where: str = "job"
) -> tuple[JobKind, dict[str, Any]]:
    """(adapter, job) for the job ``namespace/name``; ``api`` ("pytorchjob" / "trainjob")
    looks in that API only. NotFound when no served API has it; UserError when two do."""
    if api is not None:
        kind = KINDS[api]
        return kind, cluster.get_job(name, namespace, api=kind.api)
    found: list[tuple[JobKind, dict[str, Any]]] = []
    served = 0
    for kind in KINDS.values():
        try:
            found.append((kind, cluster.get_job(name, namespace, api=kind.api)))
            served += 1
        except NotFound as e:
            if e.reason == "NamespaceNotFound":
                raise
            served += e.reason != "APINotServed"
    if len(found) == 1:
        return found[0]
    if found:
        kinds = " and a ".join(k.api.kind for k, _ in found)
        raise UserError(
            f"{where}: {namespace}/{name} is both a {kinds} (got 2 jobs of that name). "
            f"Say which with --api {' or --api '.join(k.name for k, _ in found)}"
        )
    apis = " or ".join(k.api.kind for k in KINDS.values())
    raise NotFound(
        f"{where}: job {namespace}/{name} not found (got no {apis} of that name"
        + ("" if served else "; the cluster serves neither API")
        + ")",
        reason="NotFound" if served else "APINotServed",
        namespace=namespace,
        name=name,
        kind="job",
    )
