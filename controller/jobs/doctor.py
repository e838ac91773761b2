"""``doctor``: can this cluster run our jobs? Also the preflight of ``submit``.

Each check says what it saw; a failed check names the fix. Checks, in order: the API server
answers; which job APIs it serves (kubeflow.org/v1 pytorchjobs, trainer.kubeflow.org/v1alpha1
trainjobs: the CRDs); for each served API, RBAC lets the current user do every verb the CLI uses
(SelfSubjectAccessReview) and its controller runs (the training operator; the Trainer controller,
with JobSet); and, with a job, its API is served, its runtime exists (TrainJob), the server
accepts the manifest (server-side dry run, which also runs the operator's or Trainer's webhook)
and its pods fit some node (allocatable ``nvidia.com/gpu``, cpu, memory; nodeSelector and
taints); where Kueue is installed, whether it manages each job kind (a job with a queue of a kind
it ignores stays suspended forever) and, with a job naming a queue, that queue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from controller.errors import ClusterError, DdpjobError, Forbidden, NotFound, Refused, UserError
from controller.jobs.queue import Integration, integration, kueue_config
from controller.jobs.read.apis import KINDS, PYTORCHJOB_KIND, TRAINJOB_KIND, JobKind, kind_of
from controller.jobs.read.queue import framework, unmanaged_line
from controller.kube.client import Cluster
from controller.kubeflow import (
    CLUSTER_QUEUE,
    CLUSTER_TRAINING_RUNTIME,
    CONTAINER,
    DEFAULT_RUNTIME,
    JOBSET,
    JOBSET_VERSION,
    KUEUE_VERSION,
    LABEL_PRIORITY_CLASS,
    LABEL_QUEUE,
    LOCAL_QUEUE,
    TRAINJOB_CONTAINER,
    TRAINJOB_REPLICATED_JOB,
    VISIBILITY_GROUP_VERSION,
    WORKLOAD,
    WORKLOAD_PRIORITY_CLASS,
)
from controller.render.workdir import config_map_of

if TYPE_CHECKING:
    from controller.spec import JobSpec

GPU = "nvidia.com/gpu"
OK, WARN, FAIL = "ok", "warn", "FAIL"

# Every API call the CLI makes on pods and events: (verb, resource, group, subresource, why).
POD_PERMISSIONS = [
    ("list", "pods", "", None, "status, logs"),
    ("watch", "pods", "", None, "logs -f"),
    ("get", "pods", "", "log", "logs, status progress"),
    ("list", "events", "", None, "events, pending reasons"),
    ("watch", "events", "", None, "wait, logs -f: why a pod waits"),
]
# Cluster-scoped and only needed for the GPU fit check: missing means a warning.
OPTIONAL_PERMISSIONS = [("list", "nodes", "", None, "GPU fit check")]

# A job each API's validating webhook must refuse: a dry-run create of it proves the webhook,
# i.e. the controller process, answers. PyTorchJob: Master replicas must be 1. TrainJob: its
# runtime must exist.
PROBE_NAME = "ddpjob-doctor-probe"
PROBE_RUNTIME = "ddpjob-doctor-probe-no-such-runtime"
#: The queue label of doctor's own dry-run jobs (no such LocalQueue needs to exist: Kueue's
#: webhook suspends a job with any queue name of a kind it manages).
PROBE_QUEUE = "ddpjob-doctor-probe"

#: What to install when an API is not served (the CLI spells the commands out in its advice).
INSTALL = {
    "pytorchjob": "Install the Kubeflow training operator {version} (`make cluster-up` locally; "
    "on a real cluster its standalone manifests)",
    "trainjob": "Install Kubeflow Trainer {version} with JobSet and its runtimes (`make "
    "cluster-up` locally; on a real cluster the manifests/overlays/manager and runtimes "
    "overlays of kubeflow/trainer at {version})",
}


def permissions(kind: JobKind) -> list[tuple[str, str, str, str | None, str]]:
    """Every verb the CLI uses on ``kind``'s jobs, then on pods and events."""
    api = kind.api
    return [
        ("create", api.plural, api.group, None, "submit"),
        ("get", api.plural, api.group, None, "status, wait"),
        ("list", api.plural, api.group, None, "list, wait"),
        ("watch", api.plural, api.group, None, "wait, logs -f"),
        ("delete", api.plural, api.group, None, "delete, submit --replace"),
        *POD_PERMISSIONS,
    ]


