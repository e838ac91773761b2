"""End-to-end tests of the cluster commands on the local cluster (localkube)."""

import json

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


@pytest.fixture
def real_node(cluster):
    """Fails in one line (never skips) on a cluster without a node that runs containers."""
    nodes = cluster.kubectl("get", "nodes", "-o", "json").stdout
    if not any(
        n["metadata"].get("labels", {}).get("type") != "kwok" for n in json.loads(nodes)["items"]
    ):
        pytest.fail(
            "needs pods that run: this cluster has no real node (started with DDPJOB_NODE=off?); "
            "run `make cluster-down cluster-up` without it",
            pytrace=False,
        )
