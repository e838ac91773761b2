"""The local cluster's real node: containerd, the CNI bridge, a kubelet and CoreDNS on this machine.

Beside the kwok nodes (capacity only: GPUs that are not there, for scheduling, fit and queue
tests) the cluster has one node that runs containers, and it runs every pod: a kubelet (v1.33,
from the project's Go module) against containerd (Debian's, with runc), pods on a CNI bridge
(:data:`host.BRIDGE`, ``10.244.0.0/24``, the gateway is the node IP), and CoreDNS on the gateway
serving ``cluster.local`` from the API, so that the training operator's headless per-replica
Services (``<job>-master-0``) resolve to pod IPs. Images come in by import (there is no
registry): the pause image, the operator's init image, this checkout's trainer image (also under
the name the examples use: :func:`import_trainer_image`).

The node is not tainted: a pod that says nothing about placement (a PyTorchJob copied from the
Kubeflow docs) lands here and runs in its image, with ``MASTER_ADDR`` answered by cluster DNS.
The kwok nodes are tainted (bootstrap.KWOK_TAINT), so only a pod that tolerates it can be bound
there, and it is never started.

Where things live: configs, sockets and IPAM leases under /run/ddpjob; containerd's root
(images survive ``down``) and the kubelet's root-dir under /var/lib/ddpjob; credentials, the
kubelet's config and logs in the cluster's state folder. What the node changes on the machine,
and how ``down`` puts it back: ``host.py``. The command lines are in ``components.py``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from . import host, procs, tools
from .context import http_get
from .procs import LocalkubeError

if TYPE_CHECKING:
    from .context import Context
    from .images import ImportResult

NODE_NAME = "localkube-node"


#: ``DDPJOB_NODE=off`` starts the cluster without its real node (non-root machines, or a second
#: checkout on a machine whose node another checkout's cluster holds).
ENABLED = os.environ.get("DDPJOB_NODE", "on") != "off"
DISABLED_HINT = (
    "localkube node: the cluster runs without its real node (got DDPJOB_NODE=off). "
    "Unset DDPJOB_NODE and run `make cluster-down cluster-up`."
)


@functools.cache
def images() -> dict[str, str]:
    """The images the node needs before any pod: the pause (sandbox) image and the init image
    of the training operator's Worker pods (``images.py`` builds them when missing or stale)."""
    from . import images as built

    return {"pause": built.pause_image(), "init": built.init_image()}


# ------------------------------------------------------------------------------ start-up steps


def preflight(repo: Path) -> None:
    """One line on why this machine cannot run the node (see ``host.preflight``)."""
    if ENABLED:
        host.preflight(repo)


def reset(repo: Path, say) -> None:
    """Put back what a previous node changed on this machine (a no-op when nothing is left)."""
    cri_reset = tools.bin_path("cri-reset")
    host.reset(repo, say, cri_reset if cri_reset.exists() else None)


def prepare_host(ctx: Context) -> None:
    """Record the machine as it is, then the bridge, the CNI network and containerd's config."""
    with host.machine_lock():
        host.check_owner(ctx.repo)
        host.record(ctx.repo)
        for path in (host.CONTAINERD_ROOT, host.CONTAINERD_STATE, host.CNI_CONF_DIR):
            path.mkdir(parents=True, exist_ok=True)
        host.create_bridge()
    (host.CNI_CONF_DIR / f"10-{host.CNI_NETWORK}.conflist").write_text(
        json.dumps(cni_conflist(), indent=2) + "\n"
    )
    host.CONTAINERD_CONFIG.write_text(containerd_config(images()["pause"]))


