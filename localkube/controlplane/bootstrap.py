"""What the local cluster needs besides its processes: credentials for every client identity,
and the objects applied once the API server answers (the kwok nodes); helpers the add-ons use to
install theirs (bindings, waiting for CRDs).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import yaml

from ..procs import LocalkubeError
from .context import Context
from .pki import PKI

#: The Services' addresses, and the ``kubernetes`` Service's (the range's first): what every pod
#: knows the API server by (KUBERNETES_SERVICE_HOST, port 443), and a name on its certificate;
#: node/host.py maps it to the API server, as kube-proxy would.
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
KUBERNETES_SERVICE_PORT = 443

#: Fake GPU nodes managed by kwok: capacity only, for scheduling, fit and queue tests (8 GPUs
#: each). Tainted (:data:`KWOK_TAINT`), so nothing lands there without tolerating it, and a pod
#: bound there is never started (no kwok pod stage matches): every pod that runs, runs in
#: containers on the real node (node/).
KWOK_NODES = ("kwok-node-0", "kwok-node-1")
KWOK_NODE_CAPACITY = {
    "cpu": "32",
    "memory": "256Gi",
    "pods": "110",
    "nvidia.com/gpu": "8",
    "ephemeral-storage": "1Ti",
}
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
#: A GPU node's taint as managed clusters set it (GKE: nvidia.com/gpu=present:NoSchedule). The
#: API server's ExtendedResourceToleration admission adds the toleration to every pod that asks
#: for nvidia.com/gpu, as on those clusters: a GPU pod can be bound to a kwok node (and is never
#: started there), a CPU pod cannot, and lands on the real node.
KWOK_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

#: kwok keeps its default node stages; of pod stages it has two: one that never matches, so kwok
#: fakes nothing for pods (no Running, no Succeeded: a pod bound to a kwok node stays Pending,
#: never started), and upstream's pod-delete, with no delay: a deleted pod there goes at once
#: (no kubelet would confirm it, and its namespace would stay Terminating for good).
KWOK_CONFIG = """\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options: {}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pods-never-start
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchLabels:
      ddpjob.local/kwok-never-matches: "true"
  next: {}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: Exists
  next:
    finalizers:
      empty: true
    delete: true
"""

#: Client identities: name -> (certificate CN, organisations). Each gets ``<name>.kubeconfig``
#: (``admin`` gets ``kubeconfig``, the one users export).
USERS = {
    "admin": ("kubernetes-admin", ("system:masters",)),
    "controller-manager": ("system:kube-controller-manager", ()),
    "scheduler": ("system:kube-scheduler", ()),
    "kwok": ("ddpjob:kwok", ()),
    "training-operator": ("ddpjob:training-operator", ()),
    "kubeflow-trainer": ("ddpjob:kubeflow-trainer", ()),  # Trainer v2 (addons/trainer_v2.py)
    "jobset": ("ddpjob:jobset", ()),
    "kueue": ("ddpjob:kueue", ()),  # addons/kueue.py
    "prometheus": ("ddpjob:prometheus", ()),  # addons/prometheus.py: its pod discovery
}


def issue_credentials(state_dir: Path, server: str) -> PKI:
    """A fresh CA with every serving and client certificate the cluster uses, and kubeconfigs."""
    pki = PKI(state_dir / "pki")
    pki.service_account_keys()
    pki.issue(
        "apiserver",
        "kube-apiserver",
        server=True,
        dns=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ips=("127.0.0.1", KUBERNETES_SERVICE_IP),
    )
    pki.issue("kwok", "kwok-kubelet", server=True, dns=("localhost",), ips=("127.0.0.1",))
    pki.issue(
        "apiserver-kubelet-client",
        "kube-apiserver-kubelet-client",
        organizations=("system:masters",),
        client=True,
    )
    for name, (cn, orgs) in USERS.items():
        path = state_dir / ("kubeconfig" if name == "admin" else f"{name}.kubeconfig")
        crt, key = pki.issue(name, cn, organizations=orgs, client=True)
        pki.kubeconfig(path, server, cn, crt, key)
    return pki


def cluster_role_binding(name: str, role: str, user: str) -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"ddpjob:{name}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


def serve_locally(config: dict, port: int, ca_bundle: str) -> dict:
    """A webhook configuration (or CRD conversion) pointed at ``https://127.0.0.1:<port>``."""
    config = copy.deepcopy(config)
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
    return config


def kwok_node(name: str) -> dict:
    """A fake node kwok keeps Ready, with 8 GPUs of allocatable capacity, tainted."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "spec": {"taints": [KWOK_TAINT]},
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
            },
        },
        "status": {"capacity": KWOK_NODE_CAPACITY, "allocatable": KWOK_NODE_CAPACITY},
    }


def apply(ctx: Context) -> None:
    """The kwok nodes, and kwok's binding to cluster-admin."""
    objects = [
        cluster_role_binding("kwok", "cluster-admin", "ddpjob:kwok"),
        *(kwok_node(n) for n in KWOK_NODES),
    ]
    ctx.apply("\n---\n".join(yaml.safe_dump(o) for o in objects), timeout=120)


def wait_established(ctx: Context, crds: list[str], timeout_s: float = 60) -> None:
    """Block until every CRD in ``crds`` reports Established (its API is served)."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = ctx.kubectl("get", "crd", *crds, "-o", "json", check=False)
        if out.returncode == 0:
            data = json.loads(out.stdout)
            items = data.get("items", [data])  # one name: the object itself
            if len(items) == len(crds) and all(
                any(
                    c["type"] == "Established" and c["status"] == "True"
                    for c in (item.get("status") or {}).get("conditions") or []
                )
                for item in items
            ):
                return
        if time.monotonic() > deadline:
            raise LocalkubeError(
                f"localkube: CRDs {', '.join(crds)} not established after {timeout_s:.0f}s "
                f"(got {out.stderr.strip() or 'not all Established'})"
            )
        time.sleep(0.2)
