"""The pinned Go builds without building: the one module of versions (localkube/versions.py) is
what the two Go modules require, and the tools folder's name and build-times.json carry it."""

from __future__ import annotations

import json
import re

from controller import kubeflow
from localkube import versions
from localkube.builds import gocmd, gotools, operators


def test_pinned_versions_match_the_go_modules():
    gomod = (gotools.GO_DIR / "go.mod").read_text()
    assert f"k8s.io/kubernetes {versions.KUBERNETES}" in gomod
    assert f"sigs.k8s.io/kwok {versions.KWOK}" in gomod
    assert f"helm.sh/helm/v3 {versions.HELM}" in gomod
    assert f"go.etcd.io/etcd/server/v3 {versions.ETCD}" in gomod
    coredns = (gotools.GO_DIR / "coredns" / "go.mod").read_text()
    assert f"github.com/coredns/coredns {versions.COREDNS}" in coredns
    # The operators need k8s.io v0.36: they are built by go-operators, not here.
    assert "github.com/kubeflow/training-operator" not in gomod
    got = operators.required_versions((operators.GO_DIR / "go.mod").read_text())
    assert got == operators.PINS
    assert got == {
        "github.com/kubeflow/training-operator": versions.TRAINING_OPERATOR,
        "github.com/kubeflow/trainer/v2": versions.TRAINER,
        "sigs.k8s.io/jobset": versions.JOBSET,
        "sigs.k8s.io/kueue": versions.KUEUE,
    }
    # Written into build-times.json and the tools digest: plain version strings, round-trip.
    assert all(re.fullmatch(r"v\d+\.\d+\.\d+", v) for v in versions.VERSIONS.values())
    assert json.loads(json.dumps(versions.VERSIONS)) == versions.VERSIONS


def test_the_operators_run_the_versions_the_controller_names():
    """One place for each pin: the controller's contract (what doctor and the hints name) is what
    the local cluster builds and runs."""
    assert versions.OPERATORS == {
        "training-operator": kubeflow.OPERATOR_VERSION,
        "kubeflow-trainer": kubeflow.TRAINER_VERSION,
        "jobset": kubeflow.JOBSET_VERSION,
        "kueue": kubeflow.KUEUE_VERSION,
    }


def test_required_versions_reads_require_lines_only():
    go_mod = (
        "module x\n\nrequire (\n\tgithub.com/kubeflow/trainer/v2 v2.3.0\n"
        "\tsigs.k8s.io/jobset v0.12.0 // indirect\n\tk8s.io/api v0.36.2\n)\n"
        "replace sigs.k8s.io/jobset => ../jobset\n"
    )
    assert operators.required_versions(go_mod) == {
        "github.com/kubeflow/trainer/v2": "v2.3.0",
        "sigs.k8s.io/jobset": "v0.12.0",
    }


def test_every_operator_manifest_comes_from_a_pinned_module():
    assert {module for module, _, _ in operators.MANIFESTS.values()} <= set(operators.PINS)
    assert set(operators.BINARIES) == {
        "training-operator",
        "trainer-controller-manager",
        "jobset-controller-manager",
        "kueue",
    }


def test_go_runs_with_the_builds_gc_target_unless_the_caller_sets_one(monkeypatch):
    monkeypatch.delenv("GOGC", raising=False)
    assert gocmd._go_env()["GOGC"] == gocmd.GOGC == "400"
    monkeypatch.setenv("GOGC", "off")
    assert gocmd._go_env()["GOGC"] == "off"
