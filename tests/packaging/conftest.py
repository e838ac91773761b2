"""Shared pieces for the packaging tests: paths, helm, the chart renderer, label normalising.

helm is the one built from source with the local control plane's tools (localkube/builds/gotools.py,
pinned there); the first test that needs it builds the tools if they are missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from localkube.builds import gotools as tools

ROOT = Path(__file__).resolve().parents[2]

CHART = ROOT / "charts" / "ddpjob"
K8S = ROOT / "k8s"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))

# The only labels in which the chart and `controller render` may differ: Helm's own.
HELM_CHART_LABEL = "helm.sh/chart"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    """The pinned helm: this tools folder's, else one built for an earlier revision of the
    control-plane wrapper (same helm version), else build the tools now."""
    path = tools.bin_path("helm")
    if path.exists():
        return path
    others = sorted(
        path.parents[2].glob(f"k8s-{tools.VERSIONS['kubernetes']}-*/bin/helm"),
        key=lambda p: p.stat().st_mtime,
    )
    if others:
        return others[-1]
    tools.build()
    return path


@pytest.fixture(scope="session")
def helm(helm_bin, tmp_path_factory) -> Callable[..., subprocess.CompletedProcess]:
    """Run the pinned helm with its config and cache in a scratch folder; no cluster needed."""
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    env.pop("KUBECONFIG", None)

    def run(*args: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [str(helm_bin), *args],
            env={**env, **kw.pop("env", {})},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            **kw,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}"
            )
        return proc

    return run


def spec_values(spec_path: Path, *overrides: str, output: str = "yaml") -> dict[str, Any]:
    """``python -m controller render SPEC --values [-o json]`` (the CLI users run), parsed."""
    sets = [a for o in overrides for a in ("--set", o)]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "controller",
            "render",
            str(spec_path),
            "--values",
            "-o",
            output,
            *sets,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return yaml.safe_load(out.stdout)


def helm_template(
    helm,
    values: dict[str, Any] | Path,
    tmp_path: Path,
    *,
    release: str = "ddpjob",
    namespace: str = "default",
) -> list[dict[str, Any]]:
    """``helm template`` of the chart with ``values``; the parsed documents."""
    if isinstance(values, dict):
        # JSON is YAML to Helm, and keeps every string a string (PyYAML's YAML 1.1 output does
        # not: a plain `y` or `1e-05` reads back in Go as a bool or a float).
        path = tmp_path / "values.json"
        path.write_text(json.dumps(values))
        values = path
    out = helm("template", release, str(CHART), "-f", str(values), "--namespace", namespace)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def without_helm_labels(obj: Any) -> Any:
    """A deep copy of ``obj`` with the two labels only the chart sets dropped from every
    ``labels`` map (``helm.sh/chart``, and ``managed-by``, which says Helm or ddpjob)."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "labels" and isinstance(v, dict):
                v = {
                    lk: lv for lk, lv in v.items() if lk not in (HELM_CHART_LABEL, MANAGED_BY_LABEL)
                }
            out[k] = without_helm_labels(v)
        return out
    if isinstance(obj, list):
        return [without_helm_labels(v) for v in obj]
    return obj
