"""The request tally `--debug` prints: requests by kind, re-lists, RBAC refusals."""

from __future__ import annotations

import pytest

from controller.kube import tally

JOBS = "https://h/apis/kubeflow.org/v1/namespaces/n/pytorchjobs"


@pytest.fixture(autouse=True)
def fresh_tally(monkeypatch):
    monkeypatch.setattr(tally, "_counts", type(tally._counts)())
    monkeypatch.setattr(tally, "_paths", type(tally._paths)())


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


def test_an_empty_tally():
    assert tally.summary() == "0 API requests; 0 re-lists after 410 Gone; 0 refused by RBAC"
    assert tally.requests() == []
