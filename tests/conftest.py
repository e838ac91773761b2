"""pytest wiring for every test folder: the session fixture ``cluster`` and the ``cluster`` marker.

``cluster`` is a live local cluster (``localkube``) for the whole session. One started earlier
by ``make cluster-up`` is reused and left running; otherwise the fixture starts one (building
missing tools first) and the last session that leases it stops exactly what was started.
``DDPJOB_CLUSTER=skip`` skips every test that asks for it (they are then reported as skipped).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # `localkube` and `tests.*` importable whatever the import mode
    sys.path.insert(0, _ROOT)

from localkube import tools  # noqa: E402
from localkube.handle import start_or_reuse  # noqa: E402
from localkube.procs import LocalkubeError  # noqa: E402


def _build_outside_test_timeout() -> None:
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
        tools.build(sys.stderr)
    finally:
        if paused and paused[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *paused)


@pytest.fixture(scope="session")
def cluster():
    """A live local cluster for the whole test session (see the module docstring).

    Concurrent sessions (two engineers' runs, ``pytest -n``) share it safely through leases.
    """
    if os.environ.get("DDPJOB_CLUSTER") == "skip":
        pytest.skip("DDPJOB_CLUSTER=skip: cluster tests disabled")
    _build_outside_test_timeout()
    # One line that says why and how to fix (no root, missing packages, ...): every test that
    # needs the cluster fails with it (outside the except block: no chained traceback).
    handle, error = None, None
    try:
        handle = start_or_reuse()
    except LocalkubeError as exc:
        error = str(exc)
    if handle is None:
        pytest.fail(error, pytrace=False)
    try:
        yield handle
    finally:
        handle.control_plane.release()


def pytest_configure(config):
    """Register the marker used by the tests that need the local cluster."""
    config.addinivalue_line("markers", "cluster: needs the local Kubernetes cluster (localkube)")
