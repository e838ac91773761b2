"""What this process asked of the API server: requests by kind and by what they read (the
path, without its query), and watches re-listed after 410 Gone. ``python -m controller
--debug`` prints it at exit, so "``wait`` watches, it does not poll" and "``status`` reads each
object once" are things a test (tests/e2e/test_wait.py, test_status_reads.py) and a user can
count.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

_lock = threading.Lock()
_counts: Counter[str] = Counter()
_paths: Counter[tuple[str, str]] = Counter()  # (kind, path): what each request read
RELIST = "relist"  # a watch listed again because its resourceVersion had expired
FORBIDDEN = "forbidden"  # a request RBAC refused (403), whether or not the command went on


def count(kind: str, path: str | None = None) -> None:
    """One more ``kind`` (a request's, or :data:`RELIST`/:data:`FORBIDDEN`); ``path``: what
    the request read."""
    with _lock:
        _counts[kind] += 1
        if path is not None:
            _paths[(kind, path.split("?", 1)[0])] += 1


def request_kind(method: str, url: str, query: Any) -> str:
    """``watch``, ``log`` (a container's log, followed or not), or the HTTP verb, lower case."""
    params = dict(query or [])
    if str(params.get("watch", "")).lower() == "true":
        return "watch"
    if url.split("?", 1)[0].endswith("/log"):
        return "log"
    return method.lower()


def refused(body: Any) -> None:
    """A 403: counted as refused by RBAC unless an admission webhook denied it."""
    if _by_rbac(body):
        count(FORBIDDEN)


def _by_rbac(body: Any) -> bool:
    """A 403 from the authorizer ("User ... cannot list resource ..."), not an admission
    webhook's denial, which is a 403 too."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    return "admission webhook" not in text


def requests() -> list[str]:
    """Each path asked, with how often and how: ``get /api/v1/namespaces/ml/pods (1)``."""
    with _lock:
        paths = dict(_paths)
    return [f"{kind} {path} ({n})" for (kind, path), n in sorted(paths.items(), key=_by_path)]


def _by_path(item: tuple[tuple[str, str], int]) -> tuple[str, str]:
    (kind, path), _ = item
    return path, kind


def summary() -> str:
    """``7 API requests (get 3, log 1, watch 3); 1 re-list after 410 Gone; 0 refused by RBAC``."""
    with _lock:
        counts = dict(_counts)
    relists = counts.pop(RELIST, 0)
    forbidden = counts.pop(FORBIDDEN, 0)
    total = sum(counts.values())
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
    text = f"{total} API request{'s' if total != 1 else ''}" + (f" ({kinds})" if kinds else "")
    text += f"; {relists} re-list{'s' if relists != 1 else ''} after 410 Gone"
    return text + f"; {forbidden} refused by RBAC"
