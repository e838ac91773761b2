"""A checkout anywhere brings the cluster up: a copy of this working tree under /tmp starts its
own control plane and add-ons (``python -m localkube up``), the Trainer controller's mount
namespace included, whose /tmp and /run are binds of that checkout's own state under /tmp.

The copy runs without its real node (``DDPJOB_NODE=off``: there is one node per machine, and
this checkout's cluster may hold it), with this interpreter and the Go tools already built (the
copy's sources hash to the same tools folder). ``test_private_mounts.py`` holds the bind order
itself without a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from localkube.addons import trainer_v2
from localkube.builds import gotools

REPO = Path(__file__).resolve().parents[2]

# `cluster`: it runs one, of its own, so make test keeps it out of the phase beside `disruptive`.
pytestmark = [pytest.mark.built, pytest.mark.cluster, pytest.mark.slow]


def _copy_working_tree(dest: Path) -> None:
    """The files git tracks or would (committed, changed or new), as they are now."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    for rel in filter(None, listed.decode().split("\0")):
        source = REPO / rel
        if source.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)


@pytest.fixture
def checkout_under_tmp():
    if not gotools.is_built():
        gotools.build(sys.stderr)
    root = Path(tempfile.mkdtemp(prefix="ddpjob-anywhere-", dir="/tmp"))
    try:
        _copy_working_tree(root)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _localkube(checkout: Path, command: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
    env["DDPJOB_NODE"] = "off"
    return subprocess.run(
        [sys.executable, "-m", "localkube", command],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_checkout_under_tmp_brings_its_cluster_up(checkout_under_tmp):
    checkout = checkout_under_tmp
    state_dir = checkout / ".cluster"
    try:
        up = _localkube(checkout, "up")
        assert up.returncode == 0, up.stderr[-4000:]
        assert up.stdout.strip() == f"export KUBECONFIG={state_dir / 'kubeconfig'}"
        state = json.loads((state_dir / "state.json").read_text())
        # `up` waited for the Trainer controller's status server, which answers only once it
        # has read its certificate from its /tmp and its token from its /run: seen from inside.
        pid = state["processes"]["trainer-controller-manager"]["pid"]
        inside = Path(f"/proc/{pid}/root")
        own_tmp = state_dir / "trainer" / "tmp"
        cert = "k8s-webhook-server/serving-certs/tls.crt"
        assert (inside / "tmp" / cert).read_bytes() == (own_tmp / cert).read_bytes()
        token = f"{trainer_v2.SERVICE_ACCOUNT_DIR}/token"
        assert (inside / "run" / token).read_bytes() == (
            state_dir / "trainer/run" / token
        ).read_bytes()
        # The checkout is still where it was, inside as outside.
        config = state_dir / "trainer" / "config.yaml"
        assert (inside / str(config).lstrip("/")).read_bytes() == config.read_bytes()
        # The host's /tmp does not show it: the binds are the controller's own.
        host_cert = Path("/tmp", cert)
        assert not host_cert.exists() or host_cert.read_bytes() != (own_tmp / cert).read_bytes()
    finally:
        down = _localkube(checkout, "down")
        assert down.returncode == 0, down.stderr[-2000:]
    assert not state_dir.exists()
