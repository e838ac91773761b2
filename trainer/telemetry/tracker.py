"""The experiment tracker: rank 0's MLflow run, one run per job across its restarts.

Where: ``mlflow.tracking_uri``, else ``MLFLOW_TRACKING_URI`` (a spec's ``env`` or ``secret_env``
gives it to the pods); no URI, no tracking. The experiment: ``mlflow.experiment``, else
``MLFLOW_EXPERIMENT_NAME``, else the job's name, else MLflow's default experiment. The run is
named after the job.

What the run gets, from rank 0's events (:meth:`Tracker.event`, which the reporter calls with
each event it prints): the run's config as params (dotted keys) at its start; every log window's
figures as metrics at the global step (``loss``, ``lr``, ``samples_per_s``, ...), evaluation's
as ``eval/<name>``, each checkpoint's ``checkpoint_stall_s`` and ``checkpoint_write_s``, the
ledger's ``goodput`` (the productive share of the job's time so far); tags for the job
(``ddpjob.job``, ``ddpjob.namespace``, ``ddpjob.api``, ``ddpjob.image``), the code a shipped
working directory brought (``ddpjob.code_digest``, ``ddpjob.code_dirty`` and MLflow's own
``mlflow.source.git.commit``), the checkpoint location (``ddpjob.checkpoint_dir``, and
``ddpjob.checkpoint``: the newest complete one).

One run per job: the run's id is kept beside the checkpoints (:data:`RECORD` under
``checkpoint.dir``), so a restarted or preempted job continues the same run: it sets the run
RUNNING again, counts the restart in the tag ``ddpjob.restarts`` and marks it with the metric
``restarts`` at its first step past what the run already holds, and logs no step of a metric the
run already has (a run resumed from an earlier checkpoint trains some steps again: their points
stay the first attempt's). A finished run ends FINISHED, a failed one (a non-finite loss, an
error) FAILED; a preempted one, or one that lost a peer, stays RUNNING until the job resumes it.

Nothing here stops or slows the loop: :meth:`Tracker.event` only queues. A daemon thread finds
or creates the run and sends the points in batches; while the server does not answer it warns
once, retries with a growing pause, and keeps at most ``max_points`` points (the oldest go
first). The ``done`` event counts the points that never reached the server (``Tracker.end``).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer.contract import (
    CHECKPOINT,
    COMPLETED,
    ERROR,
    EVAL,
    GOODPUT,
    IMAGE_ENV,
    JOB_API_ENV,
    JOB_NAME_ENV,
    MLFLOW_EXPERIMENT_NAME,
    MLFLOW_TRACKING_URI,
    NAMESPACE_ENV,
    NONFINITE,
    START,
    TRAIN,
    WORKDIR_COMMIT_ENV,
    WORKDIR_DIGEST_ENV,
    WORKDIR_DIRTY_ENV,
)
from trainer.telemetry.mlflow_client import (
    FAILED,
    FINISHED,
    MAX_KEY_LENGTH,
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VALUE_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VALUE_LENGTH,
    RUNNING,
    MlflowClient,
    MlflowError,
    is_http,
)

log = logging.getLogger(__name__)

#: The run's id, beside the checkpoints (not a step: checkpoint scans skip it).
RECORD = "ddpjob-mlflow.json"
FORMAT = "ddpjob-mlflow/1"
#: The sender's thread.
THREAD = "ddpjob-mlflow"
#: The pause between tries while the server does not answer: doubling up to the last.
RETRY_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
#: The run status a run's end leaves (None: the run stays RUNNING, to be resumed).
END_STATUS = {COMPLETED: FINISHED, NONFINITE: FAILED, ERROR: FAILED}
#: A train event's fields that are not a figure of the window.
_NOT_FIGURES = {"step", "max_steps", "epoch"}


@dataclass
class Settings:
    """Where and what to track (:meth:`from_env`)."""

    uri: str
    experiment: str | None
    run_name: str | None
    tags: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(
        cls,
        tracking_uri: str | None,
        experiment: str | None,
        checkpoint_dir: str,
        environ: Mapping[str, str] | None = None,
    ) -> Settings | None:
        """The settings, a trainer setting before MLflow's variable; None: no tracking."""
        env = os.environ if environ is None else environ
        uri = tracking_uri or env.get(MLFLOW_TRACKING_URI)
        if not uri:
            return None
        job = env.get(JOB_NAME_ENV) or None
        tags = {
            "ddpjob.job": job,
            "ddpjob.namespace": env.get(NAMESPACE_ENV),
            "ddpjob.api": env.get(JOB_API_ENV),
            "ddpjob.image": env.get(IMAGE_ENV),
            "ddpjob.code_digest": env.get(WORKDIR_DIGEST_ENV),
            "ddpjob.code_dirty": env.get(WORKDIR_DIRTY_ENV),
            "mlflow.source.git.commit": env.get(WORKDIR_COMMIT_ENV),
            "ddpjob.checkpoint_dir": checkpoint_dir,
        }
        name = experiment or env.get(MLFLOW_EXPERIMENT_NAME) or job
        return cls(uri, name, job, {k: v for k, v in tags.items() if v})


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow params: dotted keys, values as text within MLflow's limits."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= flatten(value, f"{name}.")
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[name[:MAX_KEY_LENGTH]] = text[:MAX_PARAM_VALUE_LENGTH]
    return out