VISIBILITY_GROUP = VISIBILITY_GROUP_VERSION.split("/")[0]

#: Reading where a job stands in Kueue (status, wait, logs -f of a job with a queue): its
#: Workload and its LocalQueue, in the job's namespace. The ClusterQueue and the
#: WorkloadPriorityClass are cluster-scoped: reading them is optional and only warns.
QUEUE_PERMISSIONS = [
    ("list", WORKLOAD.plural, WORKLOAD.group, None, "status, wait of a queued job"),
    ("get", LOCAL_QUEUE.plural, LOCAL_QUEUE.group, None, "status, doctor of a queued job"),
    # Kueue's visibility API, where the cluster serves it: a pending job's position.
    ("get", LOCAL_QUEUE.plural, VISIBILITY_GROUP, "pendingworkloads", "status: position"),
]

#: Shipping a workdir in a ConfigMap: submit creates it, owned by the job (create only: the
#: garbage collector deletes it with the job, and nothing of the CLI reads it back).
WORKDIR_PERMISSIONS = [("create", "configmaps", "", None, "submit with a workdir")]

#: Every verb the CLI uses on either API (k8s/rbac.yaml's Role grants exactly these).
PERMISSIONS = list(
    dict.fromkeys(
        permissions(PYTORCHJOB_KIND)
        + permissions(TRAINJOB_KIND)
        + QUEUE_PERMISSIONS
        + WORKDIR_PERMISSIONS
    )
)


@dataclass
class Check:
    name: str
    status: str  # ok | warn | FAIL
    detail: str

    def line(self) -> str:
        return f"[{self.status:>4}] {self.name}: {self.detail}"


def probe_job(namespace: str, kind: JobKind = PYTORCHJOB_KIND) -> dict[str, Any]:
    meta = {"name": PROBE_NAME, "namespace": namespace}
    head = {"apiVersion": kind.api.api_version, "kind": kind.api.kind, "metadata": meta}
    if kind is TRAINJOB_KIND:
        return {**head, "spec": {"runtimeRef": {"name": PROBE_RUNTIME}}}
    template = {
        "spec": {"containers": [{"name": CONTAINER, "image": "busybox", "command": ["true"]}]}
    }
    return {
        **head,
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 2, "template": template}}},
    }


def run_checks(
    cluster: Cluster, namespace: str, manifest: dict[str, Any] | None = None
) -> list[Check]:
    """All checks, stopping early when the API server or the job's API is missing. Without a
    job every API is checked; with one, its API only (after saying which APIs are served)."""
    checks: list[Check] = []
    try:
        version = cluster.version().get("gitVersion", "?")
    except DdpjobError as e:
        return [Check("cluster reachable", FAIL, str(e))]
    checks.append(Check("cluster reachable", OK, f"{cluster.server} (Kubernetes {version})"))

    wanted = kind_of(manifest) if manifest is not None else None
    served = {name: cluster.job_api_served(kind.api) for name, kind in KINDS.items()}
    for name, kind in KINDS.items():
        checks.append(_check_served(kind, served[name], wanted, any(served.values())))
    if (wanted is not None and not served[wanted.name]) or not any(served.values()):
        return checks

    for name, kind in KINDS.items():
        if not served[name] or (wanted is not None and kind is not wanted):
            continue
        rbac = _check_rbac(cluster, namespace, kind, label=len(KINDS) > 1)
        checks.extend(rbac)
        can_create = not any(
            c.status == FAIL and f"create {kind.api.plural}" in c.detail for c in rbac
        )
        checks.append(_check_controller(cluster, namespace, kind, can_create))
        if kind is TRAINJOB_KIND:
            checks.append(_check_jobset(cluster))
        if manifest is not None:
            if kind is TRAINJOB_KIND:
                checks.append(_check_runtime(cluster, manifest))
            if config_map_of(manifest):
                checks.append(_check_workdir_rbac(cluster, namespace))
            checks.append(_check_manifest(cluster, manifest, can_create))
            checks.append(_check_fit(cluster, manifest))
    kinds = [k for name, k in KINDS.items() if served[name]]
    checks.extend(queue_checks(cluster, namespace, manifest, kinds))
    return _dedupe_optional_rbac(checks)


