"""A watch that survives: list, then watch from the list's resourceVersion, resume after a
dropped connection, re-list after 410 Gone, ride out an API server restart.

Nothing here polls on a timer: between events the connection is held open (the server ends it
after ``WATCH_SERVER_TIMEOUT_S`` and it is resumed from the last resourceVersion; bookmarks keep
that fresh in between).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from typing import Any

from controller.errors import ClusterError, Unreachable
from controller.kube import tally
from controller.kube.errors import api_message, short_reason, translate
from controller.kube.logstream import READ_BYTES, line_blocks

# Seconds to wait for the connection to open.
CONNECT_TIMEOUT_S = 5
# A watch asks the server to end it after this long (it is then resumed from the last
# resourceVersion); the client read timeout sits a little above it.
WATCH_SERVER_TIMEOUT_S = 240
# Backoff between reconnect attempts while the API server is away.
RECONNECT_BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)
# A watch gives up when the API server has been away this long.
RECONNECT_GIVE_UP_S = 300

# What a watch reports besides ADDED / MODIFIED / DELETED.
RESYNC = "RESYNC"  # a fresh list replaced the watch (after 410 Gone or a long outage)


def watch(
    cluster: Any,
    path: str,
    where: str,
    kind: str,
    *,
    selector: str | None = None,
    field_selector: str | None = None,
    deadline: float | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(event_type, object)`` for the collection at ``path``, until ``deadline``.

    ``cluster`` is the ``kube.client.Cluster`` (its ``list_at``, ``transport``, ``server`` and
    ``notice``).

    Starts with a list (each item reported as ADDED, then ``(RESYNC, {"count": n})``), then
    watches from its resourceVersion. A dropped connection resumes from the last resourceVersion
    seen; 410 Gone re-lists, reporting objects that vanished meanwhile as DELETED; while the API
    server is away it retries with a short backoff. Ends (returns) at ``deadline``
    (time.monotonic()).
    """
    import urllib3

    from controller.kube.transport import ApiError

    query: list[tuple[str, str]] = []
    if selector:
        query.append(("labelSelector", selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    known: dict[str, dict[str, Any]] = {}  # uid -> latest object
    rv: str | None = None
    outage = _Outage(cluster, where)
    while deadline is None or time.monotonic() < deadline:
        try:
            if rv is None:
                body = cluster.list_at(path, where, kind, query=query or None)
                outage.over()
                rv = body.get("metadata", {}).get("resourceVersion")
                items = body.get("items", [])
                yield from resync(known, items)
                yield RESYNC, {"count": len(items)}
            server_timeout = WATCH_SERVER_TIMEOUT_S
            if deadline is not None:
                server_timeout = max(1, min(server_timeout, int(deadline - time.monotonic()) + 1))
            resp = cluster.transport.request(
                "GET",
                path,
                query=[
                    *query,
                    ("watch", "true"),
                    ("resourceVersion", rv or ""),
                    ("allowWatchBookmarks", "true"),
                    ("timeoutSeconds", str(server_timeout)),
                ],
                timeout=(CONNECT_TIMEOUT_S, server_timeout + 30),
                stream=True,
            )
            try:
                for line in _lines(resp):
                    event = json.loads(line)
                    etype, obj = event.get("type"), event.get("object", {})
                    if etype == "ERROR":
                        if obj.get("code") == 410:
                            rv = None  # expired: list again
                            tally.count(tally.RELIST)
                            break
                        raise ClusterError(
                            f"{where}: the API server ended the watch "
                            f"(got {obj.get('code')} {obj.get('message')})",
                            status=obj.get("code"),
                            reason="WatchEnded",
                        )
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    outage.over()
                    if etype == "BOOKMARK":
                        continue
                    uid = obj.get("metadata", {}).get("uid", "")
                    if etype == "DELETED":
                        known.pop(uid, None)
                    else:
                        known[uid] = obj
                    yield etype, obj
                    if deadline is not None and time.monotonic() >= deadline:
                        return
            finally:
                resp.close()  # not back to the pool: the stream may be mid-chunk
                resp.release_conn()
        except ApiError as e:
            if e.status == 410:
                rv = None
                tally.count(tally.RELIST)
                continue
            if e.status and e.status < 500 and e.status != 429:
                raise translate(e, where, kind, cluster.server) from None
            outage.wait(e, f"{e.status} {api_message(e)}")
        except Unreachable as e:  # from the list call
            outage.wait(e, "no answer")
        except (urllib3.exceptions.HTTPError, OSError) as e:
            outage.wait(e, short_reason(e))


def _lines(resp: Any) -> Iterator[bytes]:
    """The non-empty lines of a watch response (one JSON event each), as they arrive."""
    for block in line_blocks(functools.partial(resp.read1, READ_BYTES)):
        yield from (line for line in block.split(b"\n") if line.strip())


class _Outage:
    """Reconnect bookkeeping of one watch: back off while the API server is away, say so once,
    give up after RECONNECT_GIVE_UP_S (or at once if it never answered)."""

    def __init__(self, cluster: Any, where: str):
        self.cluster, self.where = cluster, where
        self.connected = False
        self.since: float | None = None
        self.tries = 0

    def over(self) -> None:
        self.connected = True
        if self.since is not None:
            took = time.monotonic() - self.since
            self.cluster.notice(f"{self.where}: reconnected after {took:.1f} s")
        self.since, self.tries = None, 0

    def wait(self, err: BaseException, reason: str) -> None:
        if not self.connected:
            if isinstance(err, ClusterError):
                raise err
            raise translate(err, self.where, "", self.cluster.server) from None
        now = time.monotonic()
        if self.since is None:
            self.since = now
            self.cluster.notice(f"{self.where}: lost the API server ({reason}); reconnecting...")
        elif now - self.since > RECONNECT_GIVE_UP_S:
            raise Unreachable(
                f"{self.where}: the API server at {self.cluster.server} has not answered for "
                f"{now - self.since:.0f} s (got {reason})",
                reason="GaveUp",
            )
        time.sleep(RECONNECT_BACKOFF_S[min(self.tries, len(RECONNECT_BACKOFF_S) - 1)])
        self.tries += 1


def resync(
    known: dict[str, dict[str, Any]], items: list[dict[str, Any]]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """After a (re-)list: report what vanished as DELETED, then every current item."""
    current = {o.get("metadata", {}).get("uid", ""): o for o in items}
    for uid in [u for u in known if u not in current]:
        yield "DELETED", known.pop(uid)
    for uid, obj in current.items():
        etype = "MODIFIED" if uid in known else "ADDED"
        known[uid] = obj
        yield etype, obj
