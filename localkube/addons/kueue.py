"""Kueue in the local cluster: its objects, its process, the queues every cluster starts with.

Kueue's own command (``sigs.k8s.io/kueue/cmd/kueue`` at ``versions.KUEUE``, built unmodified by
``builds/go-operators``, see ``builds/operators.py``) runs as a host process beside the
operators, like Trainer v2 and JobSet (``trainer_v2.py``):

- Its Configuration (config.kueue.x-k8s.io/v1beta2, :func:`config`) is upstream's
  ``config/components/manager/controller_manager_config.yaml`` with local addresses, the
  integrations ddpjob submits named explicitly (:data:`FRAMEWORKS`), ``manageJobsWithoutQueueName:
  false`` (a job without a queue label is not Kueue's), no leader election and no internal
  certificate management.
- Its CRDs, ClusterRoles and webhook configurations are upstream's release kustomization
  (``config/default``), rendered at build time; :func:`objects` points every webhook and every
  CRD conversion webhook at ``https://127.0.0.1:<port>`` with the cluster CA.
- Certificates: upstream's release runs Kueue either with its internal certificate management
  (a Secret and a CA it injects, for ``kueue-webhook-service.kueue-system.svc``) or with
  cert-manager's certificates mounted into the pod. A host process is reached by URL, so the
  cluster CA plays cert-manager's part: the webhook certificate is for 127.0.0.1, in a folder the
  config names. Kueue then reads its metrics certificate from the fixed path
  ``/etc/kueue/metrics/certs`` (``cmd/kueue/main.go``): the process runs in a private mount
  namespace (``unshare --mount``) with the cluster's own certificate bind-mounted there, so
  nothing is written to the machine's /etc but an empty mount point, and two clusters on one
  machine do not share it. That needs root: without it the cluster runs without Kueue
  (:data:`ENABLED`), and says so.
- The queues of Kueue's quick start (:func:`queues`): ResourceFlavor ``default-flavor``,
  ClusterQueue ``cluster-queue`` with the real node's CPU and memory and the kwok nodes' GPUs as
  quota, LocalQueue ``user-queue`` in ``default``.

What differs from upstream's install, and why, is listed in :data:`DIFFERENCES`.
"""

from __future__ import annotations

import base64
import json
import os
import time
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from .. import procs
from ..builds.operators import KUEUE_SECRETS_ROLE as SECRETS_ROLE
from ..controlplane import bootstrap
from ..controlplane.context import Component
from ..procs import LocalkubeError
from . import manager

if TYPE_CHECKING:
    from ..controlplane.context import Context

NAMESPACE = "kueue-system"
USER = "kueue"  # its client identity (bootstrap.USERS)
#: The ClusterRoles of the release the process is bound to: what it does, and the
#: TokenReviews/SubjectAccessReviews of its authenticated metrics endpoint.
ROLES = ("kueue-manager-role", "kueue-metrics-auth-role")
PORTS = ("kueue-webhook", "kueue-probe", "kueue-metrics")

#: The integrations (``integrations.frameworks``): the two ddpjob submits, and batch/job, the one
#: Kueue enables when the list is empty and upstream's configuration lists first. Since v0.19
#: upstream's configuration leaves kubeflow.org/pytorchjob out (the Kubeflow v1 integration is
#: deprecated), so it is named here; a disabled integration's webhook answers as a no-op, and a
#: PyTorchJob with a queue label is then left as it was created.
FRAMEWORKS = ("batch/job", "kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob")

#: Where ``cmd/kueue`` reads its metrics certificate when its internal certificate management
#: is off (a constant there, not a setting).
METRICS_CERT_PATH = Path("/etc/kueue/metrics/certs")

#: The quick start's objects (upstream's site/static/examples/admin/single-clusterqueue-setup).
FLAVOR = "default-flavor"
CLUSTER_QUEUE = "cluster-queue"
LOCAL_QUEUE = "user-queue"
LOCAL_QUEUE_NAMESPACE = "default"
GPU = "nvidia.com/gpu"

#: Kueue runs as root only (its metrics certificate sits at a fixed path, see above);
#: ``DDPJOB_KUEUE=off`` leaves it out on purpose.
ENABLED = os.geteuid() == 0 and os.environ.get("DDPJOB_KUEUE", "on") != "off"
DISABLED_HINT = (
    "localkube kueue: the cluster runs without Kueue (got "
    + ("DDPJOB_KUEUE=off" if os.geteuid() == 0 else f"uid {os.geteuid()}, not root")
    + "): it reads its metrics certificate from /etc/kueue/metrics/certs, which localkube "
    "bind-mounts for it as root. Run `sudo make cluster-down cluster-up` with DDPJOB_KUEUE unset."
)

