"""A host process that pods reach by a Service's name: it listens on the node's bridge gateway
(``host.GATEWAY``, which the host and every pod reach), and a Service without selector with an
EndpointSlice to that address gives it a name that CoreDNS answers. With no kube-proxy a Service
cannot map a port, so the port is the server's own, fixed (below the pool the other components'
ports come from). The S3 server, Prometheus, MLflow and Trainer's status server are reached so.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from ..node import host
from ..procs import LocalkubeError

#: Bind an address this machine does not hold (yet); linux/in.h, not in every Python's socket.
_IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)


def service(name: str, namespace: str, port_name: str, port: int) -> list[dict[str, Any]]:
    """The headless Service ``name`` and its EndpointSlice to the gateway at ``port``."""
    meta = {"namespace": namespace}
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, **meta},
            "spec": {
                "clusterIP": "None",
                "ports": [{"name": port_name, "port": port, "targetPort": port}],
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-host",
                "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": "ddpjob-cluster",
                },
                **meta,
            },
            "addressType": "IPv4",
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [host.GATEWAY], "conditions": {"ready": True}}],
        },
    ]


def check_port(port: int, what: str) -> None:
    """One line when something else on this machine holds ``port`` on every address, where
    ``what`` (the local cluster's server) is to listen on the gateway."""
    with socket.socket() as sock:
        # The bridge and its address may not exist yet: bind as if they did.
        sock.setsockopt(socket.SOL_IP, _IP_FREEBIND, 1)
        # As the servers bind (Go's listeners do): a closed connection's TIME_WAIT is no owner.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.GATEWAY, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise LocalkubeError(
                f"localkube: port {port} is taken on this machine (got: {exc.strerror}); the "
                f"local cluster's {what} listens on {host.GATEWAY}:{port}. Stop what holds it "
                f"(`ss -ltnp 'sport = :{port}'` names it)."
            ) from None
