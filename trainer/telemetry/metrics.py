"""Prometheus metrics from every rank, through the official client library (prometheus-client),
served at ``http://<pod>:<port>/metrics`` for a scrape.

Every rank keeps its own figures, labelled with the job, its namespace, the rank and the node
(:data:`LABELS`). Names follow Prometheus' conventions: the ``ddpjob_`` prefix, the unit in the
name, ``_total`` on counters (:data:`NAMES` lists them all, the dashboard's test reads it).

Who serves (:func:`serve`):

- a pod of one process: the trainer itself, on ``prometheus.port``;
- a pod whose launcher re-launches itself under torchrun: that launcher, which never imports
  torch and outlives its workers. The workers write their values into a folder of memory-mapped
  files (the client's multiprocess mode: ``PROMETHEUS_MULTIPROC_DIR``, which the launcher sets
  for them, :func:`worker_environment`), and the launcher serves what every worker wrote, a
  worker that torchrun restarted included. Gauges keep the newest value a live worker wrote; a
  worker that is gone leaves its counters (they only ever grow) but not its gauges.

Nothing here stops a run: a port that cannot be bound costs one warning and no metrics.
Importing this module does not import torch.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import math
import os
import re
import socket
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trainer.contract import (
    CHECKPOINT,
    GOODPUT,
    JOB_NAME_ENV,
    METRICS_DIR_ENV,
    NAMESPACE_ENV,
    NODE_NAME_ENV,
    PROMETHEUS_MULTIPROC_DIR,
    START,
    TRAIN,
)

log = logging.getLogger(__name__)

#: Every series' labels. ``job_name``, not ``job``: Prometheus sets ``job`` on every series it
#: scrapes (the scrape job) and renames a target's own ``job`` to ``exported_job``.
LABELS = ("job_name", "namespace", "rank", "node")
PATH = "/metrics"
#: Step-time histogram buckets, seconds: a CPU test's milliseconds to a large model's minutes.
STEP_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 150, 300)
#: The goodput ledger's parts (``trainer/health/ledger.py``) by the name they are exported under.
#: ``restart``: the time between one run's last moment alive and the next run's launch.
GOODPUT_PARTS = {
    "startup_s": "startup",
    "productive_s": "productive",
    "stall_s": "checkpoint",
    "eval_s": "evaluation",
    "lost_s": "lost",
    "other_s": "restart",
}

# (name, kind, help). Gauges keep the newest value written by a live process.
_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("ddpjob_step", "gauge", "The last optimizer step this rank finished."),
    ("ddpjob_max_steps", "gauge", "The step the run trains to."),
    ("ddpjob_world_size", "gauge", "Ranks in the job."),
    (
        "ddpjob_last_step_timestamp_seconds",
        "gauge",
        "When this rank finished its last step (Unix time): how long ago says whether it moves.",
    ),
    ("ddpjob_step_seconds", "histogram", "Wall time of each optimizer step, data wait included."),
    ("ddpjob_samples_total", "counter", "Samples this rank trained on (its micro-batches)."),
    ("ddpjob_tokens_total", "counter", "Tokens this rank trained on (language-model tasks)."),
    ("ddpjob_data_wait_seconds_total", "counter", "Time this rank's steps waited for data."),
    ("ddpjob_loss", "gauge", "Mean training loss over the last log window."),
    ("ddpjob_learning_rate", "gauge", "The learning rate of the last step."),
    (
        "ddpjob_samples_per_second",
        "gauge",
        "This rank's samples per second over the last log window.",
    ),
    ("ddpjob_tokens_per_second", "gauge", "This rank's tokens per second over the last window."),
    (
        "ddpjob_data_wait_ratio",
        "gauge",
        "Fraction of the last log window this rank waited for data.",
    ),
    (
        "ddpjob_busy_seconds",
        "gauge",
        "This rank's median busy time per step over the last window: forward and backward up to "
        "its last gradient bucket, not the wait for its peers (where DDP all-reduces).",
    ),
    ("ddpjob_checkpoints_total", "counter", "Checkpoints completed (rank 0)."),
    (
        "ddpjob_checkpoint_stall_seconds_total",
        "counter",
        "Time the training steps waited for checkpoint saves (rank 0).",
    ),
    (
        "ddpjob_checkpoint_write_seconds_total",
        "counter",
        "Time checkpoint writes took until complete, in the background included (rank 0).",
    ),
    ("ddpjob_restarts", "gauge", "Runs of this job before this one (rank 0, from the ledger)."),
    (
        "ddpjob_goodput_seconds_total",
        "counter",
        "The job's time by part across its runs, as the goodput ledger accounts it (rank 0).",
    ),
    (
        "ddpjob_stuck",
        "gauge",
        "1 while this rank's watchdog finds it stuck (no progress past its limit), else 0.",
    ),
    ("ddpjob_straggler", "gauge", "1 while this rank is named a straggler, else 0."),
    ("ddpjob_gpu_utilization_ratio", "gauge", "This rank's GPU utilisation (NVML), 0 to 1."),
    ("ddpjob_gpu_memory_used_bytes", "gauge", "This rank's GPU memory in use (NVML)."),
    ("ddpjob_gpu_power_watts", "gauge", "This rank's GPU power draw (NVML)."),
)
GOODPUT_FAMILY = "ddpjob_goodput_seconds_total"
#: Every family the trainer exports, by name, with its kind.
FAMILIES: dict[str, str] = {name: kind for name, kind, _ in _FAMILIES}
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("",), "gauge": ("",)}
#: Every series name a query may use (a histogram's ``_bucket``, ``_sum`` and ``_count``).
NAMES: frozenset[str] = frozenset(
    name + suffix for name, kind in FAMILIES.items() for suffix in _SUFFIXES[kind]
)


#: Set in every Kubernetes pod: where ``prometheus.serve: auto`` serves.
IN_A_POD = "KUBERNETES_SERVICE_HOST"


def serving_port(
    serve: bool | str, port: int, environ: Mapping[str, str] | None = None
) -> int | None:
    """The port this process's metrics are served on (``prometheus.serve`` and ``.port``), or
    None: off, or ``auto`` outside a pod."""
    env = os.environ if environ is None else environ
    on = serve is True or (serve == "auto" and IN_A_POD in env)
    return port if on else None


def url_of(port: int) -> str:
    """The metrics' URL on this host, by the address others reach it at."""
    return f"http://{_address()}:{port}{PATH}"


