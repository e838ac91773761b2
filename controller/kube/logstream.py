"""One container log read as a stream (``kubectl logs [-f] --timestamps``), in batches of lines.

Following a rank across restarts (re-attaching, dropping lines already printed) is
``controller.jobs.follow``'s job; this is only the stream. It reads what the network has
(``read1``: at most one chunk, never waiting for a full buffer, so a live log is not delayed)
and hands over the complete lines of each read at once: one decode and one split per read, and
memory bounded by one read plus one unfinished line, whatever the log's length. A log that is
not followed (a finished run's) ends by itself, so nothing waits on it: it is read in full
blocks of ``READ_BYTES`` instead: about 80 reads for a 21 MB log rather than one per HTTP chunk
(the kubelet sends a chunk per line), which cuts the client's CPU time by a third.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from controller.kube.errors import short_reason

# Bytes asked of the socket per read: a followed log's read returns what has arrived, up to
# this; a log that is not followed waits to fill it (or for the end).
READ_BYTES = 256 * 1024


def line_blocks(read: Callable[[], bytes]) -> Iterator[bytes]:
    """What ``read()`` returns until it returns nothing, cut after the last newline of each
    read: every block is whole lines (without the final newline), one block per read that
    completed a line; a last line without a newline comes last. Shared by log streams and
    watches (``watch.py``: one JSON event per line)."""
    pending = b""
    while chunk := read():
        cut = chunk.rfind(b"\n")
        if cut < 0:
            pending += chunk
            continue
        yield pending + chunk[:cut] if pending else chunk[:cut]
        pending = chunk[cut + 1 :]
    if pending:
        yield pending


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
            else functools.partial(resp.read, READ_BYTES)
        )

    def batches(self) -> Iterator[list[str]]:
        """Lists of complete lines (without their newline), one list per network read."""
        import urllib3

        try:
            for block in line_blocks(self._read):
                yield block.decode("utf-8", errors="replace").split("\n")
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as e:
            raise LogStreamBroken(short_reason(e)) from None
        self.ended = True

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
