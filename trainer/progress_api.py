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

Training never waits for it: :meth:`ProgressPoster.update` only stores the latest state and
wakes a daemon thread, which posts. The first error (an HTTP error, TLS, a timeout, a missing
file) is logged once and posting stops for the rest of the run. Standard library only: the
image needs nothing more.
"""

from __future__ import annotations

import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

log = logging.getLogger(__name__)

ENV_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"

#: At most one post per this many seconds (upstream's SDK: _MIN_UPDATE_INTERVAL_SECONDS = 5.0).
MIN_INTERVAL_S = 5.0
#: One request's connect + read budget (upstream's SDK: timeout=5).
REQUEST_TIMEOUT_S = 5.0
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
    if event not in ("train", "done"):
        return None
    step, max_steps = fields.get("step"), fields.get("max_steps")
    if event == "done" and fields.get("reason") != "completed" and step is None:
        return None  # it failed before a step was known: keep what was posted last
    status: dict[str, Any] = {}
    if event == "done" and fields.get("reason") == "completed":
        status["progressPercentage"] = 100
        status["estimatedRemainingSeconds"] = 0
    elif isinstance(step, int) and isinstance(max_steps, int) and max_steps > 0:
        status["progressPercentage"] = max(0, min(100, math.floor(100 * step / max_steps)))
        step_time = fields.get("step_time_s")
        if event == "train" and isinstance(step_time, int | float) and math.isfinite(step_time):
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
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.posted = 0  # requests answered 2xx
        self.failed: str | None = None  # the error that stopped posting
        self._evals: dict[str, Any] = {}
        self._last_train: Mapping[str, Any] = {}
        self._pending: dict[str, Any] | None = None  # the newest state not posted yet
        self._closing = False
        self._last_post = -math.inf
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True, name="progress-api")
        self._thread.start()

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
            if name == "eval" and isinstance(fields.get("metrics"), Mapping):
                self._evals.update(fields["metrics"])
                return
            status = trainer_status(name, fields, self._evals, self._last_train)
            if status is None:
                return
            if name == "train":
                self._last_train = dict(fields)
            with self._cond:
                if self.failed is None and not self._closing:
                    self._pending = status
                    self._cond.notify()
        except Exception as e:  # a reporting bug must not end a training run
            self._fail(f"{type(e).__name__}: {e}")

    def close(self, timeout_s: float | None = None) -> None:
        """Post what is pending (after the interval since the last post), then stop. Waits at
        most ``timeout_s`` (default: one interval and one request)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        wait = self.interval_s + self.timeout_s + 1.0 if timeout_s is None else timeout_s
        self._thread.join(wait)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closing:
                    self._cond.wait()
                if self._pending is None or self.failed is not None:
                    return  # closing with nothing to post
                # The rate limit: a newer state that comes meanwhile replaces this one.
                while time.monotonic() < self._last_post + self.interval_s:
                    self._cond.wait(self._last_post + self.interval_s - time.monotonic())
                status, self._pending = self._pending, None
                self._last_post = time.monotonic()
            try:
                self._post(status)
            except Exception as e:
                self._fail(_describe(e))
                return

    def _post(self, status: dict[str, Any]) -> None:
        status = {
            **status,
            "lastUpdatedTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        with open(self.token_file) as f:  # rotated by the kubelet: read it every time
            token = f.read().strip()
        request = urllib.request.Request(
            self.url,
            data=json.dumps({"trainerStatus": status}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            method="POST",
        )
        context = ssl.create_default_context(cafile=self.ca_file)
        with urllib.request.urlopen(request, timeout=self.timeout_s, context=context) as resp:
            resp.read()
        self.posted += 1

    def _fail(self, why: str) -> None:
        with self._cond:
            if self.failed is not None:
                return
            self.failed = why
            self._pending = None
        log.warning(
            "progress: cannot post to the TrainJob's status at %s (got %s); training goes on, "
            "without posting its progress there again",
            self.url,
            why,
        )


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
