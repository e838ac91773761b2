"""The local cluster's Prometheus, built by a Go module of its own (``builds/go-prometheus``):
upstream's server command, unmodified (``github.com/prometheus/prometheus/cmd/prometheus`` at
``versions.PROMETHEUS``, Apache-2.0; module v0.316.0 is Prometheus 3.16.0). ``addons/prometheus.py``
runs it. How such a command is built: ``gocommand.py``.

Built with upstream's build tags that leave out every service discovery but Kubernetes'
(``remove_all_sd,enable_kubernetes_sd``: ``plugins/plugin_*.go``), so the cloud SDKs the other
discoveries link (AWS, Azure, GCE, OVH, ...) are neither downloaded nor compiled; and without
the ``builtinassets`` tag, so the web UI's assets are not embedded (its HTTP API answers all the
same). Debian's own ``prometheus`` package cannot stand in: Debian removed its Kubernetes
service discovery.
"""

from __future__ import annotations

from pathlib import Path

from .. import versions
from .gocommand import GoCommand

GO_DIR = Path(__file__).resolve().parent / "go-prometheus"
MODULE = "github.com/prometheus/prometheus"
BINARY = "prometheus"
#: Upstream's build tags for one service discovery (``plugins/plugin_kubernetes.go``).
TAGS = ("remove_all_sd", "enable_kubernetes_sd")
_VERSION_PKG = "github.com/prometheus/common/version"

#: Stripped; the release stamped as upstream's promu does (``prometheus --version`` says it).
COMMAND = GoCommand(
    go_dir=GO_DIR,
    module=MODULE,
    version=versions.PROMETHEUS,
    pins=versions.PROMETHEUS_SERVER,
    binary=BINARY,
    package=f"{MODULE}/cmd/prometheus",
    ldflags=(
        f"-s -w -X {_VERSION_PKG}.Version={versions.PROMETHEUS_RELEASE} "
        f"-X {_VERSION_PKG}.Branch=release -X {_VERSION_PKG}.BuildUser=localkube"
    ),
    tags=TAGS,
)
