"""Cluster DNS on the node: CoreDNS v1.12.0 (built from ``builds/go/coredns`` with only the plugins
needed) on the bridge gateway, serving ``cluster.local`` from the API. The training operator's
per-replica Services are headless, so ``<job>-master-0`` resolves to the master pod's IP without
kube-proxy; every other name goes to the host's resolver.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..controlplane.context import Component, http_get
from . import host

if TYPE_CHECKING:
    from ..controlplane.context import Context

#: CoreDNS's client identity (its certificate's CN, bound to :func:`rbac_objects`' role).
USER = "ddpjob:coredns"


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
    crt, key = ctx.pki.issue("coredns", USER, client=True)
    ctx.pki.kubeconfig(Path(ctx.kubeconfig("coredns")), ctx.server, USER, crt, key)
    host.COREDNS_CONFIG.write_text(corefile(ctx))


def coredns_ready(ctx: Context) -> bool:
    return http_get(f"http://127.0.0.1:{ctx.ports['coredns-ready']}/ready").strip() == "OK"


def rbac_objects() -> list[dict]:
    """CoreDNS's read access to Services, EndpointSlices, pods and namespaces."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": USER},
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
        "metadata": {"name": USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": USER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }
    return [role, binding]


def _argv(ctx: Context) -> list[str]:
    return [str(ctx.bindir / "coredns"), "-conf", str(host.COREDNS_CONFIG)]


COREDNS = Component(
    "coredns",
    _argv,
    coredns_ready,
    prepare=prepare_coredns,
    ports=("coredns-health", "coredns-ready"),
)
