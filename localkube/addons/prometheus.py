"""The local cluster's Prometheus: upstream's server (``builds/prometheus.py``), a host process
that scrapes pods as a Prometheus in a cluster does: by Kubernetes service discovery
(``kubernetes_sd_configs``, role ``pod``) and the ``prometheus.io/*`` annotations. Its files
live under the state folder (``.cluster/prometheus/``, which ``down`` removes).

- Address: the node's bridge gateway at the fixed port :data:`PORT` (``gateway.py``): pods (a
  Grafana, a job's own check) use :data:`ENDPOINT`, the Service ``prometheus`` in
  ``ddpjob-system``; the host uses :data:`HOST_ENDPOINT`. The host reaches every pod's IP over
  the bridge, so it scrapes them where they are.
- Discovery: the API server at 127.0.0.1 as the user ``ddpjob:prometheus`` (a client
  certificate, ``prometheus.kubeconfig``), bound to a ClusterRole that may only get, list and
  watch pods (:func:`objects`): the least the pod role of the discovery needs.
- Scraping (:func:`config`): a pod annotated ``prometheus.io/scrape: "true"`` is scraped at
  ``prometheus.io/port`` and ``prometheus.io/path`` (default ``/metrics``), every
  :data:`SCRAPE_INTERVAL_S` seconds, with the target labels ``namespace``, ``pod``,
  ``container`` and ``node``; the series' own labels win over them (``honor_labels``: the
  trainer's ``namespace`` is the pod's anyway).

The server needs the node's bridge: it runs with the real node only (:data:`ENABLED`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..controlplane import bootstrap
from ..controlplane.context import Component, http_get
from ..node import host
from . import gateway

if TYPE_CHECKING:
    from ..controlplane.context import Context

ENABLED = host.ENABLED
#: Prometheus' own default port; fixed (``gateway.py``).
PORT = 9090
NAMESPACE = "ddpjob-system"
SERVICE = "prometheus"
ENDPOINT = f"http://{SERVICE}.{NAMESPACE}.svc:{PORT}"
HOST_ENDPOINT = f"http://{host.GATEWAY}:{PORT}"
#: Its client identity (``bootstrap.USERS``) and the ClusterRole it is bound to.
USER = "prometheus"
ROLE = "ddpjob:prometheus"
#: How often pods are scraped: short, so that a test's paced job is seen within seconds.
SCRAPE_INTERVAL_S = 5
#: The scrape job's name (the ``job`` label of what it scrapes).
JOB = "kubernetes-pods"
RETENTION = "1d"
_ANNOTATION = "__meta_kubernetes_pod_annotation_prometheus_io_"


def data_dir(state_dir: Path) -> Path:
    """Everything the server keeps: its config and ``data/`` (the TSDB)."""
    return state_dir / "prometheus"


def preflight(repo: Path) -> None:
    """One line when something else on this machine holds :data:`PORT` on every address."""
    if ENABLED:
        gateway.check_port(PORT, "Prometheus")


def objects() -> list[dict[str, Any]]:
    """Its ClusterRole (pods: get, list, watch), the binding to its user, and the Service pods
    name it by."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": ROLE},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        role,
        bootstrap.cluster_role_binding(USER, ROLE, bootstrap.USERS[USER][0]),
        *gateway.service(SERVICE, NAMESPACE, "http", PORT),
    ]


def apply_objects(ctx: Context) -> None:
    ctx.apply("\n---\n".join(yaml.safe_dump(o) for o in objects()))


def config(kubeconfig: str) -> dict[str, Any]:
    """The server's configuration: one scrape job over every annotated pod."""
    relabel = [
        {"source_labels": [f"{_ANNOTATION}scrape"], "regex": "true", "action": "keep"},
        {
            "source_labels": [f"{_ANNOTATION}path"],
            "regex": "(.+)",
            "target_label": "__metrics_path__",
        },
        {
            # The pod's IP with the annotated port (the discovery's address has the first
            # declared container port, or none).
            "source_labels": ["__meta_kubernetes_pod_ip", f"{_ANNOTATION}port"],
            "regex": "(.+);(\\d+)",
            "replacement": "$1:$2",
            "target_label": "__address__",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
    ]
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
        },
        "scrape_configs": [
            {
                "job_name": JOB,
                "honor_labels": True,
                "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": kubeconfig}],
                "relabel_configs": relabel,
            }
        ],
    }


def prepare(ctx: Context) -> None:
    data = data_dir(ctx.state_dir)
    (data / "data").mkdir(parents=True, exist_ok=True)
    (data / "prometheus.yml").write_text(json.dumps(config(ctx.kubeconfig(USER)), indent=2))


def argv(ctx: Context) -> list[str]:
    data = data_dir(ctx.state_dir)
    return [
        str(ctx.bindir / "prometheus"),
        f"--config.file={data / 'prometheus.yml'}",
        f"--storage.tsdb.path={data / 'data'}",
        f"--storage.tsdb.retention.time={RETENTION}",
        f"--web.listen-address={host.GATEWAY}:{PORT}",
    ]


def ready(ctx: Context) -> bool:
    return "Ready" in http_get(f"{HOST_ENDPOINT}/-/ready")


PROMETHEUS = Component("prometheus", argv, ready, prepare=prepare)
