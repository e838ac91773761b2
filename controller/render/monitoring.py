"""What the job's ``monitoring`` asks for beside the job: a PodMonitor for the Prometheus
Operator and a ConfigMap with ddpjob's Grafana dashboard; and the pods' scrape annotations.

Pure, like the renderers beside it. The pods of either API are found by their standard labels
(``pod.py``); the PodMonitor takes each pod's address and port from its scrape annotations, so
it needs no declared container port (a TrainJob's runtime patch cannot add one).
"""

from __future__ import annotations

from typing import Any

from controller import dashboard
from controller.kubeflow import CONTAINER, TRAINJOB_CONTAINER
from controller.render.pod import LABEL_INSTANCE, LABEL_NAME, METRICS_PATH, standard_labels
from controller.spec import JobSpec

POD_MONITOR = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor"}


def pod_monitor(spec: JobSpec) -> dict[str, Any]:
    """A PodMonitor of the job's pods: each pod's IP at its annotated port, the training
    container's only; the series' own labels (``namespace``, ``rank``...) kept as they are."""
    address = "__meta_kubernetes_pod_annotation_prometheus_io_port"
    return {
        **POD_MONITOR,
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": {**standard_labels(spec), **spec.monitoring.pod_monitor_labels},
        },
        "spec": {
            "selector": {
                "matchLabels": {LABEL_NAME: "ddpjob", LABEL_INSTANCE: spec.name},
            },
            "podMetricsEndpoints": [
                {
                    "path": METRICS_PATH,
                    "honorLabels": True,
                    "relabelings": [
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_container_name"],
                            "regex": f"{CONTAINER}|{TRAINJOB_CONTAINER}",
                            "action": "keep",
                        },
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_ip", address],
                            "regex": "(.+);(\\d+)",
                            "replacement": "$1:$2",
                            "targetLabel": "__address__",
                        },
                    ],
                }
            ],
        },
    }


def dashboard_config_map(spec: JobSpec) -> dict[str, Any]:
    """The ConfigMap Grafana's dashboard sidecar loads (``grafana_dashboard: "1"``)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{spec.name}-grafana-dashboard",
            "namespace": spec.namespace,
            "labels": {**standard_labels(spec), dashboard.LABEL: "1"},
        },
        "data": {dashboard.FILE: dashboard.text()},
    }


def monitoring_objects(spec: JobSpec) -> list[dict[str, Any]]:
    """The objects ``monitoring`` asks for, in the order they are created."""
    out = []
    if spec.monitoring.pod_monitor:
        out.append(pod_monitor(spec))
    if spec.monitoring.grafana_dashboard:
        out.append(dashboard_config_map(spec))
    return out
