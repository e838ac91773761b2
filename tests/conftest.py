"""pytest wiring for every test folder: the session fixtures ``cluster`` and ``real_node``, and
the ``cluster`` marker.

``cluster`` is a live local cluster (``localkube``) for the whole session. One started earlier
by ``make cluster-up`` is reused and left running; otherwise the fixture starts one (building
missing tools first) and the last session that leases it stops exactly what was started.
``DDPJOB_CLUSTER=skip`` skips every test that asks for it (they are then reported as skipped).

``real_node`` is that cluster with its real node Ready and this checkout's trainer image on it:
every test whose pods must run in containers of the image asks for it (the pod agent runs the
kwok nodes' pods as processes of this machine). Where the node cannot run (no root, missing
packages, ``DDPJOB_NODE=off``) those tests fail with the one line that says why.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # `localkube` and `tests.*` importable whatever the import mode
    sys.path.insert(0, _ROOT)

from localkube import node, tools  # noqa: E402
from localkube.handle import start_or_reuse, wait_until  # noqa: E402
from localkube.procs import LocalkubeError  # noqa: E402
from tests.timeouts import outside_test_timeout  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    """A live local cluster for the whole test session (see the module docstring).

    Concurrent sessions (two engineers' runs, ``pytest -n``) share it safely through leases.
    """
    if os.environ.get("DDPJOB_CLUSTER") == "skip":
        pytest.skip("DDPJOB_CLUSTER=skip: cluster tests disabled")
    # One line that says why and how to fix (no root, missing packages, ...): every test that
    # needs the cluster fails with it (outside the except block: no chained traceback).
    handle, error = None, None
    try:
        with outside_test_timeout():
            if not tools.is_built():
                tools.build(sys.stderr)
            handle = start_or_reuse()
    except LocalkubeError as exc:
        error = str(exc)
    if handle is None:
        pytest.fail(error, pytrace=False)
    try:
        yield handle
    finally:
        handle.control_plane.release()


@pytest.fixture(scope="session")
def real_node(cluster):
    """The cluster with its real node Ready and this checkout's trainer image on it (rebuilt and
    imported when the code changed: ``cluster.trainer_image()``); fails in one line when the
    cluster has no node."""
    error = None
    try:
        node.require()
        with outside_test_timeout():
            cluster.trainer_image()
    except LocalkubeError as exc:
        error = str(exc)
    if error:
        pytest.fail(error, pytrace=False)
    wait_until("node Ready", lambda: node.node_ready(cluster), 60)
    return cluster


def pytest_configure(config):
    """Register the marker used by the tests that need the local cluster."""
    config.addinivalue_line("markers", "cluster: needs the local Kubernetes cluster (localkube)")
