"""Trainer v2 in localkube without a cluster: how webhooks are pointed at 127.0.0.1, the SDK's
public objects, and the progress API's arrangements."""

from __future__ import annotations

from localkube.addons import trainer_v2
from localkube.controlplane import bootstrap


def test_serve_locally_replaces_the_service_with_a_url_and_ca():
    hooks = {
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "v"},
        "webhooks": [
            {
                "name": "a",
                "clientConfig": {"service": {"name": "svc", "namespace": "ns", "path": "/a"}},
                "objectSelector": {"matchLabels": {"x": "y"}},
            }
        ],
    }
    out = bootstrap.serve_locally(hooks, 4443, "Q0E=")
    assert out["webhooks"][0]["clientConfig"] == {
        "url": "https://127.0.0.1:4443/a",
        "caBundle": "Q0E=",
    }
    assert out["webhooks"][0]["objectSelector"] == {"matchLabels": {"x": "y"}}
    assert "service" in hooks["webhooks"][0]["clientConfig"]  # the input is left alone


def test_public_objects_come_from_upstreams_overlay_and_rbac(tmp_path):
    """The SDK's ConfigMap is the overlay's configMapGenerator, in the overlay's namespace, with
    upstream's Role/RoleBinding for it; nothing else of the RBAC file comes along."""
    import yaml

    overlay = {
        "namespace": "kubeflow-system",
        "resources": ["namespace.yaml"],
        "configMapGenerator": [
            {"name": "other", "literals": ["a=b"]},
            {"name": trainer_v2.PUBLIC, "literals": ["kubeflow_trainer_version=v2.3.0"]},
        ],
    }
    role = {"kind": "Role", "metadata": {"name": trainer_v2.PUBLIC}, "rules": []}
    binding = {"kind": "RoleBinding", "metadata": {"name": trainer_v2.PUBLIC}, "subjects": []}
    sa = {"kind": "ServiceAccount", "metadata": {"name": "kubeflow-trainer-controller-manager"}}
    (tmp_path / "trainer-overlay-manager.yaml").write_text(yaml.safe_dump(overlay))
    (tmp_path / "trainer-rbac.yaml").write_text(yaml.safe_dump_all([sa, role, binding]))
    ns, cm, got_role, got_binding = trainer_v2.public_objects(tmp_path)
    assert ns == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kubeflow-system"}}
    assert cm["metadata"] == {"name": "kubeflow-trainer-public", "namespace": "kubeflow-system"}
    assert cm["data"] == {"kubeflow_trainer_version": "v2.3.0"}
    assert (got_role["kind"], got_binding["kind"]) == ("Role", "RoleBinding")
    assert got_role["metadata"]["namespace"] == got_binding["metadata"]["namespace"]
    assert "namespace" not in role["metadata"]  # the input is left alone


def test_the_progress_api_is_on_and_its_server_is_reachable_by_name_from_the_node(tmp_path):
    """The feature gate and the status server's port in Trainer's config; the controller in a
    mount namespace of its own (its /tmp and /run: the two in-pod paths the server reads); the
    objects around it: the CA the pods trust it by, and its name resolving to the gateway."""
    import base64
    import json

    from localkube.controlplane.context import Context
    from localkube.controlplane.pki import PKI
    from localkube.node.host import GATEWAY

    pki = PKI(tmp_path / "pki")
    ports = {n: 40000 + i for i, n in enumerate(trainer_v2.TRAINER_PORTS)}
    ctx = Context(tmp_path, tmp_path / "state", tmp_path / "bin", tmp_path, ports, pki, print)
    config = trainer_v2.trainer_config(ctx)
    assert config["featureGates"] == {"TrainJobStatus": True}
    assert config["statusServer"] == {"port": ports["trainer-status"]}
    argv = trainer_v2.trainer_argv(ctx)
    assert argv[:2] == ["unshare", "--mount"]
    binary = argv.index(str(ctx.bindir / "trainer-controller-manager"))
    plan = json.loads(argv[binary - 1])
    assert plan["binds"] == [
        [str(trainer_v2.trainer_tmpdir(ctx)), "/tmp"],
        [str(trainer_v2.trainer_rundir(ctx)), "/run"],
    ]
    assert plan["keep"] == [str(ctx.state_dir), str(ctx.bindir)]
    objects = {o["kind"]: o for o in trainer_v2.status_objects(ctx)}
    secret = objects["Secret"]
    assert secret["metadata"] == {
        "name": "kubeflow-trainer-webhook-cert",
        "namespace": "kubeflow-system",
    }
    assert base64.b64decode(secret["data"]["ca.crt"]) == pki.path("ca.crt").read_bytes()
    assert objects["Service"]["metadata"]["name"] == "kubeflow-trainer-controller-manager"
    assert objects["Service"]["spec"]["clusterIP"] == "None"
    (endpoint,) = objects["EndpointSlice"]["endpoints"]
    assert endpoint["addresses"] == [GATEWAY]
    assert objects["EndpointSlice"]["ports"][0]["port"] == ports["trainer-status"]
    assert objects["ClusterRoleBinding"]["roleRef"]["name"] == (
        "system:service-account-issuer-discovery"
    )
    assert trainer_v2.STATUS_DNS == "kubeflow-trainer-controller-manager.kubeflow-system.svc"