def _check_served(kind: JobKind, served: bool, wanted: JobKind | None, any_served: bool) -> Check:
    name = f"{kind.api.kind} CRD"
    if served:
        return Check(name, OK, f"{kind.api.crd} served ({kind.api.api_version})")
    install = INSTALL[kind.name].format(version=kind.version)
    detail = f"the API server does not serve {kind.api.crd}. {install}"
    if kind is wanted or not any_served:
        return Check(name, FAIL, detail)
    return Check(
        name,
        WARN,
        f"not served: specs with api: {kind.name} cannot run here (only needed for those). "
        f"{install}",
    )


def _check_rbac(cluster: Cluster, namespace: str, kind: JobKind, *, label: bool) -> list[Check]:
    missing, optional_missing = [], []
    for perms, bucket in ((permissions(kind), missing), (OPTIONAL_PERMISSIONS, optional_missing)):
        for verb, resource, group, sub, used_by in perms:
            allowed, _ = cluster.can_i(
                verb,
                resource,
                group=group,
                namespace=None if resource == "nodes" else namespace,
                subresource=sub,
            )
            if not allowed:
                res = f"{resource}/{sub}" if sub else resource
                bucket.append(f"{verb} {res} (for {used_by})")
    name = f"RBAC ({kind.api.kind})" if label else "RBAC"
    out = []
    if missing:
        out.append(
            Check(
                name,
                FAIL,
                (
                    f"in namespace {namespace} the current user may not: {'; '.join(missing)}. "
                    "Ask an admin to bind a Role with these verbs (k8s/rbac.yaml)"
                ),
            )
        )
    else:
        out.append(Check(name, OK, f"every verb the CLI uses is allowed in {namespace}"))
    if optional_missing:
        out.append(
            Check(
                "RBAC (nodes)",
                WARN,
                (f"may not {'; '.join(optional_missing)}: GPU fit cannot be checked before submit"),
            )
        )
    return out


def _check_workdir_rbac(cluster: Cluster, namespace: str) -> Check:
    """The job ships its workdir in a ConfigMap, which submit creates after the job."""
    for verb, resource, group, _sub, used_by in WORKDIR_PERMISSIONS:
        allowed, _ = cluster.can_i(verb, resource, group=group, namespace=namespace)
        if not allowed:
            return Check(
                "workdir",
                FAIL,
                f"in namespace {namespace} the current user may not {verb} {resource} (for "
                f"{used_by}). Ask an admin to bind k8s/rbac.yaml's Role, or set "
                "workdir_store: s3://BUCKET/PREFIX",
            )
    return Check("workdir", OK, f"may create its ConfigMap in {namespace}")


def _dedupe_optional_rbac(checks: list[Check]) -> list[Check]:
    """One "RBAC (nodes)" line, however many APIs were checked."""
    seen: set[str] = set()
    out = []
    for c in checks:
        if c.name == "RBAC (nodes)" and c.name in seen:
            continue
        seen.add(c.name)
        out.append(c)
    return out


def _check_controller(cluster: Cluster, namespace: str, kind: JobKind, can_create: bool) -> Check:
    name = kind.controller_name
    # 1. A deployment from the upstream manifests: its pod, Ready.
    try:
        pods = cluster.list_pods_all_namespaces(kind.controller_selector)
    except ClusterError:
        pods = []
    ready = [p for p in pods if _pod_ready(p)]
    if ready:
        meta = ready[0]["metadata"]
        return Check(name, OK, f"pod {meta['namespace']}/{meta['name']} is Ready")
    # 2. Its validating webhook answers a dry run (works when it runs outside the cluster).
    # In `default` too when the job's namespace does not exist (the manifest check says so).
    for ns in dict.fromkeys((namespace, "default")) if can_create else ():
        try:
            cluster.create_job(probe_job(ns, kind), dry_run=True)
        except Refused as e:
            if e.reason == "AdmissionDenied" or "must be" in str(e):
                return Check(name, OK, "its admission webhook answered a server-side dry run")
        except NotFound:
            continue
        except ClusterError as e:
            if e.reason == "WebhookUnreachable":
                return Check(
                    name,
                    FAIL,
                    f"its admission webhook does not answer (the controller is down?): {e}",
                )
        break
    if pods:
        meta = pods[0]["metadata"]
        return Check(name, FAIL, f"pod {meta['namespace']}/{meta['name']} is not Ready")
    return Check(
        name,
        WARN,
        (
            "no controller pod is visible and no admission webhook answered; cannot confirm it "
            "runs. A submitted job that gets no status within a minute means it does not"
        ),
    )


