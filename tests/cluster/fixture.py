"""The session-scoped pytest fixture ``cluster``.

Use from any test directory::

    # tests/e2e/conftest.py
    pytest_plugins = ["tests.cluster.fixture"]

    def test_submit(cluster):
        cluster.kubectl("get", "nodes")
        env = cluster.env  # os.environ + KUBECONFIG=<repo>/.cluster/kubeconfig

A live cluster (``make cluster-up`` earlier) is reused and left running; otherwise the fixture
starts one (building missing tools first) and the last session using it stops exactly what was
started, at session end. The fixture always uses ``<repo>/.cluster`` (no env var needed);
``DDPJOB_CLUSTER=skip`` skips every test that asks for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

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

    def api_client(self):
        """Return a ``kubernetes.client.ApiClient`` for the admin user."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))


def _build_outside_test_timeout(log) -> None:
    """Build missing tools with pytest-timeout's SIGALRM timer paused.

    A cold build (about 15 min on 2 cores) must not count against the per-test timeout of
    whichever test first asks for the fixture; the timer resumes with its remaining time.
    """
    if tools.is_built():
        return
    paused = None
    if threading.current_thread() is threading.main_thread():
        paused = signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        tools.build(log)
    finally:
        if paused and paused[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *paused)


def start_or_reuse(log=sys.stderr) -> Cluster:
    """Reuse a live cluster or start one, and hold a lease on it; see :func:`cluster`."""
    _build_outside_test_timeout(log)
    cp = ControlPlane(log=log)
    state = cp.up(owner="fixture", lease=True)
    return Cluster(cp, cp.kubeconfig, state["server"], state.get("owner") == "fixture")


@pytest.fixture(scope="session")
def cluster():
    """A live local control plane for the whole test session (see module docstring).

    A cluster started by ``make cluster-up`` is used and left running. One started by a
    fixture is stopped by the last pytest session that leases it (concurrent sessions, e.g.
    two engineers' runs or ``pytest -n``, share it safely).
    """
    if os.environ.get("DDPJOB_CLUSTER") == "skip":
        pytest.skip("DDPJOB_CLUSTER=skip: cluster tests disabled")
    handle = start_or_reuse()
    try:
        yield handle
    finally:
        handle.control_plane.release()
