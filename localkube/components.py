"""The components of the local cluster: how each is started and how we know it is ready.

Each :class:`Component` is a name, a command line built from the cluster's :class:`Context`
(ports, certificates, paths), and a readiness probe. ``up`` walks :data:`SEQUENCE` in order:
a component with ``wait="now"`` is waited for before the next one starts (etcd before the API
server), the others start at once and are waited for together at the end. A :class:`Step` is
work between processes (the bootstrap objects need the API server, kwok needs them).

The command lines live here and nowhere else; bootstrap objects are in ``bootstrap.py`` and
process bookkeeping in ``procs.py``.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from . import bootstrap, images, kueue, node, trainer_v2
from .context import Context, http_get
from .host import CONTAINERD_CONFIG, COREDNS_CONFIG, GATEWAY, KUBELET_ROOT


def _insecure() -> ssl.SSLContext:
    # The components' own serving certificates are self-signed; their /healthz is all we read.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


@dataclass(frozen=True)
class Component:
    """One long-running process of the cluster."""

    name: str
    argv: Callable[[Context], list[str]]
    ready: Callable[[Context], bool]
    #: "now": wait for it before starting the next entry; "end": wait with the rest at the end.
    wait: Literal["now", "end"] = "end"
    timeout_s: float = 60
    env: Callable[[Context], dict[str, str]] | None = None
    #: Files the command line needs, written just before the start.
    prepare: Callable[[Context], None] | None = None
    ports: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Step:
    """Work between components (not a process)."""

    name: str
    run: Callable[[Context], None]


# ------------------------------------------------------------------------------------ etcd


def _etcd(ctx: Context) -> list[str]:
    p = ctx.ports
    return [
        str(ctx.bindir / "etcd"),
        "--name",
        "default",
        "--data-dir",
        str(ctx.state_dir / "etcd"),
        "--listen-client-urls",
        f"http://127.0.0.1:{p['etcd']}",
        "--advertise-client-urls",
        f"http://127.0.0.1:{p['etcd']}",
        "--listen-peer-urls",
        f"http://127.0.0.1:{p['etcd-peer']}",
        "--initial-advertise-peer-urls",
        f"http://127.0.0.1:{p['etcd-peer']}",
        "--initial-cluster",
        f"default=http://127.0.0.1:{p['etcd-peer']}",
        "--listen-metrics-urls",
        "",
        "--unsafe-no-fsync",
        "--snapshot-count",
        "10000",
        "--quota-backend-bytes",
        str(2 * 1024**3),
        "--log-level",
        "warn",
    ]


ETCD = Component(
    "etcd",
    _etcd,
    lambda ctx: '"health":"true"' in http_get(f"http://127.0.0.1:{ctx.ports['etcd']}/health"),
    wait="now",
    timeout_s=30,
    ports=("etcd", "etcd-peer"),
)

# ------------------------------------------------------------------------------------ API server


def _apiserver(ctx: Context) -> list[str]:
    pki = ctx.pki
    return [
        str(ctx.bindir / "kube-apiserver"),
        "--etcd-servers",
        f"http://127.0.0.1:{ctx.ports['etcd']}",
        "--bind-address",
        "127.0.0.1",
        "--advertise-address",
        "127.0.0.1",
        "--secure-port",
        str(ctx.ports["apiserver"]),
        "--cert-dir",
        str(pki.dir),
        "--tls-cert-file",
        str(pki.path("apiserver.crt")),
        "--tls-private-key-file",
        str(pki.path("apiserver.key")),
        "--client-ca-file",
        str(pki.path("ca.crt")),
        "--authorization-mode",
        "Node,RBAC",
        "--enable-admission-plugins",
        # ExtendedResourceToleration: pods asking for nvidia.com/gpu tolerate the GPU nodes'
        # taint (bootstrap.KWOK_TAINT), as on managed GPU clusters.
        "NodeRestriction,PodSecurity,ExtendedResourceToleration",
        "--service-cluster-ip-range",
        "10.0.0.0/24",
        # The first issuer names new tokens: its own address, so that a host process can do
        # OIDC discovery of it (Trainer's status server verifies pods' tokens that way); the
        # in-cluster name is still accepted.
        "--service-account-issuer",
        ctx.server,
        "--service-account-issuer",
        "https://kubernetes.default.svc.cluster.local",
        "--service-account-jwks-uri",
        f"{ctx.server}/openid/v1/jwks",
        "--service-account-key-file",
        str(pki.path("sa.pub")),
        "--service-account-signing-key-file",
        str(pki.path("sa.key")),
        "--api-audiences",
        "https://kubernetes.default.svc.cluster.local",
        "--kubelet-client-certificate",
        str(pki.path("apiserver-kubelet-client.crt")),
        "--kubelet-client-key",
        str(pki.path("apiserver-kubelet-client.key")),
        "--kubelet-preferred-address-types",
        "InternalIP",
        "--endpoint-reconciler-type",
        "none",
        "--allow-privileged=true",
        "--profiling=false",
        "--v",
        "1",
    ]


APISERVER = Component(
    "kube-apiserver",
    _apiserver,
    lambda ctx: http_get(f"{ctx.server}/readyz", ctx.admin_ssl()) == "ok",
    wait="now",
    timeout_s=90,
    ports=("apiserver",),
)

# ------------------------------------------------------------------------------------ controllers


def _controller_manager(ctx: Context) -> list[str]:
    kubeconfig = ctx.kubeconfig("controller-manager")
    pki = ctx.pki
    return [
        str(ctx.bindir / "kube-controller-manager"),
        "--kubeconfig",
        kubeconfig,
        "--authentication-kubeconfig",
        kubeconfig,
        "--authorization-kubeconfig",
        kubeconfig,
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        str(ctx.ports["controller-manager"]),
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        "--service-account-private-key-file",
        str(pki.path("sa.key")),
        "--root-ca-file",
        str(pki.path("ca.crt")),
        "--cluster-signing-cert-file",
        str(pki.path("ca.crt")),
        "--cluster-signing-key-file",
        str(pki.path("ca.key")),
        "--controllers",
        "*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,"
        "-node-route-controller,-persistentvolume-expander",
        "--node-monitor-grace-period",
        "60s",
        "--profiling=false",
        "--v",
        "1",
    ]


CONTROLLER_MANAGER = Component(
    "kube-controller-manager",
    _controller_manager,
    lambda ctx: (
        http_get(f"https://127.0.0.1:{ctx.ports['controller-manager']}/healthz", _insecure())
        == "ok"
    ),
    ports=("controller-manager",),
)


def _scheduler(ctx: Context) -> list[str]:
    kubeconfig = ctx.kubeconfig("scheduler")
    return [
        str(ctx.bindir / "kube-scheduler"),
        "--kubeconfig",
        kubeconfig,
        "--authentication-kubeconfig",
        kubeconfig,
        "--authorization-kubeconfig",
        kubeconfig,
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        str(ctx.ports["scheduler"]),
        "--leader-elect=false",
        "--profiling=false",
        "--v",
        "1",
    ]


SCHEDULER = Component(
    "kube-scheduler",
    _scheduler,
    lambda ctx: (
        http_get(f"https://127.0.0.1:{ctx.ports['scheduler']}/healthz", _insecure()) == "ok"
    ),
    ports=("scheduler",),
)

# ------------------------------------------------------------------------------------ kwok


def _kwok(ctx: Context) -> list[str]:
    pki = ctx.pki
    return [
        str(ctx.bindir / "kwok"),
        "--kubeconfig",
        ctx.kubeconfig("kwok"),
        "--config",
        str(ctx.state_dir / "kwok.yaml"),
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector",
        f"{bootstrap.KWOK_ANNOTATION}=fake",
        "--node-ip",
        "127.0.0.1",
        "--node-port",
        str(ctx.ports["kwok"]),
        "--server-address",
        f"127.0.0.1:{ctx.ports['kwok']}",
        "--tls-cert-file",
        str(pki.path("kwok.crt")),
        "--tls-private-key-file",
        str(pki.path("kwok.key")),
        "--node-lease-duration-seconds",
        "40",
    ]


def _kwok_nodes_ready(ctx: Context) -> bool:
    items = json.loads(ctx.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    ready = [
        n["metadata"]["name"]
        for n in items
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in n.get("status", {}).get("conditions", [])
        )
    ]
    return set(bootstrap.KWOK_NODES) <= set(ready)


KWOK = Component(
    "kwok",
    _kwok,
    _kwok_nodes_ready,
    prepare=lambda ctx: (ctx.state_dir / "kwok.yaml").write_text(bootstrap.KWOK_CONFIG),
    ports=("kwok",),
)

# ------------------------------------------------------------------------------------ operator


def _training_operator(ctx: Context) -> list[str]:
    return [
        str(ctx.bindir / "training-operator"),
        "--kubeconfig",
        ctx.kubeconfig("training-operator"),
        "--health-probe-bind-address",
        f"127.0.0.1:{ctx.ports['operator-probe']}",
        "--metrics-bind-address",
        f"127.0.0.1:{ctx.ports['operator-metrics']}",
        "--webhook-server-port",
        str(ctx.ports["operator-webhook"]),
        "--webhook-cert-dir",
        str(ctx.state_dir / "webhook-certs"),
        # The init container template we ship for `restricted` namespaces: upstream's
        # built-in one sets no securityContext, so PodSecurity refuses Worker pods.
        "--pytorch-init-container-template-file",
        str(ctx.repo / "k8s" / "operator" / "init-container-restricted.yaml"),
        # The template's {{.InitContainerImage}}: the local init image (upstream: alpine:3.10,
        # which no registry serves here).
        *(["--pytorch-init-container-image", node.images()["init"]] if node.ENABLED else []),
        "--zap-log-level",
        "info",
    ]


TRAINING_OPERATOR = Component(
    "training-operator",
    _training_operator,
    lambda ctx: http_get(f"http://127.0.0.1:{ctx.ports['operator-probe']}/readyz") == "ok",
    env=lambda ctx: {"KUBECONFIG": ctx.kubeconfig("training-operator")},
    ports=("operator-probe", "operator-webhook", "operator-metrics"),
)

# ------------------------------------------------------------------------------------ Trainer v2

# Kubeflow Trainer v2 and JobSet, upstream's commands with their config files, certificates and
# objects from trainer_v2.py. Trainer is waited for at once: the torch-distributed runtime is
# admitted by its webhook, so the step after it needs it ready.

JOBSET_CONTROLLER = Component(
    "jobset-controller-manager",
    trainer_v2.jobset_argv,
    lambda ctx: http_get(f"http://127.0.0.1:{ctx.ports['jobset-probe']}/readyz") == "ok",
    prepare=trainer_v2.jobset_prepare,
    ports=trainer_v2.JOBSET_PORTS,
)

TRAINER_CONTROLLER = Component(
    "trainer-controller-manager",
    trainer_v2.trainer_argv,
    trainer_v2.trainer_ready,
    wait="now",
    env=trainer_v2.trainer_env,
    prepare=trainer_v2.trainer_prepare,
    ports=trainer_v2.TRAINER_PORTS,
)

# ------------------------------------------------------------------------------------ Kueue

# Kueue's command with its config file, certificates and objects from kueue.py. Waited for at
# once: its webhooks (failurePolicy Fail) see every job and pod created from then on, and the
# queues are admitted by them.

KUEUE = Component(
    "kueue",
    kueue.argv,
    lambda ctx: http_get(f"http://127.0.0.1:{ctx.ports['kueue-probe']}/readyz") == "ok",
    wait="now",
    prepare=kueue.prepare,
    ports=kueue.PORTS,
)

#: Kueue after the operators (its integrations need their CRDs, the TrainJob one the runtime).
KUEUE_STEPS: tuple[Component | Step, ...] = (Step("kueue-objects", kueue.apply_objects), KUEUE)

# ------------------------------------------------------------------------------------ real node


def _containerd(_ctx: Context) -> list[str]:
    return ["containerd", "--config", str(CONTAINERD_CONFIG)]


CONTAINERD = Component(
    "containerd",
    _containerd,
    node.containerd_ready,
    wait="now",
    timeout_s=30,
    prepare=node.prepare_host,
)


def _kubelet(ctx: Context) -> list[str]:
    return [
        str(ctx.bindir / "kubelet"),
        "--config",
        str(ctx.state_dir / "kubelet.yaml"),
        "--kubeconfig",
        ctx.kubeconfig("kubelet"),
        f"--root-dir={KUBELET_ROOT}",
        "--hostname-override",
        node.NODE_NAME,
        "--node-ip",
        GATEWAY,
        "--node-labels",
        "ddpjob.local/node=real",
        # Only tells image GC to keep it; the sandbox image itself is containerd's setting.
        "--pod-infra-container-image",
        node.images()["pause"],
        "--v",
        "1",
    ]


KUBELET = Component(
    "kubelet",
    _kubelet,
    node.node_ready,
    timeout_s=90,
    prepare=node.prepare_kubelet,
    ports=("kubelet", "kubelet-healthz"),
)


def _coredns(ctx: Context) -> list[str]:
    return [str(ctx.bindir / "coredns"), "-conf", str(COREDNS_CONFIG)]


COREDNS = Component(
    "coredns",
    _coredns,
    node.coredns_ready,
    prepare=node.prepare_coredns,
    ports=("coredns-health", "coredns-ready"),
)

#: The real node, after the control plane (it registers with the API server).
NODE: tuple[Component | Step, ...] = (
    CONTAINERD,
    Step("node-images", node.import_images),
    Step("node-objects", node.apply_objects),
    KUBELET,
    COREDNS,
)

# ------------------------------------------------------------------------------------ the order


def _torch_runtime(ctx: Context) -> None:
    """The torch-distributed runtime with this checkout's trainer image (named, not built: the
    node's images step builds and imports it)."""
    trainer_v2.install_runtime(ctx, images.trainer_ref())