def _check_jobset(cluster: Cluster) -> Check:
    name = "JobSet CRD"
    if cluster.job_api_served(JOBSET):
        return Check(name, OK, f"{JOBSET.crd} served (TrainJobs run as JobSets)")
    return Check(
        name,
        FAIL,
        f"the API server does not serve {JOBSET.crd}: the Trainer controller cannot create "
        f"any TrainJob's pods. Install JobSet {JOBSET_VERSION} with its webhook",
    )


def _check_runtime(cluster: Cluster, manifest: dict[str, Any]) -> Check:
    name = "runtime"
    runtime = manifest["spec"].get("runtimeRef", {}).get("name", DEFAULT_RUNTIME)
    try:
        obj = cluster.get_cluster_object(CLUSTER_TRAINING_RUNTIME, runtime)
    except Forbidden:
        return Check(name, WARN, f"not checked: may not get clustertrainingruntimes/{runtime}")
    except NotFound:
        return Check(
            name,
            FAIL,
            f"ClusterTrainingRuntime {runtime} does not exist (the Trainer's webhook refuses a "
            "TrainJob naming it). See `kubectl get clustertrainingruntimes`; install upstream's "
            "runtimes or set runtime: to one that exists",
        )
    jobs = obj.get("spec", {}).get("template", {}).get("spec", {}).get("replicatedJobs") or []
    containers = {
        c.get("name")
        for j in jobs
        if j.get("name") == TRAINJOB_REPLICATED_JOB
        for c in j.get("template", {})
        .get("spec", {})
        .get("template", {})
        .get("spec", {})
        .get("containers", [])
    }
    if obj.get("spec", {}).get("mlPolicy", {}).get("torch") is None:
        return Check(
            name,
            FAIL,
            f"ClusterTrainingRuntime {runtime} has no torch mlPolicy: its pods would get no "
            "PET_* rendezvous env",
        )
    if TRAINJOB_CONTAINER not in containers:
        return Check(
            name,
            FAIL,
            f"ClusterTrainingRuntime {runtime} has no replicated job `node` with container "
            f"`node` (got {sorted(c for c in containers if c) or 'none'}); ddpjob's runtime "
            "patch and the torch plugin need both",
        )
    return Check(
        name, OK, f"ClusterTrainingRuntime {runtime} exists (torch, job and container node)"
    )


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


def _check_manifest(cluster: Cluster, manifest: dict[str, Any], can_create: bool) -> Check:
    name = "job accepted"
    if not can_create:
        return Check(name, WARN, f"not checked: no permission to create {manifest['kind']}s")
    try:
        cluster.create_job(manifest, dry_run=True)
    except UserError as e:
        return Check(name, FAIL, str(e))
    except ClusterError as e:
        if e.reason == "AlreadyExists":
            return Check(name, OK, "server-side dry run passed (a job of this name exists)")
        return Check(name, FAIL, str(e))
    return Check(name, OK, "server-side dry run passed (CRD schema and the controller's webhook)")


# ----------------------------------------------------------------------------------------
# Does the job fit the nodes? (pure, on API dicts)


