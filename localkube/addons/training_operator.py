"""The Kubeflow training operator v1 (PyTorchJob) in the local cluster: its objects and its
process.

Our reduced main of v1.9.4 (``builds/go-operators/cmd/training-operator``: the PyTorchJob
reconciler and its validating webhook, without upstream's certificate rotation) runs as a host
process. Its CRD, ClusterRole and webhook configuration are upstream's, copied from the module
at build time; the webhook is served at ``https://127.0.0.1:<port>`` behind the cluster CA.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from controller import kubeflow

from ..controlplane import bootstrap
from ..controlplane.context import Component
from ..node import host
from ..node.images import images
from . import manager

if TYPE_CHECKING:
    from ..controlplane.context import Context

USER = "training-operator"  # its client identity (bootstrap.USERS)


def webhooks(manifests: Path, ca_crt: Path, port: int) -> dict:
    """Upstream's webhook configuration, PyTorchJob hooks only, pointed at the operator's
    webhook server on 127.0.0.1 (it runs outside the cluster: a URL, not a Service)."""
    hook_docs = (manifests / "training-operator-webhooks.yaml").read_text()
    config = next(w for w in yaml.safe_load_all(hook_docs) if w)
    pytorch_hooks = [w for w in config["webhooks"] if "pytorchjob" in w["name"]]
    ca_bundle = base64.b64encode(ca_crt.read_bytes()).decode()
    for hook in pytorch_hooks:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
    config["metadata"] = {"name": "validator.training-operator.kubeflow.org"}
    config["webhooks"] = pytorch_hooks
    return config


def apply_objects(ctx: Context) -> None:
    """The PyTorchJob CRD, the operator's ClusterRole and its binding to our identity, and the
    webhook configuration; wait until the CRD is established."""
    role = yaml.safe_load((ctx.manifests / "training-operator-role.yaml").read_text())
    role["metadata"] = {"name": "training-operator"}
    objects = [
        role,
        bootstrap.cluster_role_binding(USER, "training-operator", bootstrap.USERS[USER][0]),
        webhooks(ctx.manifests, ctx.pki.path("ca.crt"), ctx.ports["operator-webhook"]),
    ]
    docs = (ctx.manifests / "pytorchjobs-crd.yaml").read_text()
    docs += "\n---\n" + "\n---\n".join(yaml.safe_dump(o) for o in objects)
    ctx.apply(docs, timeout=120)
    bootstrap.wait_established(ctx, [kubeflow.PYTORCHJOB_CRD])


def _cert_dir(ctx: Context) -> Path:
    return ctx.state_dir / "webhook-certs"


def prepare(ctx: Context) -> None:
    """The webhook server's certificate for 127.0.0.1, from the cluster CA."""
    manager.serving_cert(ctx, "training-operator-webhook", _cert_dir(ctx))


def argv(ctx: Context) -> list[str]:
    return [
        str(ctx.bindir / "training-operator"),
        "--kubeconfig",
        ctx.kubeconfig(USER),
        "--health-probe-bind-address",
        f"127.0.0.1:{ctx.ports['operator-probe']}",
        "--metrics-bind-address",
        f"127.0.0.1:{ctx.ports['operator-metrics']}",
        "--webhook-server-port",
        str(ctx.ports["operator-webhook"]),
        "--webhook-cert-dir",
        str(_cert_dir(ctx)),
        # The init container template we ship for `restricted` namespaces: upstream's
        # built-in one sets no securityContext, so PodSecurity refuses Worker pods.
        "--pytorch-init-container-template-file",
        str(ctx.repo / "k8s" / "operator" / "init-container-restricted.yaml"),
        # The template's {{.InitContainerImage}}: the local init image (upstream: alpine:3.10,
        # which no registry serves here).
        *(["--pytorch-init-container-image", images()["init"]] if host.ENABLED else []),
        "--zap-log-level",
        "info",
    ]


TRAINING_OPERATOR = Component(
    "training-operator",
    argv,
    manager.probe_ready("operator-probe"),
    env=lambda ctx: {"KUBECONFIG": ctx.kubeconfig(USER)},
    prepare=prepare,
    ports=("operator-probe", "operator-webhook", "operator-metrics"),
)
