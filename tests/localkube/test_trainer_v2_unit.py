"""Trainer v2 in localkube without a cluster: pins, and how webhooks are pointed at 127.0.0.1."""

from __future__ import annotations

from controller import kubeflow
from localkube import trainer_v2


def test_go_mod_pins_the_contract_versions():
    """go-trainer/go.mod requires exactly the Trainer and JobSet versions of the contract."""
    got = trainer_v2.required_versions((trainer_v2.GO_DIR / "go.mod").read_text())
    assert got == {
        trainer_v2.TRAINER_MODULE: kubeflow.TRAINER_VERSION,
        trainer_v2.JOBSET_MODULE: kubeflow.JOBSET_VERSION,
    }


def test_required_versions_reads_require_lines_only():
    go_mod = (
        "module x\n\nrequire (\n\tgithub.com/kubeflow/trainer/v2 v2.3.0\n"
        "\tsigs.k8s.io/jobset v0.12.0 // indirect\n\tk8s.io/api v0.36.2\n)\n"
        "replace sigs.k8s.io/jobset => ../jobset\n"
    )
    assert trainer_v2.required_versions(go_mod) == {
        "github.com/kubeflow/trainer/v2": "v2.3.0",
        "sigs.k8s.io/jobset": "v0.12.0",
    }


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
    out = trainer_v2.serve_locally(hooks, 4443, "Q0E=")
    assert out["webhooks"][0]["clientConfig"] == {
        "url": "https://127.0.0.1:4443/a",
        "caBundle": "Q0E=",
    }
    assert out["webhooks"][0]["objectSelector"] == {"matchLabels": {"x": "y"}}
    assert "service" in hooks["webhooks"][0]["clientConfig"]  # the input is left alone
