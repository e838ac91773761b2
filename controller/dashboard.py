"""ddpjob's Grafana dashboard: the trainer's Prometheus metrics (trainer/telemetry/metrics.py) of
one job, picked by the variables ``namespace`` and ``job`` (the series' ``job_name``).

Pure: :func:`dashboard` builds it, :func:`text` is the JSON the chart ships
(``charts/ddpjob/dashboards/ddpjob.json``, written by ``make generate``) and ``render`` puts
into the ConfigMap that ``monitoring.grafana_dashboard`` asks for. Every query names only
series the trainer exports (a test parses them), with Grafana's ``$job``, ``$namespace`` and
``$__rate_interval`` in place (:func:`queries` lists them).
"""

from __future__ import annotations

import json
from typing import Any

from controller.render.output import GENERATED

UID = "ddpjob-training"
TITLE = "ddpjob: training jobs"
#: The ConfigMap key, and the file under charts/ddpjob/dashboards/.
FILE = "ddpjob.json"
#: Grafana's dashboard sidecar (kube-prometheus-stack, the grafana chart) loads the ConfigMaps
#: that carry this label.
LABEL = "grafana_dashboard"

_SEL = 'job_name=~"$job", namespace=~"$namespace"'
_RATE = "$__rate_interval"

# (title, unit, [(legend, query)], width): the panels, row by row (24 columns a row).
_PANELS: tuple[tuple[str, str, list[tuple[str, str]], int], ...] = (
    (
        "Throughput (samples/s, the job)",
        "short",
        [("samples/s", f"sum(rate(ddpjob_samples_total{{{_SEL}}}[{_RATE}]))")],
        8,
    ),
    (
        "Throughput (tokens/s, the job)",
        "short",
        [("tokens/s", f"sum(rate(ddpjob_tokens_total{{{_SEL}}}[{_RATE}]))")],
        8,
    ),
    (
        "Loss (log window mean)",
        "short",
        [("loss", f'max(ddpjob_loss{{{_SEL}, rank="0"}})')],
        8,
    ),
    (
        "Step per rank",
        "short",
        [("rank {{rank}}", f"max by (rank) (ddpjob_step{{{_SEL}}})")],
        8,
    ),
    (
        "Step time p50 / p90 / p99 per rank",
        "s",
        [
            (
                f"p{q} rank {{{{rank}}}}",
                f"histogram_quantile(0.{q}, sum by (le, rank) "
                f"(rate(ddpjob_step_seconds_bucket{{{_SEL}}}[{_RATE}])))",
            )
            for q in (50, 90, 99)
        ],
        16,
    ),
    (
        "Goodput (productive share of the job's time)",
        "percentunit",
        [
            (
                "goodput",
                f'sum(ddpjob_goodput_seconds_total{{{_SEL}, part="productive"}}) / '
                f"sum(ddpjob_goodput_seconds_total{{{_SEL}}})",
            )
        ],
        8,
    ),
    (
        "The job's time by part (s)",
        "s",
        [("{{part}}", f"sum by (part) (ddpjob_goodput_seconds_total{{{_SEL}}})")],
        8,
    ),
    (
        "Restarts",
        "short",
        [("restarts", f"max(ddpjob_restarts{{{_SEL}}})")],
        8,
    ),
    (
        "Stuck and straggler ranks",
        "short",
        [
            ("stuck rank {{rank}}", f"max by (rank) (ddpjob_stuck{{{_SEL}}}) > 0"),
            ("straggler rank {{rank}}", f"max by (rank) (ddpjob_straggler{{{_SEL}}}) > 0"),
        ],
        8,
    ),
    (
        "Seconds since each rank's last step",
        "s",
        [
            (
                "rank {{rank}}",
                f"time() - max by (rank) (ddpjob_last_step_timestamp_seconds{{{_SEL}}})",
            )
        ],
        8,
    ),
    (
        "Busy time per step (forward + backward, not waiting for peers)",
        "s",
        [("rank {{rank}}", f"max by (rank) (ddpjob_busy_seconds{{{_SEL}}})")],
        8,
    ),
    (
        "Data wait (share of the window)",
        "percentunit",
        [("rank {{rank}}", f"max by (rank) (ddpjob_data_wait_ratio{{{_SEL}}})")],
        8,
    ),
    (
        "Checkpoint stall (s per s)",
        "percentunit",
        [("stall", f"sum(rate(ddpjob_checkpoint_stall_seconds_total{{{_SEL}}}[{_RATE}]))")],
        8,
    ),
    (
        "GPU utilisation per rank",
        "percentunit",
        [("rank {{rank}}", f"max by (rank) (ddpjob_gpu_utilization_ratio{{{_SEL}}})")],
        8,
    ),
    (
        "GPU memory used per rank",
        "bytes",
        [("rank {{rank}}", f"max by (rank) (ddpjob_gpu_memory_used_bytes{{{_SEL}}})")],
        8,
    ),
    (
        "GPU power per rank",
        "watt",
        [("rank {{rank}}", f"max by (rank) (ddpjob_gpu_power_watts{{{_SEL}}})")],
        8,
    ),
)

_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": _DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": False,
        "sort": 1,
        "current": {},
    }


def _panel(index: int, x: int, y: int, spec: tuple[str, str, list[tuple[str, str]], int]) -> dict:
    title, unit, targets, width = spec
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": _DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": width, "h": 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (legend, expr) in enumerate(targets)
        ],
    }


def dashboard() -> dict[str, Any]:
    """The dashboard, as Grafana imports it."""
    panels, x, y = [], 0, 0
    for index, spec in enumerate(_PANELS):
        width = spec[3]
        if x + width > 24:
            x, y = 0, y + 8
        panels.append(_panel(index, x, y, spec))
        x += width
    return {
        "uid": UID,
        "title": TITLE,
        "tags": ["ddpjob", "training"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _variable("namespace", "namespace", "label_values(ddpjob_step, namespace)"),
                _variable(
                    "job", "job", 'label_values(ddpjob_step{namespace=~"$namespace"}, job_name)'
                ),
            ]
        },
        "panels": panels,
    }


def queries() -> list[str]:
    """Every PromQL query of the dashboard (its panels' and its variables' series)."""
    board = dashboard()
    out = [t["expr"] for p in board["panels"] for t in p["targets"]]
    return out


def text() -> str:
    """The dashboard as the file the chart ships and the ConfigMap holds: generated, and marked
    so (a ``"$comment"``, which Grafana ignores)."""
    return json.dumps({"$comment": GENERATED, **dashboard()}, indent=2) + "\n"