def _kueue_queues(ctx: Context) -> None:
    kueue.install_queues(ctx, node.NODE_NAME if node.ENABLED else None)


def _default_service_account(ctx: Context) -> bool:
    proc = ctx.kubectl("get", "serviceaccount", "default", "-n", "default", check=False)
    return proc.returncode == 0


#: Start order; ``down()`` stops the processes in reverse.
SEQUENCE: tuple[Component | Step, ...] = (
    ETCD,
    APISERVER,
    CONTROLLER_MANAGER,
    SCHEDULER,
    Step("bootstrap-objects", bootstrap.apply),
    KWOK,
    TRAINING_OPERATOR,
    Step("trainer-v2-objects", trainer_v2.apply_objects),
    JOBSET_CONTROLLER,
    TRAINER_CONTROLLER,
    Step("torch-distributed-runtime", _torch_runtime),
    *(KUEUE_STEPS if kueue.ENABLED else ()),
    *(NODE if node.ENABLED else ()),
    # The quick start's queues: the ClusterQueue's quota is the real node's CPU and memory.
    *((Step("kueue-queues", _kueue_queues),) if kueue.ENABLED else ()),
)

#: Checks before anything is built or started: each raises a one-line LocalkubeError when this
#: machine cannot run the cluster.
HOST_CHECKS: tuple[Callable[[Path], None], ...] = (node.preflight,)
#: Undo what the cluster changed on the machine outside its processes and state folder; run by
#: ``down`` after the processes stop and by ``up`` before it starts (what a killed run left).
HOST_RESETS: tuple[Callable[[Path, Callable[[str], None]], None], ...] = (node.reset,)

#: Cluster-wide conditions checked after every component is ready: (what, probe).
FINAL_PROBES: tuple[tuple[str, Callable[[Context], bool]], ...] = (
    ("default service account", _default_service_account),
)


def components() -> list[Component]:
    """The processes of the cluster, in start order."""
    return [c for c in SEQUENCE if isinstance(c, Component)]


def port_names() -> list[str]:
    """Every port a component listens on (each gets a free port at ``up``, below the kernel's
    ephemeral range: ``procs.free_ports``)."""
    return [p for c in components() for p in c.ports]
