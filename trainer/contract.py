"""The trainer's contract with its launchers and with the controller, in one torch-free place.

Both halves read these names from here: the trainer writes them (``trainer.__main__``,
``trainer.launch``, ``trainer.telemetry.events``), the controller reads them (``controller.jobs``,
``controller.kubeflow``, ``controller.local``). Keys of an event are added, never renamed.

- **Exit codes** of ``python -m trainer`` and what each means to the person reading a failed job.
- **Events**: one JSON object per line on stdout with an ``"event"`` key. Rank 0 writes the job's
  events; any rank may write events about itself (``RANK_EVENTS``), with its ``rank``.
  :func:`format_event` writes a line and :func:`parse_event` reads one: the controller parses
  JSON, never a text prefix, so the order of keys and the spacing are free.
- **Lines**: where several processes share a stream (a node's processes under torchrun), each
  line reaches the log whole, named by its process's global rank (:class:`RankLines`).
- **Launcher variables**: what torchrun, the Kubeflow PyTorchJob operator and Kubeflow Trainer v2
  set in a process's environment (docs/architecture.md, "The launcher contracts").
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# ---------------------------------------------------------------------------------------------
# Exit codes

EXIT_OK = 0
#: NaN/inf loss past ``max_nonfinite_skips``, or an exception.
EXIT_FAILED = 1
#: A bad configuration: nothing trained.
EXIT_CONFIG = 2
EXIT_SIGINT = 130
#: SIGKILL: the kernel's OOM killer, ``kill -9``, or a grace period that ran out.
EXIT_KILLED = 137
#: 128 + SIGUSR1: another rank was lost (or the group never formed); this process is fine. Also
#: the code of a job that restarts itself (a stuck job, a slow rank found by the pre-flight,
#: saves failing in a row): 138 is the one code every version of the PyTorchJob operator
#: retries that is not a signal's (Kubeflow's "user-defined retryable" code), and a TrainJob's
#: Job retries any. What the restart is for is said by the ``done`` event's ``cause``.
EXIT_PEER_LOST = 138
#: The code a job that restarts itself exits with (see EXIT_PEER_LOST).
EXIT_RESTART = EXIT_PEER_LOST
#: SIGTERM: preempted or deleted; the last checkpoint is complete before the exit.
EXIT_PREEMPTED = 143
#: A worker of the pod's own torchrun found the rendezvous it was started from already over (the
#: store that placed its agent is gone or was replaced): the pod's launcher starts torchrun again
#: at once. A worker's code only, never a container's (EX_TEMPFAIL, sysexits.h).
EXIT_STALE_RENDEZVOUS = 75

#: What each exit code means, said when a container ended with it (128 + signal number for the
#: signals).
EXIT_MEANINGS = {
    EXIT_FAILED: "the program raised or exited 1",
    EXIT_CONFIG: "bad command-line or config",
    126: "command not executable",
    127: "command not found",
    EXIT_SIGINT: "SIGINT",
    134: "SIGABRT (abort)",
    EXIT_KILLED: "SIGKILL (killed: OOM, kill -9 or grace period over)",
    EXIT_PEER_LOST: (
        "lost a peer rank or restarts itself (the trainer's retryable code, 128 + SIGUSR1: "
        "another rank died first, or the job was stuck, slow or could not save; its last "
        "lines say which)"
    ),
    139: "SIGSEGV (segmentation fault)",
    EXIT_PREEMPTED: "SIGTERM (preempted or deleted; retried)",
}

#: The codes after which a retry can help: the PyTorchJob operator's ``restartPolicy: ExitCode``
#: retries exactly these (pkg/controller.v1/common) and fails the job on every other.
RETRYABLE_EXIT_CODES = (EXIT_SIGINT, EXIT_KILLED, EXIT_PEER_LOST, EXIT_PREEMPTED)

# ---------------------------------------------------------------------------------------------
# Events

#: Rank 0: the run started (``world_size``, ``step``, ``config``, ``hostname``).
START = "start"
#: Rank 0: state was loaded (``step``, ``path``, ``skipped``).
RESUME = "resume"
#: Rank 0, every ``log_every`` steps: ``step``, ``loss``, ``step_time_s``, ...; while any rank
#: lags, ``stragglers``: each (``rank``, ``pod``, ``node``, ``step_time_s``) named by a
#: ``straggler`` event and not recovered since.
TRAIN = "train"
#: Rank 0: evaluation metrics (``step``, ``metrics``).
EVAL = "eval"
#: Rank 0: a checkpoint is complete and readable (``step``, ``path``; ``stall_s``: what the save
#: cost the training step, ``write_s``: its background write until complete, ``bytes``).
CHECKPOINT = "checkpoint"
#: Rank 0: the run ended (``step``, ``reason``: one of ``DONE_REASONS``). Added: ``cause``,
#: with ``reason`` ``restart``: why the job restarts itself, in one line (``stuck: rank 1 in
#: hangtask.py:_stuck_here on node X``, ``checkpoint: 3 saves in a row failed ...``).
DONE = "done"
#: A rank whose step made no progress for ``stuck_s`` seconds. Every rank prints its own, about
#: itself (``rank``, ``step``, ``stuck_s``, ``in_collective``: the collective it waits in or
#: null, ``frame``: ``{"file", "line", "function"}`` of its innermost frame of interest,
#: ``stack``: every thread's frames, innermost first). Rank 0 also prints the job's verdict with
#: ``culprit``: the rank that is not in the collective the others wait in, with its ``frame``.
#: Added: a rank's ``collective`` (torch's Flight Recorder's last collective on the default
#: group: ``{"op", "seq", "completed"}``, or null), ``hostname`` and ``node``; ``stack`` is a
#: list of ``{"thread", "frames"}``, the loop's thread first, and a frame has its ``code``.
#: The verdict (the one with a ``culprit`` key, null when no rank is behind the others) also
#: has ``culprits``, ``waiting`` (the ranks in ``in_collective``, what they wait in),
#: ``silent`` (ranks that did not answer), ``stuck_s``, and the culprit's ``step``, ``stack``
#: (its loop's thread), ``pod``, ``node`` and ``rank_in_collective``. Once the loop moves
#: again, each rank that was stuck prints one with ``recovered: true`` and ``stuck_s`` the
#: whole stall, and rank 0 the verdict's (``culprit``, ``recovered: true``).
STUCK = "stuck"
#: Rank 0: a rank persistently slower than the median (``rank``, ``pod``, ``node``,
#: ``step_time_s``, ``median_s``, ``factor``, ``windows``). ``step_time_s`` is the rank's busy
#: time per step (its forward and backward, not the wait for its peers), ``median_s`` the
#: median of the other ranks', ``factor`` their ratio. Added: ``step``, ``threshold`` (the
#: configured factor), and ``recovered: true`` once a straggler has kept up ``windows`` windows.
STRAGGLER = "straggler"

#: Rank 0: what each run of the job cost, from the ledger it carries across restarts
#: (``trainer/health/ledger.py``): at the start, every log window and the end. ``at``: when printed
#: (epoch seconds); ``runs``: every run of the job so far, oldest first, the last this one, each
#: ``{"id", "launched_at", "first_step_at", "ended_at", "start_step", "last_step", "kept_step",
#: "lost_steps", "startup_s", "productive_s", "stall_s", "eval_s", "lost_s", "other_s", "end"}``:
#: times in epoch seconds (``launched_at``: the container's process start; ``first_step_at``:
#: the first step done, null before; ``ended_at``: the last moment the run was known alive),
#: and its seconds split so that they sum to ``ended_at - launched_at``; ``end`` is the ``done``
#: reason, null while running or for a run that died without one. Added: ``cause``, the ``done``
#: event's (why a run that ended ``restart`` restarted the job), null otherwise.
GOODPUT = "goodput"

#: Rank 0, once its experiment tracker knows its run (``trainer/telemetry/mlflow.py``): ``tracker``
#: ("mlflow"), ``run_id``, ``experiment_id``, ``url`` (the run's page on the tracking server),
#: ``resumed`` (true: the job's run from before a restart, continued).
TRACKING = "tracking"

#: Rank 0, before the first step: what each rank's short matmul and its link to the next rank
#: took (``ranks``: each ``{"rank", "pod", "node", "matmul_s", "link_s"}``; ``link_s`` is the
#: time its neighbour's fixed-size message took to arrive, the link from ``rank - 1``), the
#: medians (``matmul_median_s``, ``link_median_s``), one all-reduce of ``bytes``
#: (``allreduce_s``), ``factor`` (the configured limit), ``elapsed_s`` (what the pre-flight
#: cost), and ``slow``: each rank or link over ``factor`` times the median of the other ranks'
#: (``median_s``), as ``{"rank", "pod", "node", "what": "matmul" | "link", "seconds",
#: "median_s", "factor", "peer"}`` (``peer``: a link's sending rank).
PREFLIGHT = "preflight"
#: Rank 0: a background checkpoint write failed after the store's own retries (``step``,
#: ``path``, ``error``: where and what the server answered, ``failed_in_row``, ``limit``: the
#: saves in a row that may fail before the job restarts). Training goes on; the next save is
#: tried.
CHECKPOINT_FAILED = "checkpoint_failed"
#: A node that hosted a stuck, slow or lost rank of the job (``node``, ``rank``, ``pod``,
#: ``cause``), with the job's faults on it so far (``faults``) and whether the job's next pods
#: now avoid it (``avoided``: ``faults`` reached ``after``); ``nodes``: every node the job
#: avoids; ``problem``: why the job could not be told (no API access, ...), else null.
BAD_NODE = "bad_node"

JOB_EVENTS = (
    START,
    RESUME,
    TRAIN,
    EVAL,
    CHECKPOINT,
    DONE,
    STRAGGLER,
    GOODPUT,
    PREFLIGHT,
    CHECKPOINT_FAILED,
    BAD_NODE,
    TRACKING,
)
RANK_EVENTS = (STUCK,)

#: Why a run ended (the ``done`` event's ``reason``). ``restart``: the job restarts itself
#: (exit EXIT_RESTART), the event's ``cause`` says why.
COMPLETED, PREEMPTED, NONFINITE, PEER_LOST, ERROR, RESTART = (
    "completed",
    "preempted",
    "nonfinite",
    "peer_lost",
    "error",
    "restart",
)
DONE_REASONS = (COMPLETED, PREEMPTED, NONFINITE, PEER_LOST, ERROR, RESTART)


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: a non-finite number is written as null (the ``done`` event says why)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def format_event(name: str, **fields: Any) -> str:
    """One event as the line the trainer prints (no newline)."""
    return json.dumps(_clean({"event": name, **fields}), separators=(", ", ": "))


def parse_event(line: str) -> dict[str, Any] | None:
    """The event in ``line`` if it is one JSON object with a string ``event`` key, else None.

    Any key order and any spacing: what matters is the object, not how it was printed. A line
    named by its process's rank (:data:`RANK_PREFIX`) is read past the name."""
    text = split_rank(line.strip())[1].strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("event"), str) else None


