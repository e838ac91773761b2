"""The local cluster's real node: a kubelet (v1.33, from ``builds/go``) against the node's
containerd (``containerd.py``), with CoreDNS on the gateway (``coredns.py``).

Beside the kwok nodes (capacity only: GPUs that are not there, for scheduling, fit and queue
tests) the cluster has one node that runs containers, and it runs every pod. The node is not
tainted: a pod that says nothing about placement (a PyTorchJob copied from the Kubeflow docs)
lands here and runs in its image, with ``MASTER_ADDR`` answered by cluster DNS. The kwok nodes
are tainted (``controlplane.bootstrap.KWOK_TAINT``), so only a pod that tolerates it can be bound
there, and it is never started.

Credentials, the kubelet's config and logs live in the cluster's state folder; its root-dir
under /var/lib/ddpjob. What the node changes on the machine, and how ``down`` puts it back:
``host.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..builds import gotools
from ..controlplane.context import Component
from . import coredns, host, volumes
from .images import images

if TYPE_CHECKING:
    from ..controlplane.context import Context

NODE_NAME = "localkube-node"


def preflight(repo: Path) -> None:
    """One line on why this machine cannot run the node (see ``host.preflight``)."""
    if host.ENABLED:
        host.preflight(repo)


def reset(repo: Path, say) -> None:
    """Put back what a previous node changed on this machine (a no-op when nothing is left)."""
    cri_reset = gotools.bin_path("cri-reset")
    host.reset(repo, say, cri_reset if cri_reset.exists() else None)


def apply_objects(ctx: Context) -> None:
    """CoreDNS's read access to the API, and the StorageClass of the node's ``local`` volumes."""
    objects = [*coredns.rbac_objects(), volumes.storage_class()]
    ctx.apply("\n---\n".join(yaml.safe_dump(o) for o in objects))


def kubelet_config(ctx: Context) -> dict:
    """The kubelet's configuration file (KubeletConfiguration v1beta1)."""
    pki = ctx.pki
    zero = "0%"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": host.GATEWAY,
        "port": ctx.ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ctx.ports["kubelet-healthz"],
        "tlsCertFile": str(pki.path("kubelet-serving.crt")),
        "tlsPrivateKeyFile": str(pki.path("kubelet-serving.key")),
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.path("ca.crt"))},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{host.CONTAINERD_SOCKET}",
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "clusterDNS": [host.GATEWAY],
        "clusterDomain": "cluster.local",
        # Disk pressure would evict pods on a developer's full disk: only memory counts.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": zero,
            "nodefs.inodesFree": zero,
            "imagefs.available": zero,
            "imagefs.inodesFree": zero,
        },
        # Imported images cannot be pulled again: never collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # A rank 0 log of a few hundred thousand lines stays one file (kubectl logs reads only
        # the current one; upstream rotates at 10Mi).
        "containerLogMaxSize": "256Mi",
        # A pod's CPU limit is not a ceiling here (no CFS quota): its request still decides what
        # fits the node, and cpu.shares still divides a busy machine by requests. The e2e pods
        # ask a quarter CPU so that eight fit the 2-core node; throttled to a quarter core each,
        # a test's pods took 12 s to import torch while the machine sat 90% idle.
        "cpuCFSQuota": False,
        # In-place restarts back off 10 s at most (upstream: 300 s), as tests and users wait.
        "featureGates": {"KubeletCrashLoopBackOffMax": True},
        "crashLoopBackOff": {"maxContainerRestartPeriod": "10s"},
        # The flexvolume prober would create /usr/libexec/kubernetes.
        "volumePluginDir": str(host.KUBELET_ROOT / "volume-plugins"),
    }


def prepare_kubelet(ctx: Context) -> None:
    """The kubelet's client identity (system:node:<name>), serving certificate (node IP SAN),
    kubeconfig and config file."""
    pki = ctx.pki
    cn = f"system:node:{NODE_NAME}"
    crt, key = pki.issue("kubelet", cn, organizations=("system:nodes",), client=True)
    pki.kubeconfig(Path(ctx.kubeconfig("kubelet")), ctx.server, cn, crt, key)
    pki.issue(
        "kubelet-serving",
        NODE_NAME,
        server=True,
        dns=(NODE_NAME, "localhost"),
        ips=(host.GATEWAY, "127.0.0.1"),
    )
    (ctx.state_dir / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(ctx)))


def node_ready(ctx: Context) -> bool:
    """True when the node reports Ready and takes pods (``ctx``: anything with ``kubectl``, a
    Cluster too): the node lifecycle controller also removed the ``node.kubernetes.io/...``
    taints (not-ready at registration, unreachable after an outage) a few seconds after Ready,
    and until then a submit's preflight rightly finds no node to run on."""
    proc = ctx.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
    if proc.returncode != 0:
        return False
    obj = json.loads(proc.stdout)
    conditions = obj.get("status", {}).get("conditions", [])
    lifecycle = [
        t for t in obj.get("spec", {}).get("taints") or [] if t["key"].startswith(LIFECYCLE_TAINT)
    ]
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return ready and not lifecycle and not obj.get("spec", {}).get("unschedulable")


#: The taints the node lifecycle controller and the kubelet put on a node that is not ready.
LIFECYCLE_TAINT = "node.kubernetes.io/"


def _argv(ctx: Context) -> list[str]:
    return [
        str(ctx.bindir / "kubelet"),
        "--config",
        str(ctx.state_dir / "kubelet.yaml"),
        "--kubeconfig",
        ctx.kubeconfig("kubelet"),
        f"--root-dir={host.KUBELET_ROOT}",
        "--hostname-override",
        NODE_NAME,
        "--node-ip",
        host.GATEWAY,
        "--node-labels",
        "ddpjob.local/node=real",
        # Only tells image GC to keep it; the sandbox image itself is containerd's setting.
        "--pod-infra-container-image",
        images()["pause"],
        "--v",
        "1",
    ]


KUBELET = Component(
    "kubelet",
    _argv,
    node_ready,
    timeout_s=90,
    prepare=prepare_kubelet,
    ports=("kubelet", "kubelet-healthz"),
)
