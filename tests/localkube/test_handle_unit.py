"""``Cluster.get_json``'s reading of ``kubectl get`` arguments and of the API's answers, with no
cluster (tests/localkube/test_cluster.py compares its answers with kubectl's on a real one)."""

from __future__ import annotations

import pytest

from localkube.handle import _as_kubectl_prints, _read_request


@pytest.mark.parametrize(
    ("args", "path", "query"),
    [
        (("pods", "-n", "x", "-l", "a=b"), "/api/v1/namespaces/x/pods", [("labelSelector", "a=b")]),
        (("pod", "p", "--namespace", "x"), "/api/v1/namespaces/x/pods/p", []),
        (("pvc", "ckpt", "-n", "x"), "/api/v1/namespaces/x/persistentvolumeclaims/ckpt", []),
        (("sa", "default"), "/api/v1/namespaces/default/serviceaccounts/default", []),
        (("node", "n1"), "/api/v1/nodes/n1", []),
        (("pytorchjob", "j", "-n", "x"), "/apis/kubeflow.org/v1/namespaces/x/pytorchjobs/j", []),
        (
            ("trainjobs", "-n", "x", "--selector", "s"),
            "/apis/trainer.kubeflow.org/v1alpha1/namespaces/x/trainjobs",
            [("labelSelector", "s")],
        ),
        (
            ("jobs", "-n", "x", "--field-selector", "f=1", "-l", "s"),
            "/apis/batch/v1/namespaces/x/jobs",
            [("fieldSelector", "f=1"), ("labelSelector", "s")],
        ),
    ],
)
def test_the_forms_read_through_the_api(args, path, query):
    assert _read_request(args) == (path, query)


@pytest.mark.parametrize(
    "args",
    [
        ("events", "-n", "x"),  # two API groups serve events: kubectl picks
        ("localqueues.v1beta1.kueue.x-k8s.io", "-n", "x"),
        ("pods", "-A"),
        ("pods,configmaps", "-n", "x"),
        ("pod", "a", "b", "-n", "x"),
        ("pod", "a", "-n", "x", "-l", "s"),  # kubectl refuses a name with a selector
        ("nodes", "-n", "x"),  # kubectl ignores -n for a cluster-scoped kind
        (),
    ],
)
def test_any_other_form_is_left_to_kubectl(args):
    assert _read_request(args) == (None, [])


def test_a_list_reads_as_kubectl_prints_it():
    got = {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "42"},
        "items": [{"metadata": {"name": "a", "managedFields": [{}]}, "spec": {}}],
    }
    assert _as_kubectl_prints(got) == {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}, "spec": {}}],
    }
    one = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "a", "managedFields": []}}
    assert _as_kubectl_prints(one) == {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "a"}}
