"""Rank 0's progress in its TrainJob's own status: Kubeflow Trainer's progress API (v2.2+,
KEP-2779, ``status.trainerStatus``).

When the Trainer controller runs with its ``TrainJobStatus`` feature gate, its TrainJobStatus
runtime plugin (``pkg/runtime/framework/plugins/trainjobstatus`` in v2.3.0) gives every trainer
container three variables and mounts what they name:

- ``KUBEFLOW_TRAINER_SERVER_URL``: ``https://<service>.<namespace>.svc:<port>/apis/
  trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status``, the controller's
  status server (``pkg/statusserver``);
- ``KUBEFLOW_TRAINER_SERVER_CA_CERT``: the CA that signed that server's certificate;
- ``KUBEFLOW_TRAINER_SERVER_TOKEN``: a projected service-account token whose audience names this
  TrainJob, which the server verifies (OIDC, against the API server's keys). The kubelet rotates
  it, so it is read again for every request.

A POST of ``{"trainerStatus": {progressPercentage, estimatedRemainingSeconds, metrics: [{name,
value}], lastUpdatedTime}}`` with that token as a bearer token sets ``status.trainerStatus``.
Upstream's SDK (``kubeflow.trainer.update_trainjob_status``) posts at most once every 5 s
(``_MIN_UPDATE_INTERVAL_SECONDS``); so does this.

Training never waits for it: :meth:`ProgressPoster.event` only hands the latest state to a
daemon thread (``trainer.telemetry.writer``), which posts. Errors are logged once:

- one that will not go away by itself (a refused or invalid request: any 4xx but 408 and 429; a
  certificate the CA does not sign; a missing CA or token file) stops posting for the rest of
  the run;
- one that may (a timeout, a refused or reset connection, 408, 429, a 5xx: a loaded or
  restarting status server, whose every request also goes to the API server) keeps the state
  for the next try, at an interval that doubles up to :data:`MAX_BACKOFF_S`, so that one
  timed-out post does not lose the rest of the run's progress, and the 100% of the end is
  still posted.

Every socket operation of a post has :data:`REQUEST_TIMEOUT_S`; a name lookup (glibc's, through
the pod's search domains) has none of its own, and can outlast the run and the 30 s after it.
So the lookup runs in a thread of its own and is given up after the same timeout, and the
address is kept until a connection to it fails. The line said at the end names what a post
still under way was doing.

Standard library only: the image needs nothing more.
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import math
import os
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from trainer.contract import COMPLETED, DONE, EVAL, TRAIN
from trainer.telemetry.writer import NewestWriter

log = logging.getLogger(__name__)

ENV_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"

#: At most one post per this many seconds (upstream's SDK: _MIN_UPDATE_INTERVAL_SECONDS = 5.0).
MIN_INTERVAL_S = 5.0
#: One request's connect + read budget (upstream's SDK: timeout=5).
REQUEST_TIMEOUT_S = 5.0
#: The longest wait between tries while the server keeps failing in a way that may pass.
MAX_BACKOFF_S = 60.0
#: How long the run's end waits for its last state to be posted (a post under way, the
#: interval, the last post, and a retry of it if that one fails in a way that may pass).
CLOSE_S = 30.0
#: What the server accepts of a metric (trainjob_types.go: name and value MaxLength=64).
METRIC_MAX_CHARS = 64


def _number(value: Any) -> str:
    """A metric's value as the API wants it: a short string (``0.2347``, ``1534.2``)."""
    if isinstance(value, float):
        return f"{value:.6g}"[:METRIC_MAX_CHARS]
    return str(value)[:METRIC_MAX_CHARS]


