"""End-to-end tests of the cluster commands on the local control plane (tests/cluster)."""

import sys
import uuid
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.cluster.fixture import cluster  # noqa: E402,F401 - the session fixture


@pytest.fixture
def namespace(cluster):  # noqa: F811 - the fixture above
    """A fresh namespace enforcing the `baseline` Pod Security profile, removed afterwards.

    Not `restricted`: our pods pass it, but the upstream operator adds an `init-pytorch`
    container without a securityContext to every Worker pod, which `restricted` refuses
    (`status` then says: FailedCreatePod ... violates PodSecurity "restricted:latest").
    """
    from tests.e2e.helpers import wait_until

    name = f"e2e-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=baseline")
    wait_until(
        "default service account",
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        30,
    )
    yield name
    cluster.kubectl("delete", "pytorchjobs", "--all", "-n", name, "--wait=false", check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