#: Everything that differs from upstream's install (``config/default``), and why.
DIFFERENCES = (
    "A process on 127.0.0.1, not a Deployment: the webhook configurations and the CRDs' "
    "conversion webhooks use url + caBundle instead of the Service kueue-webhook-service (no "
    "Service network reaches a host process).",
    "Certificates from the cluster CA, as with upstream's cert-manager option "
    "(internalCertManagement.enable=false): no kueue-webhook-server-cert Secret, no CA "
    "injection. The metrics certificate is bind-mounted at the fixed "
    "/etc/kueue/metrics/certs in the process's own mount namespace.",
    "Integrations: batch/job, kubeflow.org/pytorchjob and trainer.kubeflow.org/trainjob only "
    "(upstream's configuration lists 12, kubeflow.org/pytorchjob not among them since v0.19); "
    "the others' webhooks stay registered and answer as no-ops, as upstream's do for a disabled "
    "integration.",
    "Feature gate VisibilityOnDemand off: its API (visibility.kueue.x-k8s.io, pending "
    "workloads and their positions) is an APIService, which needs a Service, and its server "
    "reads certificates from the fixed path /visibility. Not installed: the two APIServices, "
    "the visibility Service and its RoleBinding in kube-system.",
    "Leader election off (one replica, as for every component); not installed: the "
    "leader-election and cluster-profiles Roles and RoleBindings in kueue-system (the secrets "
    "Role is: Kueue's cache watches Secrets in its namespace whatever its configuration).",
    "A client certificate bound to kueue-manager-role and kueue-metrics-auth-role instead of "
    "the ServiceAccount kueue-controller-manager; the configuration is a file, not the "
    "ConfigMap kueue-manager-config.",
    "The quick start's queues exist from the start: ResourceFlavor default-flavor, "
    "ClusterQueue cluster-queue (quota: the real node's CPU and memory, the kwok nodes' GPUs; "
    "preemption withinClusterQueue LowerPriority), LocalQueue user-queue in default.",
)


# ------------------------------------------------------------------------------------ process


def config(ctx: Context) -> dict:
    """Kueue's Configuration: upstream's controller_manager_config.yaml with local addresses,
    our certificates, no leader election, the integrations of :data:`FRAMEWORKS`."""
    p = ctx.ports
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{p['kueue-probe']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{p['kueue-metrics']}"},
        "webhook": {
            "port": p["kueue-webhook"],
            "host": "127.0.0.1",
            "certDir": str(ctx.state_dir / "kueue" / "webhook-certs"),
        },
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "controller": {
            "groupKindConcurrency": {
                "Workload.kueue.x-k8s.io": 10,
                "LocalQueue.kueue.x-k8s.io": 5,
                "Cohort.kueue.x-k8s.io": 1,
                "ClusterQueue.kueue.x-k8s.io": 5,
                "ResourceFlavor.kueue.x-k8s.io": 1,
            }
        },
        "clientConnection": {"qps": 300, "burst": 500},
        "integrations": {"frameworks": list(FRAMEWORKS)},
        "featureGates": {"VisibilityOnDemand": False},
    }


def prepare(ctx: Context) -> None:
    """Write the config file, the webhook and metrics certificates, and the mount point."""
    manager.write_config(ctx, "kueue", config(ctx))
    for name, cert_dir in (("kueue-webhook", "webhook-certs"), ("kueue-metrics", "metrics-certs")):
        manager.serving_cert(ctx, name, ctx.state_dir / "kueue" / cert_dir)
    METRICS_CERT_PATH.mkdir(parents=True, exist_ok=True)  # an empty mount point, kept


def argv(ctx: Context) -> list[str]:
    """``kueue`` in a private mount namespace whose /etc/kueue/metrics/certs is the cluster's."""
    return procs.in_private_mounts(
        [(ctx.state_dir / "kueue" / "metrics-certs", METRICS_CERT_PATH)],
        [ctx.state_dir, ctx.bindir],
        manager.argv(ctx, "kueue", "kueue", USER),
    )


# ------------------------------------------------------------------------------------ objects


def _ca_bundle(ctx: Context) -> str:
    return base64.b64encode(ctx.pki.path("ca.crt").read_bytes()).decode()


def crds(mandir: Path, port: int, ca_bundle: str) -> list[dict]:
    """Upstream's CRDs, each conversion webhook served at ``https://127.0.0.1:<port>``."""
    out = json.loads((mandir / "kueue-crds.json").read_text())
    for crd in out:
        webhook = (crd["spec"].get("conversion") or {}).get("webhook")
        if webhook:
            path = webhook["clientConfig"]["service"].get("path", "/convert")
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": ca_bundle,
            }
    return out


def crd_names(mandir: Path) -> list[str]:
    return [c["metadata"]["name"] for c in json.loads((mandir / "kueue-crds.json").read_text())]


