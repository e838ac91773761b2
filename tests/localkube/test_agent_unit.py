"""Pure parts of the pod agent and the harness (no control plane needed)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

from localkube import tools
from localkube.agent import CriLogWriter, exit_code, expand, rewrite_env
from localkube.bootstrap import KWOK_CONFIG
from localkube.bootstrap import kwok_node as _node
from localkube.procs import proc_start_time as _proc_start_time


def test_exit_code_maps_signals_to_128_plus_n():
    assert exit_code(0) == 0
    assert exit_code(1) == 1
    assert exit_code(-signal.SIGKILL) == 137
    assert exit_code(-signal.SIGTERM) == 143


def test_real_process_killed_by_sigterm_reports_143():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc.wait()) == 143


def test_rewrite_env_points_replicas_at_loopback_and_the_job_port():
    env = {
        "MASTER_ADDR": "myjob-master-0",
        "MASTER_PORT": "23456",
        "PET_RDZV_ENDPOINT": "myjob-worker-0:23456",
        "OTHER": "myjob-master-0.default.svc.cluster.local:29500",
        "SVC": "metrics.monitoring.svc:9090",
        "RANK": "1",
        "TEXT": "hello myjob-master-0 world",
        "HOSTNAME": "myjob-worker-1",
    }
    out = rewrite_env(env, 41000)
    assert out["MASTER_ADDR"] == "127.0.0.1"
    assert out["MASTER_PORT"] == "41000"
    assert out["PET_RDZV_ENDPOINT"] == "127.0.0.1:41000"
    assert out["OTHER"] == "127.0.0.1:41000"
    assert out["SVC"] == "127.0.0.1:9090"
    assert out["RANK"] == "1"
    assert out["TEXT"] == "hello myjob-master-0 world"  # only whole host values change
    assert out["HOSTNAME"] == "myjob-worker-1"  # the pod's own name, as in a container


def test_cri_log_writer_writes_full_and_partial_lines(tmp_path):
    path = tmp_path / "c" / "0.log"
    writer = CriLogWriter(path)
    writer.write("stdout", b"hello\n")
    writer.write("stderr", b"no newline")
    writer.close()
    lines = path.read_text().splitlines()
    stamp, stream, tag, body = lines[0].split(" ", 3)
    assert (stream, tag, body) == ("stdout", "F", "hello")
    assert stamp.endswith("Z")
    assert lines[1].split(" ", 3)[1:] == ["stderr", "P", "no newline"]


def test_fake_nodes_advertise_eight_gpus():
    node = _node("kwok-node-0")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert "Stage" in KWOK_CONFIG


def test_proc_start_time_identifies_a_live_process():
    assert _proc_start_time(os.getpid())
    assert _proc_start_time(2**22 + 12345) is None


def test_pinned_versions_match_the_go_module():
    gomod = (tools.GO_DIR / "go.mod").read_text()
    assert f"k8s.io/kubernetes {tools.VERSIONS['kubernetes']}" in gomod
    assert f"github.com/kubeflow/training-operator {tools.VERSIONS['training-operator']}" in gomod
    assert f"sigs.k8s.io/kwok {tools.VERSIONS['kwok']}" in gomod
    assert f"helm.sh/helm/v3 {tools.VERSIONS['helm']}" in gomod
    assert f"go.etcd.io/etcd/server/v3 {tools.VERSIONS['etcd']}" in gomod
    # Written into build-times.json and the tools digest: plain version strings, round-trip.
    assert all(re.fullmatch(r"v\d+\.\d+\.\d+", v) for v in tools.VERSIONS.values())
    assert json.loads(json.dumps(tools.VERSIONS)) == tools.VERSIONS


def test_expand_follows_kubelet_rules():
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "41000"}
    assert expand("--addr=$(MASTER_ADDR):$(MASTER_PORT)", env) == "--addr=127.0.0.1:41000"
    assert expand("$(UNDEFINED) stays", env) == "$(UNDEFINED) stays"
    assert expand("$$(MASTER_ADDR) is escaped", env) == "$(MASTER_ADDR) is escaped"