def is_event(line: str, name: str) -> bool:
    """True when ``line`` is the event ``name``."""
    event = parse_event(line)
    return event is not None and event["event"] == name


# ---------------------------------------------------------------------------------------------
# Lines of several processes on one stream

#: How a line of one of several processes that share a stream (a node's processes under
#: torchrun) names its process: ``[rank 3] text``, the global rank. The trainer's own log lines
#: carry it already (its logging format), and keep one.
RANK_PREFIX = "[rank {rank}] "
_RANK_PREFIX = re.compile(r"\[rank (\d+)\] ")

#: torchrun's prefix for each piece of a worker's output that it copies to its own stream
#: (``--tee 3`` with ``--log-line-prefix-template``, or ``PET_TEE`` and
#: ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``): the worker's global rank between two control
#: characters, record and unit separator, that text does not carry.
TORCHRUN_PIECE_PREFIX = "\x1e${rank}\x1f"
_PIECE, _RANK_END = b"\x1e", b"\x1f"
#: A line longer than this is given out in parts (a process that never ends its line).
MAX_LINE_BYTES = 1 << 20


def split_rank(line: str) -> tuple[int | None, str]:
    """``[rank 3] text`` -> ``(3, "text")``; a line without the prefix -> ``(None, line)``."""
    m = _RANK_PREFIX.match(line)
    return (int(m.group(1)), line[m.end() :]) if m else (None, line)


