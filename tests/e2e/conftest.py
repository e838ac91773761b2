"""End-to-end tests of the cluster commands on the local control plane (tests/cluster)."""

import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.cluster.fixture import cluster  # noqa: E402,F401 - the session fixture


@pytest.fixture
def namespace(cluster):  # noqa: F811 - the fixture above
    """A fresh namespace enforcing the `baseline` Pod Security profile, removed afterwards.

    `restricted` also admits our pods (the local operator runs with the compliant init-container
    template; tests/packaging holds that), but a cluster with upstream's template refuses Worker
    pods there, and these tests are about recovery, not admission.
    """
    from tests.cluster.fixture import temporary_namespace

    with temporary_namespace(cluster, "e2e") as name:
        yield name
