"""Shared by the cluster benchmarks (cluster_bench.py, trainjob_bench.py): API requests counted
per client, and a followed log's lines lost and doubled against the pod's output."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any


class RequestCounter:
    """Count API requests per REST client instance (every client shares one hook)."""

    def __init__(self) -> None:
        from kubernetes.client import rest

        self.counts: Counter[int] = Counter()
        self.lock = threading.Lock()
        original = rest.RESTClientObject.request
        counter = self

        def request(self_rest: Any, *args: Any, **kwargs: Any) -> Any:
            with counter.lock:
                counter.counts[id(self_rest)] += 1
            return original(self_rest, *args, **kwargs)

        rest.RESTClientObject.request = request

    def of(self, rest_client: Any) -> int:
        with self.lock:
            return self.counts[id(rest_client)]


def lost_and_doubled(got: list[str], truth: list[str]) -> tuple[int, int]:
    """Lines of ``truth`` missing from ``got``, and lines ``got`` has more often than ``truth``."""
    g, t = Counter(got), Counter(truth)
    return sum((t - g).values()), sum((g - t).values())