def _point(key: str, value: Any, step: int) -> dict[str, Any] | None:
    """One metric point, or None for a value that is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return {"key": key, "value": float(value), "step": int(step), "timestamp": _now_ms()}


def _now_ms() -> int:
    return int(time.time() * 1000)


def goodput_ratio(runs: list[Mapping[str, Any]]) -> float | None:
    """The productive share of the time the ledger accounts for across ``runs``."""
    parts = ("startup_s", "productive_s", "stall_s", "eval_s", "lost_s", "other_s")
    total = sum(float(r.get(p) or 0.0) for r in runs for p in parts)
    productive = sum(float(r.get("productive_s") or 0.0) for r in runs)
    return productive / total if total > 0 else None


class Tracker:
    """Rank 0's run in MLflow. Make it on rank 0 only; feed it every event (:meth:`event`);
    :meth:`end` it as the run ends. ``store``: the checkpoint storage (``open_store``), where
    the run's id is kept (None: a run of its own each time). ``resume``: whether this run may
    continue the job's run (false for ``resume=never``)."""

    def __init__(
        self,
        settings: Settings,
        store: Any,
        *,
        resume: bool,
        max_points: int,
        environ: Mapping[str, str] | None = None,
        client: MlflowClient | None = None,
    ):
        self.settings = settings
        environ = os.environ if environ is None else environ
        self.client = client or MlflowClient(settings.uri, environ)
        self._sender = _Sender(self.client, settings, store, resume, max_points)
        self._last_step = 0

    @classmethod
    def start(cls, settings: Settings | None, store: Any, **kwargs: Any) -> Tracker | None:
        """A tracker for ``settings`` (None: none), its thread started; a tracking URI this
        client cannot reach (not ``http(s)://``) is one warning and no tracking."""
        if settings is None:
            return None
        if not is_http(settings.uri):
            log.warning(
                "mlflow: tracking URI %s is not http(s)://; this trainer talks to an MLflow "
                "tracking server through its REST API. Training goes on untracked",
                settings.uri,
            )
            return None
        tracker = cls(settings, store, **kwargs)
        tracker._sender.start()
        return tracker

    def event(self, name: str, fields: Mapping[str, Any]) -> None:
        """What an event of rank 0 means for the run (queued for the sender)."""
        step = fields.get("step")
        if isinstance(step, int):
            self._last_step = max(self._last_step, step)
        if name == START:
            self._sender.started(flatten(fields.get("config") or {}))
        elif name == TRAIN:
            self._sender.add(_point(k, v, step) for k, v in fields.items() if k not in _NOT_FIGURES)
        elif name == EVAL:
            metrics = fields.get("metrics") or {}
            self._sender.add(_point(f"eval/{k}", v, step) for k, v in metrics.items())
        elif name == CHECKPOINT:
            self._sender.add(
                [
                    _point("checkpoint_stall_s", fields.get("stall_s"), step),
                    _point("checkpoint_write_s", fields.get("write_s"), step),
                ]
            )
            if fields.get("path"):
                self._sender.tag("ddpjob.checkpoint", str(fields["path"]))
        elif name == GOODPUT:
            ratio = goodput_ratio(fields.get("runs") or [])
            self._sender.add([_point("goodput", ratio, self._last_step)])

    def announcement(self) -> dict[str, Any] | None:
        """The ``tracking`` event's fields once the run is known, once (else None)."""
        return self._sender.take_announcement()

    def end(self, reason: str, wait_s: float) -> int:
        """The run ends with ``reason`` (the ``done`` event's): send what is queued and the
        run's status, waiting at most ``wait_s``; return the points that never reached it."""
        return self._sender.close(END_STATUS.get(reason), wait_s)


