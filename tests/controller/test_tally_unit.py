"""The request tally `--debug` prints: requests by kind, re-lists, RBAC refusals."""

from __future__ import annotations

import pytest

from controller.kube import tally

JOBS = "https://h/apis/kubeflow.org/v1/namespaces/n/pytorchjobs"


@pytest.fixture(autouse=True)
def fresh_tally(monkeypatch):
    monkeypatch.setattr(tally, "_counts", type(tally._counts)())


@pytest.mark.parametrize(
    ("method", "url", "query", "kind"),
    [
        (
            "GET",
            JOBS,
            [("watch", True)],
            "watch",
        ),
        ("GET", JOBS, [], "get"),
        ("GET", "https://h/api/v1/namespaces/n/pods/p/log", [("follow", "true")], "log"),
        ("POST", JOBS, None, "post"),
        ("DELETE", "https://h/apis/kubeflow.org/v1/namespaces/n/pytorchjobs/j", None, "delete"),
    ],
)
def test_request_kinds(method, url, query, kind):
    assert tally.request_kind(method, url, query) == kind


def test_counting_counts_each_request_and_each_refusal():
    class Refused(Exception):
        status = 403

        def __init__(self, body: bytes):
            self.body = body

    def request(method, url, query_params=None, **kwargs):
        if url.endswith("/secrets"):
            raise Refused(b'{"message": "secrets is forbidden: User \\"u\\" cannot list"}')
        if method == "POST":
            raise Refused(b'{"message": "admission webhook \\"v\\" denied the request"}')
        return "ok"

    counted = tally.counting(request)
    assert counted("GET", "https://h/api/v1/namespaces/n/pods", query_params=[]) == "ok"
    counted("GET", "https://h/api/v1/namespaces/n/pods", [("watch", "true")])
    with pytest.raises(Refused):
        counted("GET", "https://h/api/v1/namespaces/n/secrets")
    with pytest.raises(Refused):  # a webhook's denial is a 403 too, but not RBAC's
        counted("POST", JOBS)
    tally.count(tally.RELIST)
    assert tally.summary() == (
        "4 API requests (get 2, post 1, watch 1); 1 re-list after 410 Gone; 1 refused by RBAC"
    )


def test_an_empty_tally():
    assert tally.summary() == "0 API requests; 0 re-lists after 410 Gone; 0 refused by RBAC"
