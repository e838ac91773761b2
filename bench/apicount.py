"""Shared by the cluster benchmarks (cluster_bench.py, trainjob_bench.py): API requests counted
per client, and a followed log's lines lost and doubled against the pod's output."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any


class RequestCounter:
    """Count API requests per client instance: the kubernetes client's REST clients (the
    Kubeflow SDKs') and ddpjob's transports (``Cluster.transport``), each class hooked once."""

    def __init__(self) -> None:
        from kubernetes.client import rest

        from controller.kube.transport import Transport

        self.counts: Counter[int] = Counter()
        self.lock = threading.Lock()
        for cls in (rest.RESTClientObject, Transport):
            self._hook(cls)

    def _hook(self, cls: type) -> None:
        original = cls.request
        counter = self

        def request(client: Any, *args: Any, **kwargs: Any) -> Any:
            with counter.lock:
                counter.counts[id(client)] += 1
            return original(client, *args, **kwargs)

        cls.request = request

    def of(self, client: Any) -> int:
        with self.lock:
            return self.counts[id(client)]


def lost_and_doubled(got: list[str], truth: list[str]) -> tuple[int, int]:
    """Lines of ``truth`` missing from ``got``, and lines ``got`` has more often than ``truth``."""
    g, t = Counter(got), Counter(truth)
    return sum((t - g).values()), sum((g - t).values())