def pod_requests(manifest: dict[str, Any]) -> list[tuple[str, dict[str, Decimal], dict[str, Any]]]:
    """(replica type, {resource: amount}, pod spec) for every pod the job will create."""
    if manifest.get("kind") == TRAINJOB_KIND.api.kind:
        return _trainjob_requests(manifest)
    out = []
    for rtype, rspec in manifest.get("spec", {}).get("pytorchReplicaSpecs", {}).items():
        pod_spec = rspec.get("template", {}).get("spec", {})
        need: dict[str, Decimal] = {}
        for c in pod_spec.get("containers", []):
            res = c.get("resources", {})
            for key, value in {**res.get("limits", {}), **res.get("requests", {})}.items():
                need[key] = need.get(key, Decimal(0)) + _qty(value)
        out.extend((rtype, need, pod_spec) for _ in range(int(rspec.get("replicas", 1))))
    return out


def _trainjob_requests(
    manifest: dict[str, Any],
) -> list[tuple[str, dict[str, Decimal], dict[str, Any]]]:
    """numNodes pods of resourcesPerNode, placed by the pod spec ddpjob patches in (the
    runtime's own pod settings are not known here)."""
    trainer = manifest["spec"].get("trainer", {})
    res = trainer.get("resourcesPerNode", {})
    need: dict[str, Decimal] = {}
    for key, value in {**res.get("limits", {}), **res.get("requests", {})}.items():
        need[key] = _qty(value)
    pod_spec: dict[str, Any] = {}
    for patch in manifest["spec"].get("runtimePatches") or []:
        template = patch.get("trainingRuntimeSpec", {}).get("template", {})
        for rjob in template.get("spec", {}).get("replicatedJobs", []):
            pod_spec = rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
    return [("node", need, pod_spec) for _ in range(int(trainer.get("numNodes", 1)))]


def _qty(value: Any) -> Decimal:
    from controller.quantity import parse_quantity

    return parse_quantity(str(value))


def node_eligible(node: dict[str, Any], pod_spec: dict[str, Any]) -> bool:
    """nodeSelector matches and every NoSchedule/NoExecute taint is tolerated."""
    if node.get("spec", {}).get("unschedulable"):
        return False
    labels = node.get("metadata", {}).get("labels", {})
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    tolerations = pod_spec.get("tolerations") or []
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _tolerates(t: dict[str, Any], taint: dict[str, Any]) -> bool:
    if t.get("effect") and t["effect"] != taint.get("effect"):
        return False
    if t.get("operator") == "Exists":
        return not t.get("key") or t["key"] == taint.get("key")
    return t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", "")


def with_resource_tolerations(pod_spec: dict[str, Any], need: dict[str, Any]) -> dict[str, Any]:
    """The pod spec as the API server admits it where the ExtendedResourceToleration plug-in
    runs (GKE's GPU clusters and ddpjob's local cluster do): a pod that asks an extended resource
    (``nvidia.com/gpu``) tolerates the taint of that name on the nodes that offer it."""
    extended = sorted(
        k for k, v in need.items() if v > 0 and "/" in k and "kubernetes.io/" not in k
    )
    if not extended:
        return pod_spec
    added = [{"key": k, "operator": "Exists"} for k in extended]
    return {**pod_spec, "tolerations": [*(pod_spec.get("tolerations") or []), *added]}


def fit_problem(manifest: dict[str, Any], nodes: list[dict[str, Any]]) -> str | None:
    """Why the job can never run with all its pods at once on these nodes; None if it can.

    Counts allocatable capacity of empty nodes (what runs there now may finish): a job that
    fails this can never schedule, not merely wait.
    """
    pods = pod_requests(manifest)
    free = [
        {k: _qty(v) for k, v in (n.get("status", {}).get("allocatable") or {}).items()}
        for n in nodes
    ]
    # Largest pods first onto the node with the most room left (first fit decreasing).
    order = sorted(range(len(pods)), key=lambda i: pods[i][1].get(GPU, Decimal(0)), reverse=True)
    for i in order:
        rtype, need, pod_spec = pods[i]
        pod_spec = with_resource_tolerations(pod_spec, need)
        fitting = [
            j
            for j, n in enumerate(nodes)
            if node_eligible(n, pod_spec)
            and all(free[j].get(k, Decimal(0)) >= v for k, v in need.items() if v > 0)
        ]
        if not fitting:
            return _why_not(need, pod_spec, nodes, rtype, len(pods))
        j = max(fitting, key=lambda j: free[j].get(GPU, Decimal(0)))
        for k, v in need.items():
            free[j][k] = free[j].get(k, Decimal(0)) - v
    return None


