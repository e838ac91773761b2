"""What the user should do about an error, and the commands to inspect a job.

The layers below say what happened (errors carry a status and a reason code); the words that
name the fix live here, in one place, with one spelling of the CLI (:data:`CLI`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controller.errors import (
    BadKubeconfig,
    ClusterError,
    Conflict,
    DdpjobError,
    Forbidden,
    NotFound,
    Unreachable,
)
from controller.kubeflow import (
    JOBSET_VERSION,
    LABEL_JOB_NAME,
    OPERATOR_VERSION,
    PYTORCHJOB,
    TRAINER_VERSION,
    TRAINJOB,
)

if TYPE_CHECKING:
    from controller.jobs.read.apis import JobKind

#: How every hint spells the CLI (`ddpjob`, the console script, is the same program).
CLI = "python -m controller"

KUBECONFIG_HINT = (
    "Point at a cluster: `export KUBECONFIG=/path/to/kubeconfig` (for the local cluster: "
    "`make cluster-up`, then `export KUBECONFIG=$PWD/.cluster/kubeconfig`)"
)

OPERATOR_INSTALL = (
    "Install the Kubeflow training operator: `kubectl apply --server-side -k "
    '"github.com/kubeflow/training-operator.git/manifests/overlays/standalone'
    f'?ref={OPERATOR_VERSION}"`'
)

TRAINER_INSTALL = (
    f"Install Kubeflow Trainer {TRAINER_VERSION} (it brings JobSet {JOBSET_VERSION}) and its "
    "runtimes: `kubectl apply --server-side -k "
    f'"github.com/kubeflow/trainer.git/manifests/overlays/manager?ref={TRAINER_VERSION}"`, then '
    "`kubectl apply --server-side -k "
    f'"github.com/kubeflow/trainer.git/manifests/overlays/runtimes?ref={TRAINER_VERSION}"`'
)


def hint(err: DdpjobError) -> str:
    """The sentence that names the fix for ``err``; "" when the message says it all."""
    from controller.jobs.wait import WaitTimeout

    if isinstance(err, WaitTimeout):
        if err.deleting:
            selector = err.pods_selector or f"{LABEL_JOB_NAME}={err.name}"
            return f"See `kubectl get pods -l {selector} -n {err.namespace}`"
        return see_status(err.name, err.namespace)
    if isinstance(err, BadKubeconfig):
        if err.reason == "NoKubeconfig":
            return f"Is the cluster up? {KUBECONFIG_HINT}"
        return (
            "Fix the kubeconfig (`kubectl config view` shows what it holds), or point at "
            "another one: `export KUBECONFIG=/path/to/kubeconfig`"
        )
    if not isinstance(err, ClusterError):
        return ""
    reason = err.reason
    if isinstance(err, Unreachable):
        if reason == "Unauthorized":
            return "Refresh the kubeconfig's token or certificate"
        if reason == "GaveUp":
            return "Check the cluster, then run the command again: the job itself is not affected"
        if reason == "ClientMissing":
            return "Install the controller extra: `pip install 'ddpjob[controller]'`"
        return f"Is the cluster up? {KUBECONFIG_HINT}"
    if isinstance(err, Forbidden):
        return (
            "Ask a cluster admin for a Role with that verb on that resource (k8s/rbac.yaml "
            f"lists what ddpjob needs), and run `{CLI} doctor` to see every missing permission"
        )
    if isinstance(err, Conflict):
        return "Use --replace to delete it and submit again, or change `name:` in the spec"
    if isinstance(err, NotFound):
        if reason == "APINotServed" and err.kind == PYTORCHJOB.kind:
            return OPERATOR_INSTALL
        if reason == "APINotServed" and err.kind == TRAINJOB.kind:
            return TRAINER_INSTALL
        if reason == "NamespaceNotFound":
            return (
                f"Create it (`kubectl create namespace {err.namespace}`) or pick another with "
                "-n / `namespace:`"
            )
        if reason == "NotFound" and err.kind and err.name:
            return f"Check the name and namespace: `{CLI} list -n {err.namespace}`"
        return ""
    if reason == "WebhookUnreachable":
        return f"Is the operator running? `{CLI} doctor`"
    if reason == "ServerError":
        return "Retry; if it persists, check the API server's health"
    return ""


def error_lines(err: DdpjobError) -> list[str]:
    """The ``error:`` lines the CLI prints for ``err``: its message, then the hint."""
    from controller.errors import UserError

    if isinstance(err, UserError) and not isinstance(err, BadKubeconfig):
        return [f"error: {p}" for p in err.problems]
    first, *rest = str(err).splitlines() or [type(err).__name__]
    fix = hint(err)
    if fix:
        first = f"{first}. {fix}"
    return [f"error: {first}", *rest]


def kubectl_hints(
    name: str,
    namespace: str,
    kind: JobKind | None = None,
    *,
    elastic: bool = False,
    max_pods: int = 1,
) -> str:
    """The commands to inspect a submitted job (a PyTorchJob unless ``kind`` says), one per
    line.

    Every pod named exists: an elastic job (Workers only, up to ``max_pods``) has no master,
    and which worker runs rank 0 is the rendezvous's choice, so its logs are named by label and
    ``logs -f`` (which finds rank 0) is offered beside them."""
    from controller.jobs.read.apis import PYTORCHJOB_KIND

    kind = kind or PYTORCHJOB_KIND
    if elastic:
        logs = [
            f"  kubectl logs -f -l {kind.pods_selector(name)} -c {kind.container} -n {namespace} "
            f"--prefix --max-log-requests {max(max_pods, 1)}",
            f"  {CLI} logs -f {name} -n {namespace}   # rank 0, on the worker the rendezvous "
            "picked",
            f"  {CLI} logs -f {name} -n {namespace} --all   # every worker",
        ]
    elif kind.name == PYTORCHJOB_KIND.name:  # the operator names the master pod exactly
        logs = [f"  kubectl logs -f {name}-master-0 -c {kind.container} -n {namespace}"]
    else:  # a Job's pods carry a random suffix: by label
        logs = [
            f"  kubectl logs -f -l {kind.rank_selector(name, 0)} -c {kind.container} -n {namespace}"
        ]
    return "\n".join(
        [
            f"  kubectl get {kind.name} {name} -n {namespace}",
            f"  kubectl get pods -l {kind.pods_selector(name)} -n {namespace}",
            *logs,
            f"  kubectl describe {kind.name} {name} -n {namespace}",
            f"  {CLI} status {name} -n {namespace}",
        ]
    )


def see_status(name: str, namespace: str) -> str:
    return f"See `{CLI} status {name} -n {namespace}`"
