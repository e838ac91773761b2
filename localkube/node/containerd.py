"""The node's container runtime: containerd (Debian's, with runc) and the CNI bridge network its
CRI plugin puts pods on (:data:`host.BRIDGE`, ``10.244.0.0/24``, the gateway is the node IP).

Where things live: configs, sockets and IPAM leases under /run/ddpjob; containerd's root
(images survive ``down``) under /var/lib/ddpjob. What the node changes on the machine, and how
``down`` puts it back: ``host.py``.
"""

from __future__ import annotations

import json
import subprocess
from typing import TYPE_CHECKING

from .. import procs
from ..controlplane.context import Component
from . import host
from .image_import import serves
from .images import images

if TYPE_CHECKING:
    from ..controlplane.context import Context


def prepare_host(ctx: Context) -> None:
    """Record the machine as it is, then the bridge (and the API server's Service address on
    it), /run/netns as a mount point of its own, the CNI network and containerd's config."""
    with host.machine_lock():
        host.check_owner(ctx.repo)
        host.record(ctx.repo)
        for path in (host.CONTAINERD_ROOT, host.CONTAINERD_STATE, host.CNI_CONF_DIR):
            path.mkdir(parents=True, exist_ok=True)
        host.create_bridge()
        host.forward_kubernetes_service(ctx.ports["apiserver"])
        host.share_netns_dir()
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
    return host.CONTAINERD_SOCKET.exists() and serves(str(host.CONTAINERD_SOCKET))


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


def _argv(_ctx: Context) -> list[str]:
    return ["containerd", "--config", str(host.CONTAINERD_CONFIG)]


CONTAINERD = Component(
    "containerd",
    _argv,
    containerd_ready,
    wait="now",
    timeout_s=30,
    prepare=prepare_host,
)