def trainer_status(
    event: str,
    fields: Mapping[str, Any],
    evals: Mapping[str, Any] | None = None,
    before: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The ``trainerStatus`` a ``train`` or ``done`` event (the trainer's stdout contract)
    makes, with the latest eval metrics; a metric the event lacks (``done`` has no throughput)
    is taken from ``before``, the last ``train`` event. None for other events."""
    if event not in (TRAIN, DONE):
        return None
    step, max_steps = fields.get("step"), fields.get("max_steps")
    if event == DONE and fields.get("reason") != COMPLETED and step is None:
        return None  # it failed before a step was known: keep what was posted last
    status: dict[str, Any] = {}
    if event == DONE and fields.get("reason") == COMPLETED:
        status["progressPercentage"] = 100
        status["estimatedRemainingSeconds"] = 0
    elif isinstance(step, int) and isinstance(max_steps, int) and max_steps > 0:
        status["progressPercentage"] = max(0, min(100, math.floor(100 * step / max_steps)))
        step_time = fields.get("step_time_s")
        if event == TRAIN and isinstance(step_time, int | float) and math.isfinite(step_time):
            status["estimatedRemainingSeconds"] = max(0, round((max_steps - step) * step_time))
    metrics: dict[str, Any] = {}
    for key in ("step", "loss", "lr", "samples_per_s", "tokens_per_s"):
        value = fields.get(key, (before or {}).get(key))
        if isinstance(value, int | float) and (
            not isinstance(value, float) or math.isfinite(value)
        ):
            metrics[key] = value
    for key, value in (evals or {}).items():
        if isinstance(value, int | float) and math.isfinite(value):
            metrics[f"eval_{key}"] = value
    if metrics:
        status["metrics"] = [
            {"name": k[:METRIC_MAX_CHARS], "value": _number(v)} for k, v in metrics.items()
        ]
    return status


class ProgressPoster:
    """Posts rank 0's progress to ``url`` from a daemon thread, at most once per
    ``interval_s``; the newest state wins. Build it with :meth:`from_env`."""

    def __init__(
        self,
        url: str,
        ca_file: str,
        token_file: str,
        *,
        interval_s: float = MIN_INTERVAL_S,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ):
        self.url, self.ca_file, self.token_file = url, ca_file, token_file
        parts = urllib.parse.urlsplit(url)
        self._host, self._port = parts.hostname or "", parts.port or 443
        self._path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.posted = 0  # requests answered 2xx
        self.failed: str | None = None  # the error that stopped posting
        self.retried = 0  # posts that failed in a way that may pass, and were tried again
        self.last_posted: dict[str, Any] | None = None  # the newest state a 2xx answered
        # What the post under way is doing, for the close line: a socket operation has
        # ``timeout_s``, but a name lookup (glibc's, through the pod's search domains) has none.
        self._phase = ""
        # The server's addresses, looked up for the first post and kept until a connection to
        # them fails: a post every 5 s need not ask the cluster's DNS every time.
        self._addresses: list[tuple[Any, ...]] | None = None
        self._backoff = 0.0  # the wait after such failures in a row (0: not failing)
        self._evals: dict[str, Any] = {}
        self._last_train: Mapping[str, Any] = {}
        self._last_post = -math.inf
        self._failing = threading.Lock()
        self._writer: NewestWriter[dict[str, Any]] = NewestWriter(
            self._send, name="progress-api", due=self._next_post
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ProgressPoster | None:
        """A poster when the Trainer controller gave this container its progress endpoint (all
        three variables), else None."""
        url, ca, token = (environ.get(k) for k in (ENV_URL, ENV_CA_CERT, ENV_TOKEN))
        if not (url and ca and token):
            return None
        return cls(url, ca, token)

    def event(self, name: str, fields: Mapping[str, Any]) -> None:
        """A trainer event (``train``, ``eval``, ``done``, ...): keep the state it makes for
        the next post. Never blocks on the network and never raises."""
        try:
            if name == EVAL and isinstance(fields.get("metrics"), Mapping):
                self._evals.update(fields["metrics"])
                return
            status = trainer_status(name, fields, self._evals, self._last_train)
            if status is None:
                return
            if name == TRAIN:
                self._last_train = dict(fields)
            self._writer.submit(status)
        except Exception as e:  # a reporting bug must not end a training run
            self._fail(f"{type(e).__name__}: {e}")

    def close(self, timeout_s: float | None = None) -> None:
        """Post what is pending (after the interval since the last post, not after a back-off),
        then stop. Waits at most ``timeout_s`` (default :data:`CLOSE_S`), then says in one line
        what the TrainJob's status was left at."""
        writer = self._writer
        final = writer.pending or writer.writing or self.last_posted
        wait = CLOSE_S if timeout_s is None else timeout_s
        ended = writer.close(wait)
        if self.failed is not None:
            return  # said when it happened
        if not ended:
            log.warning(
                "progress: the run's last state (%s%%) was not posted within %.0f s of its end "
                "(%s); the TrainJob's status may show an older one",
                (final or {}).get("progressPercentage", "?"),
                wait,
                f"a post was still under way: {self._phase}"
                if writer.writing
                else "waiting to try again"
                if self._backoff
                else f"waiting out the rate limit, one post per {self.interval_s:.0f} s",
            )
        elif self.last_posted is not None:
            log.info(
                "progress: %d posts to the TrainJob's status, the last at %s%%",
                self.posted,
                self.last_posted.get("progressPercentage", "?"),
            )

    # -- the writer's thread -----------------------------------------------------------------

    def _send(self, status: dict[str, Any]) -> None:
        """Post ``status``; on a failure that may pass keep it for the next try (unless a newer
        state came), on any other stop posting."""
        self._last_post = time.monotonic()
        try:
            self._post(status)
        except Exception as e:
            if not may_pass(e):
                self._fail(_describe(e))
            else:
                self._retry(status, _describe(e))
        else:
            self._backoff = 0.0
            self.last_posted = status

    def _next_post(self, closing: bool) -> float:
        """When the next post may start: the rate limit after the last one, or the back-off
        after failures in a row; closing cuts a back-off short (the 100% of the end gets its
        try)."""
        if closing or not self._backoff:
            return self._last_post + self.interval_s
        return self._last_post + self._backoff

    def _retry(self, status: dict[str, Any], why: str) -> None:
        self.retried += 1
        self._writer.keep(status)  # unless a newer state came meanwhile: try this one again
        self._backoff = min(MAX_BACKOFF_S, 2 * (self._backoff or self.interval_s))
        if self.retried == 1:
            log.warning(
                "progress: a post to the TrainJob's status at %s failed (got %s); training goes "
                "on, and posting tries again, at most every %.0f s",
                self.url,
                why,
                MAX_BACKOFF_S,
            )

    def _post(self, status: dict[str, Any]) -> None:
        status = {
            **status,
            "lastUpdatedTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        with open(self.token_file) as f:  # rotated by the kubelet: read it every time
            token = f.read().strip()
        data = json.dumps({"trainerStatus": status}).encode()
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        context = ssl.create_default_context(cafile=self.ca_file)
        host, port = self._host, self._port
        if self._addresses is None:
            self._phase = f"looking up {host}"
            self._addresses = _lookup(host, port, self.timeout_s)
        self._phase = f"connecting to {host}:{port}"
        try:
            sock = _connect(self._addresses, self.timeout_s)
        except OSError:
            self._addresses = None  # look it up again next time
            raise
        self._phase = f"the TLS handshake with {host}:{port}"
        conn = http.client.HTTPSConnection(host, port, timeout=self.timeout_s, context=context)
        try:
            conn.sock = context.wrap_socket(sock, server_hostname=host)
            self._phase = "waiting for the server's answer"
            conn.request("POST", self._path, body=data, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
        finally:
            sock.close()
            conn.close()
        if not 200 <= resp.status < 300:
            raise urllib.error.HTTPError(
                self.url, resp.status, resp.reason, resp.headers, io.BytesIO(body)
            )
        self.posted += 1

    def _fail(self, why: str) -> None:
        with self._failing:  # the loop's thread (a reporting bug) or the writer's (a post)
            if self.failed is not None:
                return
            self.failed = why
        self._writer.stop()
        log.warning(
            "progress: cannot post to the TrainJob's status at %s (got %s); training goes on, "
            "without posting its progress there again",
            self.url,
            why,
        )


def _lookup(host: str, port: int, timeout_s: float) -> list[tuple[Any, ...]]:
    """``getaddrinfo``, given ``timeout_s`` like every other step of a post. The lookup has no
    timeout of its own, so it runs in a thread of its own, left behind if it does not answer; a
    TimeoutError is a failure that may pass, and the next try looks up afresh."""
    answer: dict[str, Any] = {}

    def run() -> None:
        try:
            answer["addresses"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            answer["error"] = e

    thread = threading.Thread(target=run, daemon=True, name="progress-api-lookup")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"looking up {host} took over {timeout_s:.0f} s")
    if "error" in answer:
        raise answer["error"]
    return answer["addresses"]


def _connect(addresses: list[tuple[Any, ...]], timeout_s: float) -> socket.socket:
    """A TCP connection to the first of ``addresses`` (``getaddrinfo``'s) that answers, each
    given ``timeout_s``: what ``socket.create_connection`` does, without the lookup."""
    error: OSError | None = None
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout_s)
        try:
            sock.connect(address)
            return sock
        except OSError as e:
            sock.close()
            error = e
    raise error or OSError("no address to connect to")


def may_pass(e: BaseException) -> bool:
    """Whether a failed post is worth trying again: the server was slow, unreachable for a
    moment, or said so (408, 429, 5xx). Not a refusal, a bad certificate, a missing file."""
    if isinstance(e, urllib.error.HTTPError):
        return e.code in (408, 429) or e.code >= 500
    if isinstance(e, urllib.error.URLError):
        if not isinstance(e.reason, BaseException):
            return False  # a bad URL, not a bad moment
        e = e.reason
    if isinstance(e, ssl.SSLCertVerificationError | FileNotFoundError | PermissionError):
        return False
    # Timeouts, refused or reset connections, DNS, a TLS handshake cut short, a response cut
    # short (http.client's RemoteDisconnected is a ConnectionResetError; IncompleteRead is not).
    return isinstance(e, OSError | http.client.HTTPException)


def _describe(e: BaseException) -> str:
    """One line for a failed post: the server's Status message where it sent one."""
    if isinstance(e, urllib.error.HTTPError):
        try:
            message = json.loads(e.read() or b"{}").get("message", "")
        except (ValueError, AttributeError, OSError):
            message = ""
        return f"HTTP {e.code} {e.reason}" + (f": {message}" if message else "")
    if isinstance(e, urllib.error.URLError):
        return f"{type(e.reason).__name__}: {e.reason}"
    return f"{type(e).__name__}: {e}"
