"""The local cluster's Prometheus and MLflow server without running them: the pin is what the Go
module requires, the build keeps only the Kubernetes discovery, the scrape job reads the pods'
annotations, its credentials may only read pods, and both servers sit behind a Service of the
gateway. ``tests/e2e/test_metrics_tracking.py`` runs them."""

from __future__ import annotations

import sys
from pathlib import Path

from localkube import sequence, versions
from localkube.addons import mlflow, prometheus, s3
from localkube.builds import gotools
from localkube.builds import prometheus as build
from localkube.builds.gocommand import required_version
from localkube.controlplane import bootstrap
from localkube.node import host


def test_the_go_module_requires_the_pinned_prometheus_and_builds_only_its_k8s_discovery():
    go_mod = (build.GO_DIR / "go.mod").read_text()
    assert required_version(go_mod, build.MODULE) == versions.PROMETHEUS
    assert versions.VERSIONS["prometheus"] == versions.PROMETHEUS
    assert build.COMMAND.tags == ("remove_all_sd", "enable_kubernetes_sd")
    assert f"Version={versions.PROMETHEUS_RELEASE}" in build.COMMAND.ldflags
    # The Kubernetes modules' graph is their own.
    assert build.MODULE not in (gotools.GO_DIR / "go.mod").read_text()


def test_a_changed_pin_names_a_fresh_tools_folder(monkeypatch):
    before = gotools.tools_dir()
    monkeypatch.setitem(versions.PROMETHEUS_SERVER, "prometheus", "v0.315.0")
    assert gotools.tools_dir() != before


def test_the_scrape_job_reads_the_pods_annotations_by_kubernetes_discovery():
    cfg = prometheus.config("/x/prometheus.kubeconfig")
    (job,) = cfg["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [
        {"role": "pod", "kubeconfig_file": "/x/prometheus.kubeconfig"}
    ]
    relabel = job["relabel_configs"]
    assert relabel[0] == {
        "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
        "regex": "true",
        "action": "keep",
    }
    targets = {r.get("target_label") for r in relabel}
    assert {"__address__", "__metrics_path__", "namespace", "pod", "node"} <= targets
    address = next(r for r in relabel if r.get("target_label") == "__address__")
    assert address["source_labels"][1].endswith("prometheus_io_port")
    assert job["honor_labels"] is True  # the series' own namespace and node stay


def test_its_credentials_may_only_read_pods():
    ns, role, binding, service, slice_ = prometheus.objects()
    assert ns["metadata"]["name"] == "ddpjob-system"
    assert role["kind"] == "ClusterRole"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "ddpjob:prometheus"}
    ]
    assert bootstrap.USERS[prometheus.USER] == ("ddpjob:prometheus", ())
    assert service["metadata"] == {"name": "prometheus", "namespace": "ddpjob-system"}
    assert slice_["endpoints"] == [{"addresses": [host.GATEWAY], "conditions": {"ready": True}}]
    assert prometheus.ENDPOINT == "http://prometheus.ddpjob-system.svc:9090"


def test_mlflow_is_the_venvs_server_one_worker_no_job_runner_behind_a_service():
    argv = mlflow.server_argv(Path("/data"), "10.0.0.1", 5000, ("a:5000", "b:5000"))
    assert argv[0] == str(Path(sys.executable).with_name("mlflow")) and argv[1] == "server"
    assert argv[argv.index("--backend-store-uri") + 1] == "sqlite:////data/mlflow.db"
    assert argv[argv.index("--workers") + 1] == "1"
    assert argv[argv.index("--allowed-hosts") + 1] == "a:5000,b:5000"
    env = mlflow.server_env({"PATH": "/bin"})
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false" and env["PATH"] == "/bin"
    _, service, slice_ = mlflow.objects()
    assert service["metadata"] == {"name": "mlflow", "namespace": "ddpjob-system"}
    assert service["spec"]["ports"] == [{"name": "http", "port": 5000, "targetPort": 5000}]
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "mlflow"
    assert mlflow.ENDPOINT == "http://mlflow.ddpjob-system.svc:5000"


def test_both_run_with_the_node_their_ports_fixed_and_checked_before_up():
    names = [c.name for c in sequence.components()]
    assert ("prometheus" in names) == prometheus.ENABLED and ("mlflow" in names) == mlflow.ENABLED
    ports = {s3.PORT, prometheus.PORT, mlflow.PORT}
    assert len(ports) == 3
    from localkube import procs

    assert all(p < procs.PORTS_FROM for p in ports)
    assert {prometheus.preflight, mlflow.preflight} <= set(sequence.HOST_CHECKS)