def cni_conflist() -> dict:
    """One bridge network: host-local IPAM on the pod subnet, the gateway on the bridge,
    masquerade for traffic leaving it, portmap for hostPort."""
    return {
        "cniVersion": "1.0.0",
        "name": host.CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": host.BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": host.POD_SUBNET, "gateway": host.GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(host.CNI_DATA_DIR),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def containerd_config(pause_image: str) -> str:
    """containerd 1.6's config (version 2) for this machine.

    ``restrict_oom_score_adj``: no process here has CAP_SYS_RESOURCE, so a sandbox that lowers
    its oom_score_adj fails. ``disable_apparmor``: the kernel has none. cgroupfs (no systemd),
    Debian's runc with its state under /run/ddpjob. The opt plugin would create /opt/containerd.
    """
    runtime = 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc'
    return f"""\
version = 2
root = "{host.CONTAINERD_ROOT}"
state = "{host.CONTAINERD_STATE}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{host.CONTAINERD_SOCKET}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{host.CONTAINERD_ROOT / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{runtime}]
  runtime_type = "io.containerd.runc.v2"

[{runtime}.options]
  SystemdCgroup = false
  BinaryName = "/usr/sbin/runc"
  Root = "{host.RUNC_ROOT}"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{host.CNI_CONF_DIR}"
  max_conf_num = 1
"""


def ctr(*args: str, input_bytes: bytes | None = None) -> subprocess.CompletedProcess:
    """Run ``ctr`` against the node's containerd, in the CRI namespace."""
    argv = ["ctr", "--address", str(host.CONTAINERD_SOCKET), "--namespace", "k8s.io", *args]
    return subprocess.run(argv, input=input_bytes, capture_output=True, check=False)


def containerd_ready(_ctx: Context) -> bool:
    return host.CONTAINERD_SOCKET.exists() and ctr("version").returncode == 0


def import_images(_ctx: Context) -> None:
    """Import the node's images into containerd (a no-op for those already there: they persist
    in its root across ``down``), this checkout's trainer image included."""
    from . import images as built

    for ref in images().values():
        built.import_into_containerd(ref, str(host.CONTAINERD_SOCKET))
    import_trainer_image()


#: The private containerd of :func:`preload_images`: its config, state and socket (the root is
#: the node's).
PRELOAD_DIR = host.RUN_DIR / "containerd-preload"


def preload_images(repo: Path, log=sys.stderr) -> str:
    """Import the node's images into its containerd's root before the cluster starts; one line
    on what was done.

    ``make test`` runs this once its images are built, while the Go tools still build: on a
    fresh machine the import of the 5.8 GB stand-in torch base took 130-146 s inside ``up``,
    on the critical path; here it overlaps the Go build, and ``up``'s own import (``node-images``)
    finds every image in place and sends nothing. The import goes through a containerd of its
    own: the node's root, no CRI plugin, a state folder and socket of its own; it stops when
    the import ends. Nothing is done (and ``up`` imports as before) when the node is off or
    cannot run here, or any node containerd already runs. The machine lock is held throughout,
    so a cluster starting meanwhile waits for it rather than opening the same root.
    """
    from . import images as built

    if not ENABLED:
        return "the node is off (DDPJOB_NODE=off): nothing to preload"
    try:
        host.preflight(repo)
    except LocalkubeError as e:
        return f"not preloaded: {e}"
    with host.machine_lock():
        if host.node_processes()["containerd"] or containerd_ready(None):
            return "not preloaded: the node's containerd runs; `up` imported its images"
        start = time.monotonic()
        refs = [*images().values(), built.trainer_image(log)]
        results = import_offline(refs, host.CONTAINERD_ROOT, PRELOAD_DIR, log=log)
    sent = sum(r.bytes_sent for r in results) / 2**20
    took = time.monotonic() - start
    return (
        f"preloaded {', '.join(refs)} ({sent:.0f} MiB sent) into the node's containerd "
        f"in {took:.0f}s"
    )


def import_offline(
    refs: list[str], root: Path, workdir: Path, log=sys.stderr
) -> list[ImportResult]:
    """Import podman's ``refs`` into the containerd root ``root`` through a containerd of its
    own (``images.scratch_containerd`` on that root: config, state, socket and log in
    ``workdir``; no CRI plugin), stopped after; what each import did. A containerd started on
    ``root`` later (the node's, at ``up``) holds them, unpacked."""
    from . import images as built

    with built.scratch_containerd(workdir, root=root) as address:
        return [built.import_into_containerd(ref, address, log=log) for ref in refs]


def import_trainer_image(log=sys.stderr) -> str:
    """This checkout's trainer image, rebuilt if its code changed (about a minute) and imported
    into the node's containerd if containerd's copy is another image ID (seconds: only the
    trainer's own layer is sent); its reference. Also named as the examples and the chart name it
    (``images.published_ref()``, e.g. ghcr.io/ddpjob/trainer:0.1.0), as ``kind load`` would: a
    spec copied from examples/ runs this checkout's trainer, with nothing to pull."""
    from . import images as built

    ref = built.trainer_image(log)
    built.import_into_containerd(ref, str(host.CONTAINERD_SOCKET), log=log)
    alias(ref, built.published_ref())
    return ref


def alias(ref: str, name: str) -> None:
    """Give the node's copy of ``ref`` a second name (one image, no copy: ``ctr images tag``)."""
    proc = ctr("images", "tag", "--force", ref, name)
    if proc.returncode != 0:
        raise LocalkubeError(
            f"localkube node: could not name {ref} {name} in containerd (got "
            f"{proc.stderr.decode(errors='replace').strip()}). Is the node's containerd running?"
        )


def load(ref: str, name: str | None = None, log=sys.stderr) -> str:
    """``kind load`` for the real node: import podman's ``ref`` into the node's containerd (only
    the layers it lacks), under its own name and ``name`` if given; the name pods use."""
    from . import images as built

    require()
    built.import_into_containerd(ref, str(host.CONTAINERD_SOCKET), log=log)
    if name and name != ref:
        alias(ref, name)
    return name or ref


def apply_objects(ctx: Context) -> None:
    """CoreDNS's read access to Services, EndpointSlices, pods and namespaces, and the
    StorageClass of the node's ``local`` volumes."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "ddpjob:coredns"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["list", "watch"],
            },
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "ddpjob:coredns"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "ddpjob:coredns",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "ddpjob:coredns"}
        ],
    }
    from .volumes import storage_class

    docs = "\n---\n".join(yaml.safe_dump(o) for o in (role, binding, storage_class()))
    ctx.apply(docs)


# ------------------------------------------------------------------------------ the kubelet


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
        # a test's pods took 12 s to import torch while the machine sat 90% idle (ci4).
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


# ------------------------------------------------------------------------------ CoreDNS


def corefile(ctx: Context) -> str:
    """cluster.local (and reverse zones) from the API; the rest to the host's resolver."""
    return f"""\
.:53 {{
    bind {host.GATEWAY}
    errors
    health 127.0.0.1:{ctx.ports["coredns-health"]}
    ready 127.0.0.1:{ctx.ports["coredns-ready"]}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {ctx.kubeconfig("coredns")} ddpjob-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . /etc/resolv.conf
    cache 5
    loop
}}
"""


def prepare_coredns(ctx: Context) -> None:
    crt, key = ctx.pki.issue("coredns", "ddpjob:coredns", client=True)
    ctx.pki.kubeconfig(Path(ctx.kubeconfig("coredns")), ctx.server, "ddpjob:coredns", crt, key)
    host.COREDNS_CONFIG.write_text(corefile(ctx))


def coredns_ready(ctx: Context) -> bool:
    return http_get(f"http://127.0.0.1:{ctx.ports['coredns-ready']}/ready").strip() == "OK"


def shim_memory_mib() -> dict[str, float]:
    """containerd's shims (one per pod, outside the recorded processes): count, RSS and PSS."""
    pids = {str(p): {"pid": p} for p in host.node_processes()["containerd-shim"]}
    rss = procs.memory_mib(pids, "VmRSS")
    pss = procs.memory_mib(pids, "Pss")
    return {
        "count": len(rss),
        "rss_mib": round(sum(rss.values()), 1),
        "pss_mib": round(sum(pss.values()), 1),
    }


def require() -> None:
    """Fail in one line when the running cluster has no real node (for the node's tests)."""
    if not ENABLED:
        raise LocalkubeError(DISABLED_HINT)
