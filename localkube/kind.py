"""``make kind-up``: a kind cluster with the Kubeflow training operator, for machines with Docker.

This is the Docker twin of the local control plane: two kind worker nodes that advertise
``nvidia.com/gpu: 8`` each (extended resources patched onto the node status, the documented way to
advertise them), and the training operator installed from its upstream release manifests at the
same version the local control plane builds from source. It cannot run on machines without a
Docker engine; there, use ``make cluster-up``.

Pods run the image's own entrypoint here (no pod agent): build and load the trainer image first,
``make image IMAGE=ddpjob TAG=dev && kind load docker-image ddpjob:dev --name ddpjob``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from . import versions

CLUSTER_NAME = os.environ.get("KIND_CLUSTER_NAME", "ddpjob")
#: kind's default node image unless KIND_NODE_IMAGE says otherwise (e.g. kindest/node:v1.33.1).
KIND_NODE_IMAGE = os.environ.get("KIND_NODE_IMAGE", "")
OPERATOR_MANIFESTS = (
    "github.com/kubeflow/training-operator.git/manifests/overlays/standalone"
    f"?ref={versions.TRAINING_OPERATOR}"
)
KIND_CONFIG = """\
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
  - role: worker
"""


def _need(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise SystemExit(f"localkube kind-up: {tool} is missing (got no `{tool}` on PATH). {hint}")
    return path


def _run(*argv: str) -> str:
    print("[kind] " + " ".join(argv), file=sys.stderr, flush=True)
    return subprocess.run(
        argv, check=True, capture_output=False, text=True, stdout=subprocess.PIPE
    ).stdout


def up() -> int:
    """Create the kind cluster (if missing), install the operator, advertise fake GPUs."""
    kind = _need("kind", "Install it: go install sigs.k8s.io/kind@v0.29.0")
    _need("docker", "kind needs a Docker (or podman) engine; without one use `make cluster-up`.")
    kubectl = _need("kubectl", "Install kubectl, or use the one `make tools` builds.")
    context = f"kind-{CLUSTER_NAME}"
    clusters = _run(kind, "get", "clusters").split()
    if CLUSTER_NAME not in clusters:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as cfg:
            cfg.write(KIND_CONFIG)
        image = ["--image", KIND_NODE_IMAGE] if KIND_NODE_IMAGE else []
        _run(
            kind,
            "create",
            "cluster",
            "--name",
            CLUSTER_NAME,
            *image,
            "--config",
            cfg.name,
            "--wait",
            "120s",
        )
    _run(kubectl, "--context", context, "apply", "--server-side", "-k", OPERATOR_MANIFESTS)
    _run(
        kubectl,
        "--context",
        context,
        "-n",
        "kubeflow",
        "rollout",
        "status",
        "deployment/training-operator",
        "--timeout=300s",
    )
    nodes = json.loads(_run(kubectl, "--context", context, "get", "nodes", "-o", "json"))
    patch = json.dumps([{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"}])
    for node in nodes["items"]:
        if "node-role.kubernetes.io/control-plane" in node["metadata"].get("labels", {}):
            continue
        _run(
            kubectl,
            "--context",
            context,
            "patch",
            "node",
            node["metadata"]["name"],
            "--subresource=status",
            "--type=json",
            "-p",
            patch,
        )
    print(f"kubectl config use-context {context}")
    return 0


def down() -> int:
    """Delete the kind cluster."""
    kind = _need("kind", "Install it: go install sigs.k8s.io/kind@v0.29.0")
    _run(kind, "delete", "cluster", "--name", CLUSTER_NAME)
    return 0