def labels_from_env(rank: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's label values: the job and namespace the pod's env names (the controller
    renders them), the rank, and the node (or, outside Kubernetes, this host)."""
    env = os.environ if environ is None else environ
    return {
        "job_name": env.get(JOB_NAME_ENV, ""),
        "namespace": env.get(NAMESPACE_ENV, ""),
        "rank": str(rank),
        "node": env.get(NODE_NAME_ENV) or socket.gethostname(),
    }


def worker_environment(port: int) -> dict[str, str]:
    """What a launcher that serves its workers' metrics puts in their environment: a fresh
    folder for their values (under ``$TMPDIR``, which a pod's ``/tmp`` volume holds)."""
    import tempfile

    folder = tempfile.mkdtemp(prefix=f"ddpjob-metrics-{port}-")
    return {PROMETHEUS_MULTIPROC_DIR: folder, METRICS_DIR_ENV: folder}


def served_by_launcher(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a launcher serves this worker's metrics (it set :data:`METRICS_DIR_ENV`)."""
    env = os.environ if environ is None else environ
    return bool(env.get(METRICS_DIR_ENV)) and env.get(METRICS_DIR_ENV) == env.get(
        PROMETHEUS_MULTIPROC_DIR
    )


class Metrics:
    """One rank's metrics. The loop's thread calls :meth:`stepped` after every step; rank 0's
    events reach :meth:`event` (a log window's figures on every rank, a checkpoint, the
    ledger); the other parts say what they see (:meth:`health`, :meth:`stuck`, :meth:`gpu`).
    ``samples`` and ``tokens``: what one step of this rank trains on (tokens 0: not a token
    task). Each has a registry of its own, which :func:`serve` serves (a second run in the same
    process, as in the tests and benches, gets new metrics on the same port)."""

    def __init__(
        self,
        labels: Mapping[str, str],
        *,
        samples: int = 0,
        tokens: int = 0,
        world_size: int = 1,
        gpu_reading: Any = None,
    ):
        import prometheus_client as prom

        self.samples, self.tokens, self.world_size = samples, tokens, world_size
        self.gpu_reading = gpu_reading  # () -> this rank's NVML reading or None
        self.registry = prom.CollectorRegistry()
        values = [labels[k] for k in LABELS]
        self._m: dict[str, Any] = {}
        for name, kind, text in _FAMILIES:
            family = _family(prom, name, kind, text, self.registry)
            self._m[name] = family if name == GOODPUT_FAMILY else family.labels(*values)
        # The goodput counter has a child per part, made as the ledger names them.
        self._goodput_values = values
        self._goodput: dict[str, Any] = {}
        self._goodput_sent: dict[str, float] = {}
        # Bound once: the per-step calls are attribute reads, not dict look-ups.
        m = self._m
        self._step, self._last_step_at = m["ddpjob_step"], m["ddpjob_last_step_timestamp_seconds"]
        self._step_s, self._samples = m["ddpjob_step_seconds"], m["ddpjob_samples_total"]
        self._tokens = m["ddpjob_tokens_total"]
        self._data_wait = m["ddpjob_data_wait_seconds_total"]

    # -- the loop's calls ---------------------------------------------------------------------

    def started(self, step: int, max_steps: int) -> None:
        """The run starts at ``step`` (a resumed run's checkpoint step)."""
        self._step.set(step)
        self._m["ddpjob_max_steps"].set(max_steps)
        self._m["ddpjob_world_size"].set(self.world_size)
        for name in ("ddpjob_stuck", "ddpjob_straggler"):
            self._m[name].set(0)

    def stepped(self, step: int, seconds: float, data_s: float) -> None:
        """Step ``step`` is done: it took ``seconds``, ``data_s`` of them waiting for data."""
        self._step.set(step)
        self._last_step_at.set(time.time())
        self._step_s.observe(seconds)
        self._samples.inc(self.samples)
        if self.tokens:
            self._tokens.inc(self.tokens)
        if data_s:
            self._data_wait.inc(data_s)

    def event(self, name: str, fields: Mapping[str, Any]) -> None:
        """What an event means for the metrics: every rank's log window (its ``train`` event,
        printed by rank 0 only), rank 0's start, checkpoints and ledger."""
        if name == TRAIN:
            # The event's rates are the job's (every rank's samples): this rank's share.
            share = {"loss", "lr", "data_wait"}
            figures = {k: v for k, v in fields.items() if k in share}
            for key in ("samples_per_s", "tokens_per_s"):
                if fields.get(key) is not None:
                    figures[key] = fields[key] / self.world_size
            self.window(figures)
            if self.gpu_reading is not None:
                self.gpu(self.gpu_reading())
        elif name == START:
            self.started(int(fields.get("step") or 0), fields["config"]["max_steps"])
        elif name == CHECKPOINT:
            self.checkpoint(fields.get("stall_s"), fields.get("write_s"))
        elif name == GOODPUT:
            self.goodput(fields.get("runs") or [])

    def health(self, busy_s: float | None, straggler: bool) -> None:
        """A log window's verdict on this rank: its median busy time per step (None where not
        measured) and whether it is named a straggler."""
        if busy_s is not None and math.isfinite(busy_s):
            self._m["ddpjob_busy_seconds"].set(busy_s)
        self.straggler(straggler)

    def window(self, figures: Mapping[str, float | None]) -> None:
        """A log window ended: its figures by the ``train`` event's keys (``loss``, ``lr``,
        ``samples_per_s``, ``tokens_per_s``, ``data_wait``; ``busy_s`` where measured)."""
        keys = {
            "loss": "ddpjob_loss",
            "lr": "ddpjob_learning_rate",
            "samples_per_s": "ddpjob_samples_per_second",
            "tokens_per_s": "ddpjob_tokens_per_second",
            "data_wait": "ddpjob_data_wait_ratio",
            "busy_s": "ddpjob_busy_seconds",
        }
        for key, name in keys.items():
            value = figures.get(key)
            if value is not None:
                self._m[name].set(value)

    def checkpoint(self, stall_s: float | None, write_s: float | None) -> None:
        """A checkpoint completed; what it cost the steps and how long its write took."""
        self._m["ddpjob_checkpoints_total"].inc()
        if stall_s:
            self._m["ddpjob_checkpoint_stall_seconds_total"].inc(stall_s)
        if write_s:
            self._m["ddpjob_checkpoint_write_seconds_total"].inc(write_s)

    def goodput(self, runs: list[Mapping[str, Any]]) -> None:
        """The ledger's runs (its ``goodput`` event's): the job's seconds by part, summed over
        its runs, the gaps between them as ``restart``, and how many runs came before this one.
        A counter only grows: a part the ledger revises down within this process stays put."""
        totals = dict.fromkeys(GOODPUT_PARTS.values(), 0.0)
        for run in runs:
            for key, part in GOODPUT_PARTS.items():
                totals[part] += float(run.get(key) or 0.0)
        for before, after in itertools.pairwise(runs):
            gap = float(after.get("launched_at") or 0) - float(before.get("ended_at") or 0)
            totals["restart"] += max(0.0, gap)
        for part, total in totals.items():
            delta = total - self._goodput_sent.get(part, 0.0)
            child = self._goodput.get(part)
            if child is None:
                child = self._m[GOODPUT_FAMILY].labels(*self._goodput_values, part)
                self._goodput[part] = child
            if delta > 0:
                child.inc(delta)
                self._goodput_sent[part] = total
        self._m["ddpjob_restarts"].set(max(0, len(runs) - 1))

    def stuck(self, stuck: bool) -> None:
        """This rank's watchdog found it stuck (True) or moving again (False); from its thread."""
        self._m["ddpjob_stuck"].set(1 if stuck else 0)

    def straggler(self, slow: bool) -> None:
        """This rank is (True) or is no longer (False) named a straggler."""
        self._m["ddpjob_straggler"].set(1 if slow else 0)

    def gpu(self, reading: Mapping[str, float] | None) -> None:
        """This rank's GPU reading (``trainer.telemetry.events.GpuMonitor``'s dict), if any."""
        if not reading:
            return
        self._m["ddpjob_gpu_utilization_ratio"].set(reading["util_pct"] / 100.0)
        self._m["ddpjob_gpu_memory_used_bytes"].set(reading["mem_used_gib"] * 2**30)
        self._m["ddpjob_gpu_power_watts"].set(reading["power_w"])


def _family(prom: Any, name: str, kind: str, text: str, registry: Any) -> Any:
    """One family of :data:`_FAMILIES` in ``registry``, labelled :data:`LABELS` (the goodput
    counter also by ``part``). The client adds ``_total`` to a counter's name itself; a gauge
    keeps the newest value that a live process set (multiprocess mode)."""
    labels = [*LABELS, "part"] if name == GOODPUT_FAMILY else list(LABELS)
    if kind == "counter":
        return prom.Counter(name.removesuffix("_total"), text, labels, registry=registry)
    if kind == "histogram":
        return prom.Histogram(name, text, labels, registry=registry, buckets=STEP_BUCKETS_S)
    return prom.Gauge(name, text, labels, registry=registry, multiprocess_mode="livemostrecent")


def start(
    serve_setting: bool | str,
    port: int,
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    samples: int,
    tokens: int,
    gpu_index: int | None,
) -> tuple[Metrics | None, str | None]:
    """This rank's metrics and where they are served, or (None, None) where none are: the
    settings say so, or the port cannot be bound (one warning). A launcher that serves its
    workers serves this one's; else this process serves on ``port + local_rank`` (the ranks of
    one machine, started by a torchrun of their own, each on a port of its own)."""
    chosen = serving_port(serve_setting, port)
    if chosen is None:
        return None, None
    reading = _gpu_reading(gpu_index) if gpu_index is not None else None
    metrics = Metrics(
        labels_from_env(rank),
        samples=samples,
        tokens=tokens,
        world_size=world_size,
        gpu_reading=reading,
    )
    if served_by_launcher():
        return metrics, url_of(chosen)
    url = serve(chosen + local_rank, metrics.registry)
    return (metrics, url) if url is not None else (None, None)


def _gpu_reading(index: int) -> Any:
    """A function that reads GPU ``index`` by NVML (None when NVML has nothing)."""
    from trainer.telemetry.events import GpuMonitor

    monitor = GpuMonitor()

    def read() -> dict[str, float] | None:
        return next((g for g in monitor.read() if g["index"] == index), None)

    return read


# ---------------------------------------------------------------------------------------------
# Serving


#: This process's metrics servers, by port: each serves the registry it was last handed.
_SERVED: dict[int, tuple[_Current, str]] = {}


class _Current:
    """A collector that yields what the registry it holds now yields."""

    def __init__(self, registry: Any):
        self.registry = registry

    def collect(self) -> Iterable[Any]:
        return self.registry.collect()


def serve(port: int, registry: Any = None, *, workers_dir: str | None = None) -> str | None:
    """Serve ``registry``, or with ``workers_dir`` every worker's values written there, at
    ``http://0.0.0.0:<port>/metrics`` from a daemon thread (a port this process serves already
    serves ``registry`` from now on). Returns the URL by this host's address, or None (one
    warning) when the port cannot be bound."""
    import prometheus_client as prom

    if workers_dir is not None:
        registry = prom.CollectorRegistry()
        _WorkersCollector(workers_dir, registry)
    if port in _SERVED:
        current, url = _SERVED[port]
        current.registry = registry
        return url
    current = _Current(registry)
    served = prom.CollectorRegistry(auto_describe=False)
    served.register(current)
    try:
        server, _ = prom.start_http_server(port, registry=served)
    except OSError as e:
        why = "in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        log.warning(
            "prometheus: cannot serve metrics on port %d (%s); training goes on without them. "
            "Set prometheus.port to a free port, or prometheus.serve=false",
            port,
            why,
        )
        return None
    _SERVED[port] = (current, url_of(server.server_port))
    return _SERVED[port][1]


def _address() -> str:
    """This host's address as others reach it (a pod's IP), else its name."""
    name = socket.gethostname()
    with contextlib.suppress(OSError):
        return socket.gethostbyname(name)
    return name


_PID = re.compile(r"_(\d+)\.db$")


class _WorkersCollector:
    """The client's multiprocess collector over ``folder``, which first lets go of the gauges of
    workers that are gone (torchrun restarted them, or they ended)."""

    def __init__(self, folder: str, registry: Any):
        from prometheus_client import multiprocess

        self.folder = folder
        self.inner = multiprocess.MultiProcessCollector(None, path=folder)
        registry.register(self)

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        from prometheus_client import multiprocess

        for path in Path(self.folder).glob("gauge_live*.db"):
            found = _PID.search(path.name)
            if found and not _alive(int(found.group(1))):
                multiprocess.mark_process_dead(int(found.group(1)), self.folder)
        return self.inner.collect()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
