"""End-to-end tests of the cluster commands on the local cluster (localkube)."""

import pytest


@pytest.fixture
def namespace(cluster):
    """A fresh namespace enforcing the `baseline` Pod Security profile, removed afterwards.

    `restricted` also admits our pods (the local operator runs with the compliant init-container
    template; tests/packaging holds that), but a cluster with upstream's template refuses Worker
    pods there, and these tests are about recovery, not admission.
    """
    from localkube.handle import temporary_namespace

    with temporary_namespace(cluster, "e2e") as name:
        yield name
