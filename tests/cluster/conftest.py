"""pytest wiring for tests/cluster: the ``cluster`` fixture and the ``cluster`` marker."""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:  # make `tests.cluster` importable whatever the rootdir/import mode
    sys.path.insert(0, _ROOT)

from tests.cluster.fixture import cluster  # noqa: E402,F401


def pytest_configure(config):
    """Register the marker used by the tests that need the control plane."""
    config.addinivalue_line(
        "markers", "cluster: needs the local Kubernetes control plane (tests/cluster)"
    )
