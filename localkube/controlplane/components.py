"""The control plane's processes: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler (k8s v1.33, all one multi-call binary from ``builds/go``) and kwok for the GPU
nodes that are capacity only; how each is started and how we know it is ready.

Each :class:`~.context.Component` is a name, a command line built from the cluster's
:class:`~.context.Context` (ports, certificates, paths), and a readiness probe;
``localkube/sequence.py`` puts them in order with the other rooms'. Credentials and the kwok
nodes are in ``bootstrap.py``.
"""

from __future__ import annotations

import json
import ssl

from . import bootstrap
from .context import Component, Context, http_get


def _insecure() -> ssl.SSLContext:
    # The components' own serving certificates are self-signed; their /healthz is all we read.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


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
        bootstrap.SERVICE_CLUSTER_IP_RANGE,
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