class RankLines:
    """Whole lines, each named by its process's global rank, from one of torchrun's streams.

    torchrun (with :data:`TORCHRUN_PIECE_PREFIX`) copies each worker's output to its own stream
    a piece at a time: a line, or as much of one as the worker had written when torchrun looked
    (an unbuffered ``print`` writes its arguments one at a time), each piece after its rank. The
    pieces of a rank are kept until its line ends; then the line is given out whole, after
    :data:`RANK_PREFIX` (unless it starts with it already). Text outside the pieces (torchrun's
    own lines, a process that prints directly) is given out line by line as it is.

    ``feed`` takes bytes as they were read and returns the lines they completed; ``close``
    returns what is left, each piece ended with a newline."""

    def __init__(self) -> None:
        self._buf = b""
        self._rank: int | None = None  # whose piece the stream is in (None: no piece)
        self._open: dict[int | None, bytes] = {}  # each rank's line so far

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while self._buf:
            if self._buf.startswith(_PIECE):
                end = self._buf.find(_RANK_END)
                if end < 0:
                    break  # the rank is still on its way
                rank = self._buf[1:end]
                self._rank = int(rank) if rank.isdigit() else None
                self._buf = self._buf[end + 1 :]
                continue
            newline, piece = self._buf.find(b"\n"), self._buf.find(_PIECE)
            if newline >= 0 and (piece < 0 or newline < piece):
                self._add(self._buf[: newline + 1], out)
                self._buf = self._buf[newline + 1 :]
                self._rank = None  # a piece ends with its line: what follows is no rank's
            else:
                end = len(self._buf) if piece < 0 else piece
                self._add(self._buf[:end], out)
                self._buf = self._buf[end:]
        return out

    def close(self) -> list[bytes]:
        if self._buf and not self._buf.startswith(_PIECE):
            self._add(self._buf, [])
        out = [self._named(rank, line + b"\n") for rank, line in self._open.items()]
        self._buf, self._open = b"", {}
        return out

    def _add(self, text: bytes, out: list[bytes]) -> None:
        line = self._open.pop(self._rank, b"") + text
        if line.endswith(b"\n") or len(line) >= MAX_LINE_BYTES:
            out.append(self._named(self._rank, line))
        else:
            self._open[self._rank] = line

    @staticmethod
    def _named(rank: int | None, line: bytes) -> bytes:
        if rank is not None:
            prefix = RANK_PREFIX.format(rank=rank).encode()
            line = line if line.startswith(prefix) else prefix + line
        return line if line.endswith(b"\n") else line + b"\n"