def _why_not(
    need: dict[str, Decimal],
    pod_spec: dict[str, Any],
    nodes: list[dict[str, Any]],
    rtype: str,
    total: int,
) -> str:
    eligible = [n for n in nodes if node_eligible(n, pod_spec)]
    if not eligible:
        return (
            f"no node matches the pods' nodeSelector/tolerations (got {len(nodes)} nodes, "
            f"nodeSelector {pod_spec.get('nodeSelector') or {}})"
        )
    for key, v in sorted(need.items()):
        best = max(
            _qty((n.get("status", {}).get("allocatable") or {}).get(key, 0)) for n in eligible
        )
        if best < v:
            return (
                f"a {rtype} pod asks {key}: {_fmt(v)} but the largest node has "
                f"{_fmt(best)} allocatable (got {len(eligible)} eligible nodes)"
                + _left_out(key, v, pod_spec, nodes)
            )
    return (
        f"the {total} pods do not fit on the {len(eligible)} eligible nodes together "
        f"(per pod {', '.join(f'{k}: {_fmt(v)}' for k, v in sorted(need.items()))})"
    )


def _left_out(key: str, v: Decimal, pod_spec: dict[str, Any], nodes: list[dict[str, Any]]) -> str:
    """Why the nodes that do have ``v`` of ``key`` are not eligible (GPU nodes are tainted on
    most clusters: a pod that asks for GPUs without the toleration lands nowhere)."""
    big = [
        n
        for n in nodes
        if not node_eligible(n, pod_spec)
        and _qty((n.get("status", {}).get("allocatable") or {}).get(key, 0)) >= v
    ]
    if not big:
        return ""
    tolerations = pod_spec.get("tolerations") or []
    taints = {
        f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}"
        for n in big
        for t in n.get("spec", {}).get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
        and not any(_tolerates(tol, t) for tol in tolerations)
    }
    if taints:
        return (
            f"; {len(big)} nodes with enough are tainted {', '.join(sorted(taints))}, which the "
            "pods do not tolerate (add it to tolerations)"
        )
    return f"; {len(big)} nodes with enough do not match the nodeSelector"


def _fmt(v: Decimal) -> str:
    return str(int(v)) if v == v.to_integral_value() else f"{v:f}"


def _check_fit(cluster: Cluster, manifest: dict[str, Any]) -> Check:
    name = "job fits"
    try:
        nodes = cluster.list_nodes()
    except ClusterError as e:
        return Check(name, WARN, f"not checked: cannot list nodes ({e})")
    problem = fit_problem(manifest, nodes)
    if problem:
        return Check(
            name,
            FAIL,
            f"{problem}; it can never schedule. Lower resources or use --force to submit anyway",
        )
    gpus = sum(_qty((n.get("status", {}).get("allocatable") or {}).get(GPU, 0)) for n in nodes)
    return Check(name, OK, f"all pods fit ({len(nodes)} nodes, {_fmt(gpus)} GPUs allocatable)")


# ----------------------------------------------------------------------------------------
# Kueue: is it there, the job's queue, and can that queue ever admit the job?

#: The checks whose failure is the spec's fault (a name that does not exist): exit 2.
SPEC_CHECKS = ("job accepted", "queue", "priority class")
#: The checks ``submit --force`` may override: the job could never start, but may be wanted.
FORCEABLE = ("job fits", "queue admits")


