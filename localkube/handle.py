"""A running local cluster as its users (tests, bench) see it: kubectl, helm, the API client.

    from localkube.handle import start_or_reuse

    cluster = start_or_reuse()          # reuse a live cluster or start one, and lease it
    cluster.kubectl("get", "nodes")
    env = cluster.env                   # os.environ + KUBECONFIG=<repo>/.cluster/kubeconfig
    cluster.control_plane.release()     # stops it only if we started it and nobody else uses it

The pytest fixture ``cluster`` (tests/conftest.py) is this, for a whole test session.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.kubeflow import CONTAINER, LABEL_JOB_NAME

from . import tools
from .control_plane import ControlPlane


@contextlib.contextmanager
def temporary_namespace(cluster, prefix: str, level: str = "baseline"):
    """A fresh namespace enforcing Pod Security ``level``, ready for pods (its default service
    account exists), deleted afterwards with whatever the test left in it."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, f"pod-security.kubernetes.io/enforce={level}")
    wait_until(
        "default service account",
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        30,
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "pytorchjobs", "--all", "-n", name, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def wait_until(what: str, probe, timeout: float = 60, interval: float = 0.5):
    """Poll ``probe()`` until it returns a truthy value; return it or fail naming ``what``.

    For tests that wait on the cluster's eventual state (a condition, an event, a pod).
    """
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@dataclass
class Cluster:
    """A running local control plane, as seen by tests."""

    control_plane: ControlPlane
    kubeconfig: Path
    server: str
    started_here: bool  # True when a fixture (not `make cluster-up`) started it

    @property
    def kubectl_path(self) -> Path:
        """The kubectl built with the control plane (same minor version)."""
        return tools.bin_path("kubectl")

    @property
    def helm_path(self) -> Path:
        """helm v3, built from source."""
        return tools.bin_path("helm")

    @property
    def env(self) -> dict[str, str]:
        """``os.environ`` plus KUBECONFIG and PATH with the built kubectl/helm first."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{tools.tools_dir() / 'bin'}:{env.get('PATH', '')}"
        return env

    def kubectl(
        self, *args: str, input_text: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """Run kubectl against the cluster; raise on a non-zero exit when ``check``."""
        return self.control_plane.kubectl(
            *args, input_text=input_text, check=check, timeout=timeout
        )

    def helm(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        """Run helm against the cluster."""
        proc = subprocess.run(
            [str(self.helm_path), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def core_api(self):
        """A ``kubernetes.client.CoreV1Api`` for the admin user."""
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def job_pods(self, name: str, namespace: str) -> list[dict[str, Any]]:
        """A PyTorchJob's pods as API dicts (through the API, not kubectl)."""
        resp = self.core_api().list_namespaced_pod(
            namespace, label_selector=f"{LABEL_JOB_NAME}={name}", _preload_content=False
        )
        return json.loads(resp.data)["items"]

    def running_pod(self, name: str, namespace: str, replica: str) -> dict[str, Any] | None:
        """The pod ``<name>-<replica>`` once its trainer runs (reported Running)."""
        for pod in self.job_pods(name, namespace):
            if pod["metadata"]["name"] != f"{name}-{replica}":
                continue
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if (
                pod["status"].get("phase") == "Running"
                and statuses
                and statuses[0].get("state", {}).get("running")
            ):
                return pod
        return None

    def pod_pid(self, namespace: str, pod: dict[str, Any]) -> int | None:
        """The host pid of ``pod``'s trainer (the pod agent records it in agent-pids.json)."""
        path = self.control_plane.state_dir / "agent-pids.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        meta = pod["metadata"]
        info = data.get(f"{namespace}/{meta['name']}/{meta['uid']}")
        return info["pid"] if info else None

    def pod_log_lines(self, namespace: str, pod_name: str) -> list[str]:
        """Everything every run of the pod named ``pod_name`` printed, in order: the ground
        truth for a followed log (each run's output is its own CRI-format file on the node)."""
        root = self.control_plane.state_dir / "pods"
        files = []
        for d in root.glob(f"{namespace}_{pod_name}_*"):
            files.extend((d / CONTAINER).glob("*.log"))
        entries = []
        for f in files:
            partial = ""
            for raw in f.read_text(errors="replace").splitlines():
                stamp, _stream, tag, body = [*raw.split(" ", 3), ""][:4]
                if tag == "P":
                    partial += body
                    continue
                entries.append((stamp, str(f), len(entries), partial + body))
                partial = ""
        # Runs do not overlap in time: order by each file's first stamp, then line order.
        first: dict[str, str] = {}
        for stamp, f, _, _ in entries:
            first.setdefault(f, stamp)
        entries.sort(key=lambda e: (first[e[1]], e[2]))
        return [e[3] for e in entries]

    def api_client(self):
        """Return a ``kubernetes.client.ApiClient`` for the admin user."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))


def start_or_reuse(log=sys.stderr) -> Cluster:
    """Reuse a live cluster or start one, and hold a lease on it (``release()`` drops it)."""
    tools.build(log)
    cp = ControlPlane(log=log)
    state = cp.up(owner="fixture", lease=True)
    return Cluster(cp, cp.kubeconfig, state["server"], state.get("owner") == "fixture")
