"""One followed container log (``kubectl logs -f --timestamps``), as lines.

Following a rank across restarts (re-attaching, dropping lines already printed) is
``controller.jobs.follow``'s job; this is only the stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from controller.kube.errors import short_reason


class LogStreamBroken(Exception):
    """A followed log stream could not be opened or broke off; the follower re-attaches."""


class LogStream:
    """One open log stream; iterate for lines, ``close()`` (from any thread) to stop."""

    def __init__(self, resp: Any):
        self._resp = resp

    def __iter__(self) -> Iterator[str]:
        import urllib3
        from kubernetes.watch.watch import iter_resp_lines

        try:
            yield from iter_resp_lines(self._resp)
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as e:
            raise LogStreamBroken(short_reason(e)) from None

    def close(self) -> None:
        """Stop the stream from another thread: shut the socket so a blocked read returns."""
        import socket

        with contextlib.suppress(Exception):
            sock = self._resp._fp.fp.raw._sock  # http.client -> socket (best effort)
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._resp.close()