def queue_checks(
    cluster: Cluster,
    namespace: str,
    manifest: dict[str, Any] | None,
    kinds: list[JobKind] | None = None,
) -> list[Check]:
    """Kueue's checks: without a job, whether Kueue is installed (a warning when not), its
    LocalQueues and whether it manages each served job kind in ``kinds`` (a warning when not:
    only specs with a queue need it); with a job naming a queue, that Kueue manages its kind,
    its LocalQueue exists, the ClusterQueue that feeds can ever admit it, and its
    WorkloadPriorityClass exists."""
    queue = ((manifest or {}).get("metadata", {}).get("labels") or {}).get(LABEL_QUEUE)
    if manifest is not None and not queue:
        return []
    served = cluster.job_api_served(WORKLOAD)
    if not served:
        if queue:
            return [
                Check(
                    "Kueue",
                    FAIL,
                    f"the job names queue {queue} but the cluster has no Kueue (it does not serve "
                    f"{WORKLOAD.crd}): nothing would ever start it. Install Kueue {KUEUE_VERSION}, "
                    "or remove queue from the spec",
                )
            ]
        return [Check("Kueue", WARN, "not installed: only needed for specs with queue:")]
    if manifest is None:
        config = kueue_config(cluster) if kinds else None  # read once, for every kind
        return [
            _check_kueue_queues(cluster, namespace),
            *(
                integration_check(
                    integration(cluster, sample_job(k, namespace), PROBE_QUEUE, config)
                )
                for k in kinds or ()
            ),
        ]
    return [
        integration_check(integration(cluster, manifest, queue), needed=True),
        *_check_local_queue(cluster, manifest, queue),
        *_check_priority_class(cluster, manifest),
    ]


def _check_kueue_queues(cluster: Cluster, namespace: str) -> Check:
    try:
        queues = cluster.list_objects(LOCAL_QUEUE, namespace)
    except ClusterError as e:
        return Check("Kueue", WARN, f"{WORKLOAD.crd} served; cannot list LocalQueues ({e})")
    names = [
        f"{q['metadata']['name']} -> {q.get('spec', {}).get('clusterQueue', '?')}" for q in queues
    ]
    return Check(
        "Kueue",
        OK,
        f"{WORKLOAD.crd} served; LocalQueues in {namespace}: "
        + (", ".join(names) if names else "none (specs with queue: need one)"),
    )


def sample_job(kind: JobKind, namespace: str) -> dict[str, Any]:
    """A small valid job of ``kind`` (one pod; a TrainJob on upstream's default runtime), for
    asking Kueue's webhook about the kind when doctor has no job of the user's."""
    meta = {"name": PROBE_NAME, "namespace": namespace}
    head = {"apiVersion": kind.api.api_version, "kind": kind.api.kind, "metadata": meta}
    if kind is TRAINJOB_KIND:
        return {**head, "spec": {"runtimeRef": {"name": DEFAULT_RUNTIME}}}
    container = {"name": CONTAINER, "image": "busybox", "command": ["true"]}
    master = {"replicas": 1, "template": {"spec": {"containers": [container]}}}
    return {**head, "spec": {"pytorchReplicaSpecs": {"Master": master}}}


def integration_check(found: Integration, *, needed: bool = False) -> Check:
    """Say whether Kueue manages the kind (:class:`controller.jobs.queue.Integration`); a
    failure where the job ``needed`` it (it names a queue), else a warning."""
    kind, name = found.kind, f"Kueue ({found.kind})"
    seen = f"{found.config_note}; {found.webhook_note}"
    if found.managed is None:
        return Check(name, WARN, f"cannot tell whether Kueue manages {kind}s ({seen})")
    if found.managed is False:
        detail = unmanaged_line(kind)
        if found.configured:
            detail += (
                f". Its ConfigMap lists {framework(kind)} already: Kueue reads it only at start, "
                "restart it"
            )
        return Check(name, FAIL if needed else WARN, f"{detail} (seen: {seen})")
    if found.configured is False:
        return Check(
            name,
            WARN,
            f"Kueue manages {kind}s now, but its ConfigMap lacks {framework(kind)}: after its "
            f"next restart it will not ({seen})",
        )
    return Check(name, OK, f"Kueue manages {kind}s ({seen})")


