"""Kueue in localkube without a cluster: its configuration, how its CRDs' conversion webhooks
are pointed at 127.0.0.1, the quick start's queues and how the release is split at build time."""

from __future__ import annotations

import json

import yaml

from localkube.addons import kueue
from localkube.builds import operators
from localkube.controlplane import bootstrap


def test_configuration_is_upstreams_with_local_addresses_and_our_integrations(tmp_path):
    class Ctx:
        ports = {"kueue-webhook": 1, "kueue-probe": 2, "kueue-metrics": 3}
        state_dir = tmp_path

    cfg = kueue.config(Ctx())
    assert cfg["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert cfg["integrations"]["frameworks"] == [
        "batch/job",
        "kubeflow.org/pytorchjob",
        "trainer.kubeflow.org/trainjob",
    ]
    assert cfg["manageJobsWithoutQueueName"] is False
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert "waitForPodsReady" not in cfg  # upstream's default: off
    assert cfg["webhook"] == {
        "port": 1,
        "host": "127.0.0.1",
        "certDir": str(tmp_path / "kueue" / "webhook-certs"),
    }
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:2"
    assert cfg["metrics"]["bindAddress"] == "127.0.0.1:3"


def test_the_process_runs_in_its_own_mount_namespace_with_its_metrics_certificate(tmp_path):
    class Ctx:
        state_dir = tmp_path
        bindir = tmp_path / "bin"

        @staticmethod
        def kubeconfig(user):
            return f"/kc/{user}"

    argv = kueue.argv(Ctx())
    assert argv[:2] == ["unshare", "--mount"]
    binary = argv.index(str(tmp_path / "bin" / "kueue"))
    plan = json.loads(argv[binary - 1])
    assert plan["binds"] == [
        [str(tmp_path / "kueue" / "metrics-certs"), str(kueue.METRICS_CERT_PATH)]
    ]
    assert plan["keep"] == [str(tmp_path), str(tmp_path / "bin")]
    assert argv[argv.index("--kubeconfig") + 1] == "/kc/kueue"


def test_crds_conversion_webhooks_are_served_at_127_0_0_1(tmp_path):
    crd = {
        "metadata": {"name": "localqueues.kueue.x-k8s.io"},
        "spec": {
            "conversion": {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {
                        "service": {
                            "name": "kueue-webhook-service",
                            "namespace": "kueue-system",
                            "path": "/convert",
                        }
                    },
                    "conversionReviewVersions": ["v1"],
                },
            }
        },
    }
    plain = {"metadata": {"name": "topologies.kueue.x-k8s.io"}, "spec": {}}
    (tmp_path / "kueue-crds.json").write_text(json.dumps([crd, plain]))
    got = kueue.crds(tmp_path, 4443, "Q0E=")
    assert got[0]["spec"]["conversion"]["webhook"]["clientConfig"] == {
        "url": "https://127.0.0.1:4443/convert",
        "caBundle": "Q0E=",
    }
    assert got[0]["spec"]["conversion"]["webhook"]["conversionReviewVersions"] == ["v1"]
    assert got[1] == plain
    assert kueue.crd_names(tmp_path) == [
        "localqueues.kueue.x-k8s.io",
        "topologies.kueue.x-k8s.io",
    ]


def test_split_release_keeps_crds_roles_webhooks_and_the_secrets_role_only():
    docs = [
        {"kind": "CustomResourceDefinition", "metadata": {"name": "a.kueue.x-k8s.io"}},
        {"kind": "Namespace", "metadata": {"name": "kueue-system"}},
        {"kind": "ClusterRole", "metadata": {"name": "kueue-manager-role"}},
        {"kind": "Role", "metadata": {"name": "kueue-leader-election-role"}},
        {"kind": "Role", "metadata": {"name": kueue.SECRETS_ROLE}},
        {"kind": "Deployment", "metadata": {"name": "kueue-controller-manager"}},
        {"kind": "APIService", "metadata": {"name": "v1beta2.visibility.kueue.x-k8s.io"}},
        {"kind": "MutatingWebhookConfiguration", "metadata": {"name": "m"}},
        {"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "v"}},
    ]
    crds = json.loads(operators.split_kueue_release(docs, "kueue-crds.json"))
    assert [c["metadata"]["name"] for c in crds] == ["a.kueue.x-k8s.io"]
    kept = list(yaml.safe_load_all(operators.split_kueue_release(docs, "kueue-install.yaml")))
    assert [(d["kind"], d["metadata"]["name"]) for d in kept] == [
        ("Namespace", "kueue-system"),
        ("ClusterRole", "kueue-manager-role"),
        ("Role", kueue.SECRETS_ROLE),
        ("MutatingWebhookConfiguration", "m"),
        ("ValidatingWebhookConfiguration", "v"),
    ]


def test_the_quick_starts_queues_hold_the_nodes_cpu_and_memory_and_the_kwok_gpus():
    node = {"status": {"allocatable": {"cpu": "2", "memory": "24584100Ki", "pods": "110"}}}
    quota = kueue.node_quota(node)
    assert quota == {"cpu": "2", "memory": "24584100Ki"}
    gpus = kueue.kwok_gpus()
    assert gpus == 8 * len(bootstrap.KWOK_NODES)
    flavor, cq, lq = kueue.queues(quota, gpus)
    assert flavor == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "default-flavor"},
    }
    (group,) = cq["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
    assert group["flavors"] == [
        {
            "name": "default-flavor",
            "resources": [
                {"name": "cpu", "nominalQuota": "2"},
                {"name": "memory", "nominalQuota": "24584100Ki"},
                {"name": "nvidia.com/gpu", "nominalQuota": gpus},
            ],
        }
    ]
    assert cq["spec"]["preemption"] == {"withinClusterQueue": "LowerPriority"}
    assert lq["metadata"] == {"name": "user-queue", "namespace": "default"}
    assert lq["spec"] == {"clusterQueue": "cluster-queue"}
    # Without a node: this machine's CPUs and memory.
    machine = kueue.node_quota(None)
    assert int(machine["cpu"]) >= 1 and machine["memory"].endswith("Ki")