#: What torch prints when an agent of torchrun finds the agents' store closed in its exit
#: barrier (the node that held the store exited the moment the last agent entered): a C++
#: warning with its stack, then the agent's logged traceback. An agent enters that barrier only
#: once every worker of its node has ended well, so after it nothing is lost.
_EXIT_RACE_FIRST = (b"[c10d] recvValueWithTimeout failed", b"Error waiting on exit barrier")
_EXIT_RACE_CPP = (b"Exception raised from ", b"frame #", b"<omitting python frames>")
_EXIT_RACE_LAST = (b"DistNetworkError", b"DistStoreError")
#: The line said instead.
EXIT_RACE_NOTE = (
    "torchrun: the agents' store (on the node of group rank 0) closed while this node's agent "
    "waited in torchrun's exit barrier, after every worker of this node had ended well: nothing "
    "was lost (torch's traceback of it left out)\n"
)


class ExitBarrierRace:
    """Folds what torch prints of that race (:data:`EXIT_RACE_NOTE`) into one line that says
    what happened, in torchrun's own lines (those :class:`RankLines` names no rank of). Lines
    are held from the race's first line until its last; any other line in between gives the
    held ones back as they were, and so does :meth:`close`."""

    def __init__(self) -> None:
        self._held: list[bytes] = []
        self._header = b""  # the agent's log header, once its "Error waiting" line came

    def feed(self, lines: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        for line in lines:
            if self._held and self._continues(line):
                self._held.append(line)
                if self._header and any(last in line for last in _EXIT_RACE_LAST):
                    out.append(EXIT_RACE_NOTE.encode())
                    self._held, self._header = [], b""
                continue
            out += self.close()
            if any(first in line for first in _EXIT_RACE_FIRST) and not _RANK_PREFIX.match(
                line.decode(errors="replace")
            ):
                self._held = [line]
                self._note_header(line)
            else:
                out.append(line)
        return out

    def close(self) -> list[bytes]:
        held, self._held, self._header = self._held, [], b""
        return held

    def _continues(self, line: bytes) -> bool:
        if self._header:
            return line.startswith(self._header)
        if line.startswith(_EXIT_RACE_CPP) or not line.strip():
            return True
        return self._note_header(line)

    def _note_header(self, line: bytes) -> bool:
        if _EXIT_RACE_FIRST[1] not in line:
            return False
        self._header = line[: line.index(b"] ") + 2] if b"] " in line else b""
        return bool(self._header)


class TorchrunLines:
    """A torchrun's stream as it reaches a log: whole lines, each named by its process's rank
    (:class:`RankLines`), and the exit barrier's race said in one line (:class:`ExitBarrierRace`).
    """

    def __init__(self) -> None:
        self._lines, self._race = RankLines(), ExitBarrierRace()

    def feed(self, data: bytes) -> list[bytes]:
        return self._race.feed(self._lines.feed(data))

    def close(self) -> list[bytes]:
        return self._race.feed(self._lines.close()) + self._race.close()


# ---------------------------------------------------------------------------------------------
# Launcher variables

#: torchrun (and accelerate launch, which runs it) set these per process; the PyTorchJob
#: operator sets MASTER_ADDR/PORT, WORLD_SIZE and RANK (the *node* rank) per pod.
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
WORLD_SIZE = "WORLD_SIZE"
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
#: torchrun's agent, set on the workers it starts.
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
#: The agent's own rank among the agents (the node rank under the static rendezvous).
GROUP_RANK = "GROUP_RANK"
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
#: torchrun's ``--tee`` and ``--log-dir``, read from its environment, and the name of its line
#: prefix's template there (``--log-line-prefix-template``).
PET_TEE, PET_LOG_DIR = "PET_TEE", "PET_LOG_DIR"
TORCHRUN_PREFIX_TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
#: torchrun's own settings, read from ``PET_<OPTION>``: the PyTorchJob operator sets the first
#: three beside the master's; Kubeflow Trainer v2 sets only these five.
PET_NNODES = "PET_NNODES"
PET_NODE_RANK = "PET_NODE_RANK"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"
#: An elastic PyTorchJob (Workers only): the c10d rendezvous instead of a master.
PET_RDZV_BACKEND = "PET_RDZV_BACKEND"
PET_RDZV_ENDPOINT = "PET_RDZV_ENDPOINT"
PET_MAX_RESTARTS = "PET_MAX_RESTARTS"

#: Trainer v2's torch plugin injects exactly these and nothing else.
TRAINJOB_VARS = (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT)
#: Every variable a launcher may set; a process started outside one must not inherit them.
LAUNCHER_VARS = (
    MASTER_ADDR,
    MASTER_PORT,
    WORLD_SIZE,
    RANK,
    LOCAL_RANK,
    LOCAL_WORLD_SIZE,
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
)
LAUNCHER_PREFIXES = ("PET_", "TORCHELASTIC_")

#: The trainer's own knobs in its environment.
#: Set by the torchrun re-launch: each worker appends its exit code here.
EXIT_FILE_ENV = "DDPJOB_EXIT_FILE"
#: Under torchrun, how long (seconds) the group may take to form once the agents have met.
JOIN_TIMEOUT_ENV = "DDPJOB_JOIN_TIMEOUT_S"
#: The pods' termination grace period (seconds), rendered by the controller from the spec's
#: ``grace_period_s``: the trainer warns once when a checkpoint write takes longer.
GRACE_PERIOD_ENV = "DDPJOB_GRACE_PERIOD_S"
#: When the container's first process started (epoch seconds): set by the torchrun re-launch,
#: so the workers' ledger counts start-up from the container's start, not their own.
LAUNCHED_AT_ENV = "DDPJOB_LAUNCHED_AT"
#: Which code ran, where the job shipped a working directory (controller/render/workdir.py):
#: the archive's digest and, inside git, its commit and "true"/"false" for a dirty tree. The
#: goodput ledger reports them.
WORKDIR_DIGEST_ENV = "DDPJOB_WORKDIR_DIGEST"
WORKDIR_COMMIT_ENV = "DDPJOB_WORKDIR_COMMIT"
WORKDIR_DIRTY_ENV = "DDPJOB_WORKDIR_DIRTY"
#: Kubernetes' ``terminationGracePeriodSeconds`` when a pod sets none.
KUBERNETES_DEFAULT_GRACE_PERIOD_S = 30
#: The pod's node (``spec.nodeName``, through the downward API: controller/render/pod.py), which
#: ``stuck`` and ``straggler`` events name.
NODE_NAME_ENV = "NODE_NAME"
#: The job as the controller rendered it (controller/render/pod.py): its name, its namespace
#: (the downward API's), its API (``pytorchjob`` or ``trainjob``) and image. The Prometheus
#: labels and the MLflow run's tags and name read them.
JOB_NAME_ENV = "DDPJOB_JOB_NAME"
NAMESPACE_ENV = "DDPJOB_NAMESPACE"
JOB_API_ENV = "DDPJOB_JOB_API"
IMAGE_ENV = "DDPJOB_IMAGE"
#: Set by a launcher that serves its torchrun workers' Prometheus metrics: the folder they write
#: their values to (the client's multiprocess mode reads ``PROMETHEUS_MULTIPROC_DIR``).
METRICS_DIR_ENV = "DDPJOB_METRICS_DIR"
PROMETHEUS_MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
#: MLflow's own variables (its client reads the same): where to track, and in which experiment.
MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
MLFLOW_EXPERIMENT_NAME = "MLFLOW_EXPERIMENT_NAME"

# ---------------------------------------------------------------------------------------------
# What the trainer writes on its job (trainer/health/nodes.py), read by ``status``

#: The job's annotation holding the faults its ranks had, by node: a JSON list of ``{"node",
#: "rank", "pod", "cause", "at", "run"}``, oldest first (at most NODE_FAULTS_KEPT).
NODE_FAULTS_ANNOTATION = "ddpjob.io/node-faults"
NODE_FAULTS_KEPT = 64
#: The job's annotation naming the nodes its next pods avoid (a JSON list), beside the node
#: affinity that does it.
AVOIDED_NODES_ANNOTATION = "ddpjob.io/avoided-nodes"


def read_node_faults(job: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The faults recorded on ``job`` and the nodes its pods avoid (each empty when its
    annotation is missing or not a list of what it should hold)."""
    annotations = job.get("metadata", {}).get("annotations") or {}
    out: list[list[Any]] = []
    for key, kind in ((NODE_FAULTS_ANNOTATION, dict), (AVOIDED_NODES_ANNOTATION, str)):
        try:
            value = json.loads(annotations.get(key) or "[]")
        except ValueError:
            value = []
        out.append([v for v in value if isinstance(v, kind)] if isinstance(value, list) else [])
    return out[0], out[1]


def without_launcher(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` minus every launcher variable (for a process that is to start a job)."""
    return {
        k: v
        for k, v in environ.items()
        if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)
    }
