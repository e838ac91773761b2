"""The Grafana dashboard (controller/dashboard.py) names only series the trainer exports: each
query is parsed by a PromQL parser (promql-parser, the Rust one) and every selector's metric name
is checked against what trainer/telemetry/metrics.py declares (test_metrics.py holds that to what
it really serves). The local cluster's Prometheus evaluates every query too
(tests/e2e/test_metrics_tracking.py)."""

from __future__ import annotations

import json
import re

import promql_parser
import pytest

from controller import dashboard
from trainer.telemetry.metrics import NAMES

#: What Grafana puts in place of its variables before a query reaches Prometheus.
GRAFANA = {"$__rate_interval": "1m", "$namespace": ".*", "$job": ".*"}


def evaluable(query: str) -> str:
    """``query`` as Grafana sends it, its variables in place."""
    for name, value in GRAFANA.items():
        query = query.replace(name, value)
    assert "$" not in query, f"a variable nobody fills in: {query}"
    return query


def series(query: str) -> set[str]:
    """The metric names ``query``'s selectors read."""
    found: set[str] = set()

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            names = [m.value for m in node.matchers.matchers if m.name == "__name__"]
            assert node.name or names, f"a selector without a metric name: {query}"
            found.update([node.name] if node.name else names)
        return True

    promql_parser.walk(promql_parser.parse(evaluable(query)), visit)
    return found


def variable_series(definition: str) -> set[str]:
    """The series of a ``label_values(SELECTOR, label)`` variable (Grafana's, not PromQL)."""
    inner = re.fullmatch(r"label_values\((.+), *\w+\)", definition)
    assert inner, definition
    return series(inner.group(1))


def test_every_query_reads_only_series_the_trainer_exports():
    queries = dashboard.queries()
    assert len(queries) >= 15
    used: set[str] = set()
    for query in queries:
        names = series(query)
        assert names, query
        assert names <= NAMES, (query, names - NAMES)
        used |= names
    board = dashboard.dashboard()
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            assert variable_series(var["definition"]) <= NAMES
    # The panels: throughput, loss, step-time quantiles per rank, goodput, stuck and
    # straggler ranks, GPU utilisation.
    for name in (
        "ddpjob_samples_total",
        "ddpjob_loss",
        "ddpjob_step_seconds_bucket",
        "ddpjob_goodput_seconds_total",
        "ddpjob_stuck",
        "ddpjob_straggler",
        "ddpjob_gpu_utilization_ratio",
    ):
        assert name in used, name


def test_the_check_catches_a_series_the_trainer_does_not_export():
    assert series('rate(ddpjob_sample_total{job_name=~"$job"}[$__rate_interval])') == {
        "ddpjob_sample_total"
    }
    assert "ddpjob_sample_total" not in NAMES
    # A name inside a label matcher, a by-clause or a function is not a series.
    query = 'histogram_quantile(0.9, sum by (le, rank) (rate(x_bucket{rank="ddpjob_step"}[5m])))'
    assert series(query) == {"x_bucket"}
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(ddpjob_step[5m])")  # unbalanced: a parser, not a regex


def test_the_dashboard_is_grafanas_json_with_unique_panel_ids_and_layout():
    board = json.loads(dashboard.text())
    assert board["uid"] == dashboard.UID and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