class _Sender(threading.Thread):
    """Finds or creates the run, then sends the queued points, tags and the end status."""

    def __init__(
        self, client: MlflowClient, settings: Settings, store: Any, resume: bool, cap: int
    ):
        super().__init__(name=THREAD, daemon=True)
        self.client, self.settings, self.store, self.resume = client, settings, store, resume
        self.cond = threading.Condition()
        self.points: collections.deque[dict[str, Any]] = collections.deque(maxlen=cap)
        self.tags: dict[str, str] = dict(settings.tags)
        self.params: dict[str, str] = {}  # the config, until sent (a new run's only)
        self.dropped = 0
        self.closing = False
        self.end_status: str | None = None
        self.done = threading.Event()
        # The sender's own.
        self.run_id: str | None = None
        self.experiment_id = ""
        self.continued = False  # the job's run from before a restart
        self.last_steps: dict[str, int] = {}  # per key: the newest step the run holds
        self.restarts = 0
        self.marked = True  # the restart is marked (or there is none to mark)
        self.warned = False
        self.announce: dict[str, Any] | None = None

    # -- the loop's side -----------------------------------------------------------------------

    def started(self, params: dict[str, str]) -> None:
        with self.cond:
            self.params = dict(params)
            self.cond.notify()

    def add(self, points: Any) -> None:
        with self.cond:
            for point in points:
                if point is None:
                    continue
                if len(self.points) == self.points.maxlen:
                    self.dropped += 1
                self.points.append(point)
            self.cond.notify()

    def tag(self, key: str, value: str) -> None:
        with self.cond:
            self.tags[key] = value[:MAX_TAG_VALUE_LENGTH]
            self.cond.notify()

    def take_announcement(self) -> dict[str, Any] | None:
        with self.cond:
            out, self.announce = self.announce, None
        return out

    def close(self, status: str | None, wait_s: float) -> int:
        with self.cond:
            self.closing, self.end_status = True, status
            self.cond.notify()
        self.done.wait(wait_s)
        with self.cond:
            return self.dropped + len(self.points)

    # -- the thread ----------------------------------------------------------------------------

    def run(self) -> None:
        failures = 0
        while True:
            try:
                if self.run_id is None:
                    self._find_run()
                finished = self._send()
                failures = 0
                if finished:
                    break
            except MlflowError as e:
                if not e.retryable:
                    self._give_up(e)
                    break
                self._warn(e)
                failures += 1
                with self.cond:
                    if self.closing:  # no more waiting: what is queued is lost
                        break
                    self.cond.wait(RETRY_S[min(failures, len(RETRY_S)) - 1])
        self.done.set()

    def _find_run(self) -> None:
        """Continue the run the record beside the checkpoints names, or create one."""
        record = self._read_record() if self.resume else None
        run = None
        if record and record.get("tracking_uri") == self.settings.uri:
            try:
                run = self.client.get_run(record["run_id"])
            except MlflowError as e:
                if not e.not_found:
                    raise
            if run is not None and run["info"].get("lifecycle_stage") == "deleted":
                run = None
        if run is not None:
            self._continue(run)
        else:
            self._create()
        with self.cond:
            self.announce = {
                "tracker": "mlflow",
                "run_id": self.run_id,
                "experiment_id": self.experiment_id,
                "url": self.client.run_url(self.experiment_id, self.run_id),
                "resumed": self.continued,
            }
        if self.warned:
            log.info("mlflow: reached %s; run %s", self.settings.uri, self.run_id)

    def _continue(self, run: dict[str, Any]) -> None:
        info, data = run["info"], run.get("data") or {}
        self.run_id, self.experiment_id = info["run_id"], info["experiment_id"]
        self.continued = True
        self.last_steps = {m["key"]: int(m.get("step", 0)) for m in data.get("metrics") or []}
        tags = {t["key"]: t["value"] for t in data.get("tags") or []}
        self.restarts = int(tags.get("ddpjob.restarts", "0")) + 1
        self.marked = False
        self.client.update_run(self.run_id, RUNNING)
        with self.cond:
            self.tags["ddpjob.restarts"] = str(self.restarts)

    def _create(self) -> None:
        s = self.settings
        self.experiment_id = self.client.experiment_id(s.experiment) if s.experiment else "0"
        tags = {**s.tags, "mlflow.source.type": "JOB"}
        if s.tags.get("ddpjob.image"):
            tags["mlflow.source.name"] = s.tags["ddpjob.image"]
        self.run_id = self.client.create_run(self.experiment_id, s.run_name, _now_ms(), tags)
        self._write_record()

    def _send(self) -> bool:
        """Send what is queued, one batch at a time; True once closed and all is sent."""
        while True:
            with self.cond:
                while not (self.points or self.tags or self._params_due() or self.closing):
                    self.cond.wait()
                batch, tags, params = self._take()
                closing = self.closing
            if not (batch or tags or params):
                if closing:
                    self._end()
                    return True
                continue
            try:
                self.client.log_batch(self.run_id, batch, params, tags)
            except MlflowError as e:
                if e.retryable:
                    self._put_back(batch, tags, params)
                    raise
                self._drop(batch, e)  # this batch, not the run: the next one may be fine
                continue
            for point in batch:
                self.last_steps[point["key"]] = max(
                    point["step"], self.last_steps.get(point["key"], -1)
                )

    def _params_due(self) -> bool:
        """A new run's params are still to send (a continued run has its own already)."""
        return bool(self.params) and not self.continued

    def _take(self) -> tuple[list[dict], dict[str, str], dict[str, str]]:
        """Under the lock: the next batch within MLflow's limits. Points of a step the run
        already holds are left out; the first new one marks a restart."""
        params: dict[str, str] = {}
        if self._params_due():
            keys = list(self.params)[:MAX_PARAMS_TAGS_PER_BATCH]
            params = {k: self.params.pop(k) for k in keys}
        room = MAX_PARAMS_TAGS_PER_BATCH - len(params)
        tags = dict(list(self.tags.items())[:room])
        for key in tags:
            del self.tags[key]
        batch: list[dict[str, Any]] = []
        while self.points and len(batch) < MAX_METRICS_PER_BATCH - 1:
            point = self.points.popleft()
            if point["step"] <= self.last_steps.get(point["key"], -1):
                continue
            if not self.marked:
                batch.append(_point("restarts", self.restarts, point["step"]))
                self.marked = True
            batch.append(point)
        return batch, tags, params

    def _put_back(self, batch: list[dict], tags: dict[str, str], params: dict[str, str]) -> None:
        with self.cond:
            restart = [p for p in batch if p["key"] == "restarts"]
            if restart:
                self.marked = False
            for point in reversed([p for p in batch if p["key"] != "restarts"]):
                if len(self.points) == self.points.maxlen:
                    self.dropped += 1
                    continue
                self.points.appendleft(point)
            self.tags = {**tags, **self.tags}
            self.params = {**params, **self.params}

    def _drop(self, batch: list[dict], e: MlflowError) -> None:
        log.warning("mlflow: the server refused a batch of %d points (%s)", len(batch), e)
        with self.cond:
            self.dropped += len([p for p in batch if p["key"] != "restarts"])

    def _end(self) -> None:
        if self.end_status is not None:
            self.client.update_run(self.run_id, self.end_status, _now_ms())

    def _warn(self, e: MlflowError) -> None:
        if not self.warned:
            self.warned = True
            log.warning(
                "mlflow: cannot reach the tracking server at %s (%s); training goes on, and "
                "up to %d points wait for it (retrying in the background)",
                self.settings.uri,
                e,
                self.points.maxlen,
            )

    def _give_up(self, e: MlflowError) -> None:
        log.warning(
            "mlflow: the tracking server at %s refused the run (%s); training goes on untracked",
            self.settings.uri,
            e,
        )
        with self.cond:
            self.dropped += len(self.points)
            self.points.clear()
            self.closing = True

    def _read_record(self) -> dict[str, Any] | None:
        if self.store is None:
            return None
        try:
            record = json.loads(self.store.read_bytes(RECORD))
        except FileNotFoundError:
            return None
        except Exception as e:  # unreadable: a run of its own
            log.warning("mlflow: cannot read %s (%s); starting a new run", RECORD, e)
            return None
        return record if record.get("format") == FORMAT else None

    def _write_record(self) -> None:
        if self.store is None:
            return
        record = {
            "format": FORMAT,
            "tracking_uri": self.settings.uri,
            "experiment_id": self.experiment_id,
            "run_id": self.run_id,
        }
        try:
            self.store.write_bytes(RECORD, json.dumps(record).encode())
        except Exception as e:
            log.warning("mlflow: cannot write %s (%s); a restart will start a new run", RECORD, e)
