"""One container log read as a stream (``kubectl logs [-f] --timestamps``), in batches of lines.

Following a rank across restarts (re-attaching, dropping lines already printed) is
``controller.jobs.follow``'s job; this is only the stream. It reads what the network has
(``read1``: at most one chunk, never waiting for a full buffer, so a live log is not delayed)
and hands over the complete lines of each read at once: one decode and one split per read, and
memory bounded by one read plus one unfinished line, whatever the log's length. A log that is
not followed (a finished run's) ends by itself, so nothing waits on it: it is read in blocks of
``BLOCK_BYTES`` instead: about 80 reads for a 21 MB log rather than one per HTTP chunk (the
kubelet sends a chunk per line), which cuts the client's CPU time by a third.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from controller.kube.errors import short_reason

# Bytes asked of the socket per read; a read returns what has arrived, up to this.
READ_BYTES = 256 * 1024
# A log that is not followed is read in blocks of this many bytes (a read waits to fill one).
BLOCK_BYTES = 256 * 1024


class LogStreamBroken(Exception):
    """A followed log stream could not be opened or broke off; the follower re-attaches."""


class LogStream:
    """One open log stream; iterate ``batches()`` for lines, ``close()`` (from any thread) to
    stop. ``ended`` says whether the server ended it (EOF) rather than a break or a close.
    ``followed``: the server keeps it open for new lines (read what has arrived, at once)."""

    def __init__(self, resp: Any, *, followed: bool = True):
        self._resp = resp
        self.ended = False
        self._read = (
            functools.partial(resp.read1, READ_BYTES)
            if followed
            else functools.partial(resp.read, BLOCK_BYTES)
        )

    def batches(self) -> Iterator[list[str]]:
        """Lists of complete lines (without their newline), one list per network read."""
        import urllib3

        pending = b""
        try:
            while True:
                chunk = self._read()
                if not chunk:
                    break
                cut = chunk.rfind(b"\n")
                if cut < 0:
                    pending += chunk
                    continue
                data = pending + chunk[:cut] if pending else chunk[:cut]
                pending = chunk[cut + 1 :]
                yield data.decode("utf-8", errors="replace").split("\n")
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as e:
            raise LogStreamBroken(short_reason(e)) from None
        self.ended = True
        if pending:  # the log ended without a newline
            yield [pending.decode("utf-8", errors="replace")]

    def __iter__(self) -> Iterator[str]:
        for batch in self.batches():
            yield from batch

    def close(self) -> None:
        """Stop the stream from another thread: shut the socket so a blocked read returns."""
        import socket

        with contextlib.suppress(Exception):
            sock = self._resp._fp.fp.raw._sock  # http.client -> socket (best effort)
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._resp.close()