def objects(ctx: Context) -> list[dict]:
    """The namespace, every ClusterRole of the release, the bindings of :data:`ROLES` to our
    identity, and both webhook configurations served by the process."""
    docs = [d for d in yaml.safe_load_all((ctx.manifests / "kueue-install.yaml").read_text()) if d]
    roles = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"}
    if not set(ROLES) <= roles:
        raise RuntimeError(
            f"localkube kueue: upstream's manifests lack ClusterRoles "
            f"{sorted(set(ROLES) - roles)} (got {len(roles)} roles). Rebuild the tools."
        )
    cn = bootstrap.USERS[USER][0]
    bindings = [bootstrap.cluster_role_binding(f"{USER}:{r}", r, cn) for r in ROLES]
    bindings.append(
        {
            **bootstrap.cluster_role_binding(f"{USER}:{SECRETS_ROLE}", SECRETS_ROLE, cn),
            "kind": "RoleBinding",
            "metadata": {"name": f"ddpjob:{USER}:{SECRETS_ROLE}", "namespace": NAMESPACE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": SECRETS_ROLE,
            },
        }
    )
    port, ca_bundle = ctx.ports["kueue-webhook"], _ca_bundle(ctx)
    hooks = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    return [
        *(bootstrap.serve_locally(d, port, ca_bundle) if d["kind"] in hooks else d for d in docs),
        *bindings,
    ]


def apply_objects(ctx: Context) -> None:
    """Install the CRDs, ClusterRoles, bindings and webhook configurations; wait until the CRDs
    are established (Kueue's informers need them at start)."""
    port, ca_bundle = ctx.ports["kueue-webhook"], _ca_bundle(ctx)
    texts = [json.dumps(c) for c in crds(ctx.manifests, port, ca_bundle)]
    texts += [yaml.safe_dump(d) for d in objects(ctx)]
    ctx.apply("\n---\n".join(texts))
    bootstrap.wait_established(ctx, crd_names(ctx.manifests))


# ------------------------------------------------------------------------------------ queues


def node_quota(node: dict | None) -> dict[str, str]:
    """CPU and memory of the real node (its allocatable), or of this machine without one."""
    if node is not None:
        alloc = node.get("status", {}).get("allocatable") or {}
        return {"cpu": str(alloc["cpu"]), "memory": str(alloc["memory"])}
    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    return {"cpu": str(os.cpu_count() or 1), "memory": f"{mem_kib}Ki"}


def kwok_gpus() -> int:
    """The GPUs of every kwok node together."""
    per_node = Decimal(bootstrap.KWOK_NODE_CAPACITY.get(GPU, "0"))
    return int(per_node * len(bootstrap.KWOK_NODES))


def queues(quota: dict[str, str], gpus: int) -> list[dict]:
    """Kueue's quick-start objects: one flavor, one ClusterQueue holding ``quota`` (cpu,
    memory) and ``gpus`` of it, and the LocalQueue ``default/user-queue`` feeding it. The
    ClusterQueue preempts lower-priority workloads in it when a higher one does not fit."""
    group = "kueue.x-k8s.io/v1beta2"
    resources = [
        {"name": "cpu", "nominalQuota": quota["cpu"]},
        {"name": "memory", "nominalQuota": quota["memory"]},
        {"name": GPU, "nominalQuota": gpus},
    ]
    return [
        {"apiVersion": group, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
        {
            "apiVersion": group,
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {},  # every namespace may have a LocalQueue feeding it
                "resourceGroups": [
                    {
                        "coveredResources": [r["name"] for r in resources],
                        "flavors": [{"name": FLAVOR, "resources": resources}],
                    }
                ],
                "preemption": {"withinClusterQueue": "LowerPriority"},
            },
        },
        {
            "apiVersion": group,
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": LOCAL_QUEUE_NAMESPACE},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    ]


def _registered(ctx: Context, node_name: str, timeout_s: float = 60) -> dict:
    """The node object once its kubelet registered it with its allocatable resources."""
    deadline = time.monotonic() + timeout_s
    while True:
        proc = ctx.kubectl("get", "node", node_name, "-o", "json", check=False)
        if proc.returncode == 0:
            got = json.loads(proc.stdout)
            if (got.get("status", {}).get("allocatable") or {}).get("cpu"):
                return got
        if time.monotonic() > deadline:
            raise LocalkubeError(
                f"localkube: node {node_name} did not register within {timeout_s:.0f}s "
                f"(got {proc.stderr.strip() or 'no allocatable'}). See {ctx.state_dir / 'logs'}."
            )
        time.sleep(0.5)


def install_queues(ctx: Context, node_name: str | None) -> None:
    """Apply the quick-start queues (Kueue's webhooks validate them: it must be ready); the
    quota is the real node's ``node_name`` (None: a cluster without one, this machine's)."""
    quota = node_quota(_registered(ctx, node_name) if node_name else None)
    ctx.apply(yaml.safe_dump_all(queues(quota, kwok_gpus())), timeout=60)


def require() -> None:
    """Fail in one line when the cluster runs without Kueue (for the queue tests)."""
    if not ENABLED:
        raise LocalkubeError(DISABLED_HINT)


# ------------------------------------------------------------------------------------ process

#: Waited for at once: its webhooks (failurePolicy Fail) see every job and pod created from then
#: on, and the queues are admitted by them.
KUEUE = Component(
    "kueue",
    argv,
    manager.probe_ready("kueue-probe"),
    wait="now",
    prepare=prepare,
    ports=PORTS,
)
