"""The pinned Go builds without building: the versions tools.py records are the ones the two
modules require (the tools folder's name and build-times.json carry them)."""

from __future__ import annotations

import json
import re

from localkube import operators, tools


def test_pinned_versions_match_the_go_modules():
    gomod = (tools.GO_DIR / "go.mod").read_text()
    assert f"k8s.io/kubernetes {tools.VERSIONS['kubernetes']}" in gomod
    assert f"sigs.k8s.io/kwok {tools.VERSIONS['kwok']}" in gomod
    assert f"helm.sh/helm/v3 {tools.VERSIONS['helm']}" in gomod
    assert f"go.etcd.io/etcd/server/v3 {tools.VERSIONS['etcd']}" in gomod
    # The training operator needs k8s.io v0.36: it is built by go-operators, not here.
    assert "github.com/kubeflow/training-operator" not in gomod
    got = operators.required_versions((operators.GO_DIR / "go.mod").read_text())
    assert set(got.values()) <= set(tools.VERSIONS.values())
    assert tools.VERSIONS["training-operator"] == got["github.com/kubeflow/training-operator"]
    assert tools.VERSIONS["kueue"] == got["sigs.k8s.io/kueue"]
    # Written into build-times.json and the tools digest: plain version strings, round-trip.
    assert all(re.fullmatch(r"v\d+\.\d+\.\d+", v) for v in tools.VERSIONS.values())
    assert json.loads(json.dumps(tools.VERSIONS)) == tools.VERSIONS