def _check_local_queue(cluster: Cluster, manifest: dict[str, Any], queue: str) -> list[Check]:
    from controller.jobs.read.queue import fmt_amount, manifest_requests, never_fits

    namespace = manifest["metadata"]["namespace"]
    try:
        local_queue = cluster.get_object(LOCAL_QUEUE, queue, namespace)
    except Forbidden:
        return [Check("queue", WARN, f"not checked: may not get localqueues/{queue}")]
    except NotFound:
        try:
            known = [q["metadata"]["name"] for q in cluster.list_objects(LOCAL_QUEUE, namespace)]
        except ClusterError:
            known = []
        return [
            Check(
                "queue",
                FAIL,
                f"queue: no LocalQueue {queue} in namespace {namespace} (got "
                f"{', '.join(known) if known else 'none'}): Kueue would never admit the job. Set "
                "queue: to a LocalQueue of the namespace, or ask an admin to create it",
            )
        ]
    cq_name = local_queue.get("spec", {}).get("clusterQueue", "?")
    checks = [Check("queue", OK, f"LocalQueue {namespace}/{queue} feeds ClusterQueue {cq_name}")]
    try:
        cq = cluster.get_object(CLUSTER_QUEUE, cq_name)
    except Forbidden:
        return [*checks, Check("queue admits", WARN, f"not checked: may not get {cq_name}")]
    except NotFound:
        return [
            *checks,
            Check(
                "queue admits",
                FAIL,
                f"LocalQueue {queue} feeds ClusterQueue {cq_name}, which does not exist: nothing "
                "is admitted through it. Ask an admin to create it",
            ),
        ]
    need = manifest_requests(pod_requests(manifest))
    problem = never_fits(need, cq)
    if problem:
        return [
            *checks,
            Check(
                "queue admits",
                FAIL,
                f"{problem}; it would wait in the queue forever. Lower resources or nodes, or "
                "use --force to submit anyway",
            ),
        ]
    asks = ", ".join(f"{k} {fmt_amount(k, v)}" for k, v in sorted(need.items()) if v > 0)
    return [*checks, Check("queue admits", OK, f"{cq_name} can admit it (the job asks {asks})")]


def _check_priority_class(cluster: Cluster, manifest: dict[str, Any]) -> list[Check]:
    name = (manifest["metadata"].get("labels") or {}).get(LABEL_PRIORITY_CLASS)
    if not name:
        return []
    try:
        wpc = cluster.get_object(WORKLOAD_PRIORITY_CLASS, name)
    except Forbidden:
        return [Check("priority class", WARN, f"not checked: may not get {name}")]
    except NotFound:
        try:
            known = [w["metadata"]["name"] for w in cluster.list_objects(WORKLOAD_PRIORITY_CLASS)]
        except ClusterError:
            known = []
        return [
            Check(
                "priority class",
                FAIL,
                f"priority_class: no WorkloadPriorityClass {name} (got "
                f"{', '.join(sorted(known)) if known else 'none'}): Kueue makes no Workload for "
                "the job. Set priority_class: to one of them, or ask an admin to create it",
            )
        ]
    return [Check("priority class", OK, f"WorkloadPriorityClass {name} (value {wpc.get('value')})")]


def spec_checks(spec: JobSpec) -> list[Check]:
    """The checks that read the spec alone: whether one rank's model state fits the memory it
    has (trainer.sizing), a warning when it does not, since what a run needs beside it is only
    estimated; nothing for a task of one's own (its model is built only where it trains)."""
    estimate = spec.model_state()
    if estimate is None:
        return []
    return [Check("model state", WARN if estimate.fits is False else OK, estimate.detail())]


def preflight(
    cluster: Cluster,
    manifest: dict[str, Any],
    *,
    force: bool,
    say: Callable[[str], None],
    spec_checks: Sequence[Check] = (),
) -> None:
    """Run the checks before a submit (``spec_checks``, made from the spec, first); refuse on
    a failed one. With ``force`` a job that does not fit the nodes goes through (it will wait
    Pending). ``say`` gets one line per check that is not ok, and the verdict."""
    checks = [*spec_checks, *run_checks(cluster, manifest["metadata"]["namespace"], manifest)]
    failed = [c for c in checks if c.status == FAIL]
    for c in checks:
        if c.status != OK:
            say(f"preflight {c.line()}")
    if force and failed and all(c.name in FORCEABLE for c in failed):
        say(
            "preflight: --force: submitting a job that cannot start now; it will stay Pending "
            "(or queued)"
        )
        return
    if not failed:
        say(f"preflight: ok ({len(checks)} checks)")
        return
    first = failed[0]
    detail = first.detail.split(": ", 1)[1] if first.detail.startswith("submit: ") else first.detail
    message = f"submit: preflight {first.name} failed: {detail}"
    if first.name in SPEC_CHECKS:
        raise UserError(message)
    raise ClusterError(message, reason="PreflightFailed")
