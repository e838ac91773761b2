"""Which launcher started this process, and the torchrun command that re-launches it: read from
the environment only, with no torch import, so a pod's first process (which only decides and
re-launches) neither pays for importing torch nor holds it in memory while its workers train.

Four launchers, one contract (see docs/architecture.md, "The launcher contracts"):

- nothing at all: one process, world size 1, no process group;
- torchrun (or ``accelerate launch --multi_gpu``, which runs torchrun): RANK, LOCAL_RANK,
  WORLD_SIZE, MASTER_ADDR/PORT are set per process;
- the Kubeflow PyTorchJob operator: RANK is the *node* rank, WORLD_SIZE = nodes x nproc, and
  LOCAL_RANK is not set. With one process per pod that is already a complete description; with
  ``PET_NPROC_PER_NODE`` > 1, ``trainer.__main__`` re-launches itself under torchrun, which then
  sets the per-process variables. Elastic jobs (``PET_RDZV_ENDPOINT``) always go through torchrun;
- a Kubeflow Trainer v2 TrainJob (torch-distributed runtime): only ``PET_NNODES``,
  ``PET_NPROC_PER_NODE`` (a count or ``auto``), ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and
  ``PET_MASTER_PORT``, and no torchrun started. With one process per pod, the node rank is the
  process's rank: it takes RANK, WORLD_SIZE and MASTER_ADDR/PORT from them and runs as a
  PyTorchJob pod of one process does. With more (or ``auto``), only torchrun turns node ranks
  into global ranks, and the trainer re-launches itself under it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, NoReturn, TextIO

from trainer.config import ConfigError, TrainConfig
from trainer.contract import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_FILE_ENV,
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    EXIT_STALE_RENDEZVOUS,
    LAUNCHED_AT_ENV,
    LOCAL_RANK,
    MASTER_ADDR,
    MASTER_PORT,
    PET_MASTER_ADDR,
    PET_MASTER_PORT,
    PET_NNODES,
    PET_NODE_RANK,
    PET_NPROC_PER_NODE,
    PET_RDZV_ENDPOINT,
    RANK,
    TORCHELASTIC_RESTART_COUNT,
    TORCHRUN_PIECE_PREFIX,
    WORLD_SIZE,
    TorchrunLines,
)

# Values of nprocPerNode that torchrun resolves itself (e.g. "gpu" = one process per GPU).
_SYMBOLIC_NPROC = ("auto", "gpu", "cpu", "xpu")

#: How long the re-launch waits, once torchrun has exited, for the last lines of its streams.
PUMP_JOIN_S = 10.0

#: How many times in a row a pod's launcher starts torchrun, as long as its workers find the
#: rendezvous they were started from already over (``EXIT_STALE_RENDEZVOUS``); after that it
#: exits 138 and the container restarts.
RENDEZVOUS_ATTEMPTS = 5


def nproc_per_node_from_env() -> str:
    """The operator's ``PET_NPROC_PER_NODE`` ("1" when absent): a count or a torchrun keyword."""
    return os.environ.get(PET_NPROC_PER_NODE, "").strip() or "1"


def needs_torchrun() -> bool:
    """True inside a Kubeflow pod whose processes only torchrun can start or place in the job.

    torchrun sets LOCAL_RANK on each worker, so its children never re-launch again.
    """
    if LOCAL_RANK in os.environ:
        return False
    if elastic():
        # Only torchrun speaks the c10d rendezvous, even for one process per pod.
        return True
    nproc = nproc_per_node_from_env()
    if trainjob():
        # Only torchrun turns a TrainJob's node rank into the global ranks of several processes;
        # the one process of a pod takes its node's place itself (take_trainjob_place).
        return nproc != "1"
    return int(nproc) > 1 if nproc.isdigit() else nproc in _SYMBOLIC_NPROC


def take_trainjob_place() -> None:
    """In a TrainJob pod of one process, which no torchrun starts: set what a PyTorchJob pod of
    one process is given (RANK, WORLD_SIZE, MASTER_ADDR/PORT) from Trainer v2's variables (the
    node rank, the node count, the master's). Anywhere else: nothing."""
    if LOCAL_RANK in os.environ or not trainjob() or needs_torchrun():
        return
    os.environ.update(
        {
            RANK: _env_first(PET_NODE_RANK, default="0"),
            WORLD_SIZE: _env_first(PET_NNODES, default="1"),
            MASTER_ADDR: _env_first(PET_MASTER_ADDR, default="127.0.0.1"),
            MASTER_PORT: _env_first(PET_MASTER_PORT, default="29500"),
        }
    )


def elastic() -> bool:
    """An elastic PyTorchJob: the operator sets ``PET_RDZV_ENDPOINT`` and no master replica."""
    return bool(os.environ.get(PET_RDZV_ENDPOINT))


def trainjob() -> bool:
    """A Kubeflow Trainer v2 TrainJob pod: ``PET_MASTER_ADDR`` and no ``WORLD_SIZE`` (the
    PyTorchJob operator sets ``MASTER_ADDR`` and ``WORLD_SIZE`` instead)."""
    return bool(os.environ.get(PET_MASTER_ADDR)) and WORLD_SIZE not in os.environ


def hosts_rank0() -> bool:
    """True in the pod whose torchrun starts global rank 0: node rank 0 of a static job (a
    PyTorchJob's ``RANK``, a TrainJob's ``PET_NODE_RANK``). An elastic job's rendezvous
    decides where rank 0 runs, after this: False."""
    return not elastic() and _env_first(PET_NODE_RANK, RANK, default="0") == "0"


def _env_first(*names: str, default: str) -> str:
    """The first of ``names`` set to something non-empty, else ``default``."""
    return next((os.environ[n] for n in names if os.environ.get(n)), default)


def torchrun_argv(trainer_args: list[str], log_dir: str) -> list[str]:
    """The torchrun command that turns this pod into ``PET_NPROC_PER_NODE`` trainer processes.

    The launcher's variables are passed explicitly: the PyTorchJob operator sets the master as
    MASTER_ADDR/MASTER_PORT and the node rank also as RANK; a TrainJob sets only the ``PET_*``
    names (which torchrun would read by itself). ``auto`` is torchrun's: one process per GPU,
    or per CPU this process may run on when there is none. Each worker's output goes to its
    own files under ``log_dir`` and from there, a piece at a time after the worker's rank, to
    torchrun's streams (``--tee``), which :func:`relaunch_under_torchrun` makes whole lines of.
    """
    run = [sys.executable, "-m", "torch.distributed.run", *_output_args(log_dir)]
    if elastic():
        # torchrun reads its elastic settings from the operator's PET_* variables itself:
        # PET_NNODES (min:max), PET_RDZV_BACKEND, PET_RDZV_ENDPOINT, PET_NPROC_PER_NODE,
        # PET_MAX_RESTARTS. Nothing to translate.
        return [*run, "-m", "trainer", *trainer_args]
    return [
        *run,
        "--nnodes",
        _env_first(PET_NNODES, default="1"),
        "--node-rank",
        _env_first(PET_NODE_RANK, RANK, default="0"),
        "--nproc-per-node",
        nproc_per_node_from_env(),
        "--master-addr",
        _env_first(MASTER_ADDR, PET_MASTER_ADDR, default="127.0.0.1"),
        "--master-port",
        _env_first(MASTER_PORT, PET_MASTER_PORT, default="29500"),
        "-m",
        "trainer",
        *trainer_args,
    ]


def _output_args(log_dir: str) -> list[str]:
    """Every worker's stdout and stderr teed through files (``--tee 3``), each piece torchrun
    copies named by the worker's global rank (``contract.TORCHRUN_PIECE_PREFIX``)."""
    return ["--tee", "3", "--log-dir", log_dir, "--log-line-prefix-template", TORCHRUN_PIECE_PREFIX]


def under_own_static_torchrun() -> bool:
    """True in a worker of the torchrun this pod's launcher started with the static rendezvous
    (:func:`torchrun_argv` for anything but an elastic job): the only torchrun that is given
    ``EXIT_FILE_ENV``, and the one that starts again on ``EXIT_STALE_RENDEZVOUS``."""
    return bool(os.environ.get(EXIT_FILE_ENV)) and not elastic()


def rendezvous_was_stale(worker_codes: list[int]) -> bool:
    """True when torchrun ended because its workers found their rendezvous already over (every
    code the workers recorded says so): starting torchrun again joins the current one."""
    return bool(worker_codes) and all(c == EXIT_STALE_RENDEZVOUS for c in worker_codes)


def record_exit(code: int) -> int:
    """Tell a re-launching parent (if any) how this worker ended; returns ``code``.

    torchrun reports any worker failure as 1, and the operator must still see 138/143 as
    retryable, so each worker appends its code to the file ``EXIT_FILE_ENV`` names."""
    path = os.environ.get(EXIT_FILE_ENV)
    if path and code != 0:  # success needs no word
        with contextlib.suppress(OSError), open(path, "a") as f:
            f.write(f"{code}\n")
    return code


def config_problems_file(exit_file: str) -> Path:
    """Where the workers of a re-launch write what is wrong with the configuration: beside the
    exit codes, for the re-launching parent to say once."""
    return Path(exit_file + ".config")


def record_config_problems(problems: list[str]) -> bool:
    """Hand a ConfigError's lines to a re-launching parent, if any; True when one will say them.

    Every worker finds the same mistake, and torchrun stops the others once the first exits:
    local rank 0 may be stopped before it can print, so the parent, which outlives them all,
    says it."""
    path = os.environ.get(EXIT_FILE_ENV)
    if not path:
        return False
    try:
        with open(config_problems_file(path), "a") as f:
            f.write("".join(f"{line}\n" for line in problems))
    except OSError:
        return False
    return True


def _say_config_problems(exit_file: Path) -> None:
    """Print, once each and in the order first written, the lines the workers recorded."""
    path = config_problems_file(str(exit_file))
    try:
        lines = path.read_text().splitlines()
        path.unlink()
    except OSError:
        return
    for line in dict.fromkeys(lines):
        print(line, file=sys.stderr, flush=True)


_IMPORTED_AT = time.time()


def process_started_at() -> float:
    """When this process started, in epoch seconds: from ``/proc`` (10 ms), else when this module
    was imported."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rpartition(")")[2].split()
        start_ticks = int(after_name[19])  # field 22 of proc(5); the fields after comm start at 3
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return time.time() - (uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


def launched_at() -> float:
    """When the container started this run: the re-launching parent's start (it exports it), or
    this process's own (no re-launch, or torchrun restarted the workers)."""
    raw = os.environ.get(LAUNCHED_AT_ENV)
    if raw and os.environ.get(TORCHELASTIC_RESTART_COUNT, "0") == "0":
        try:
            return float(raw)
        except ValueError:
            pass
    return process_started_at()


# ---------------------------------------------------------------------------------------------
# The re-launch


def check_before_relaunch(cfg: TrainConfig) -> None:
    """What can be checked without torch fails here, once, before torchrun starts the workers
    (a ConfigError); the task factory's own arguments are the workers' to check."""
    _check_task_module(cfg.task)
    # A named checkpoint is rank 0's to read (the others get its state by broadcast): only its
    # pod may have the volume that holds it (a rank0_only volume).
    named = cfg.resume not in ("auto", "never") and "://" not in cfg.resume
    if named and hosts_rank0() and not Path(cfg.resume).exists():
        raise ConfigError([f"resume: no such checkpoint (got {cfg.resume})"])


#: Tasks the trainer ships (``trainer.tasks.load_task``).
BUILTIN_TASKS = ("vision", "lm")


def _check_task_module(name: str) -> None:
    """A plug-in task's module exists (``importlib.util.find_spec``: nothing of it runs), or a
    ConfigError says so as ``load_task`` would."""
    if name in BUILTIN_TASKS:
        return
    module_name = name.partition(":")[0]
    try:
        found, missing = importlib.util.find_spec(module_name), module_name
    except ModuleNotFoundError as e:  # a parent package is missing
        found, missing = None, e.name
    if found is None:
        raise ConfigError([f"task: cannot import {missing} (got {name}). Is it on PYTHONPATH?"])


def exit_preempted() -> NoReturn:
    """Leave at once with 143 once preempted: the checkpoint is written and fsynced, the group
    torn down and every line flushed. What is left is the interpreter's own teardown of torch,
    which can take seconds on a loaded node; under torchrun the worker and torchrun take theirs
    one after the other, inside the pod's grace period (Kubernetes' default: 30 s), past which
    the kubelet's SIGKILL makes the exit 137."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_PREEMPTED)


def relaunch_exit_code(rc: int, worker_codes: list[int]) -> int:
    """The pod's exit code after torchrun: a worker's real failure beats a retryable one (the
    peers of a crashed rank only lost a peer), and a retryable one beats torchrun's plain 1. A
    rendezvous still stale after the last attempt is a lost peer to the operator."""
    if rc == 0:
        return 0
    permanent = [c for c in worker_codes if c in (EXIT_FAILED, EXIT_CONFIG)]
    if permanent:
        return permanent[0]
    if worker_codes:
        return EXIT_PEER_LOST if worker_codes[0] == EXIT_STALE_RENDEZVOUS else worker_codes[0]
    return rc


def relaunch_under_torchrun(argv: list[str], worker_env: dict[str, str] | None = None) -> int:
    """Run this same command as ``PET_NPROC_PER_NODE`` processes under the real torchrun, with
    ``worker_env`` added to their environment (where this process serves their Prometheus
    metrics: it outlives them, torchrun's restarts included).

    SIGTERM/SIGINT are forwarded (torchrun passes them on to the workers, which checkpoint and
    exit 143). torchrun itself reports a signalled shutdown as a plain failure, so a forwarded
    SIGTERM followed by a non-zero exit is reported as 143: retryable, as preemption should be.
    When the workers found the rendezvous they were started from already over
    (``EXIT_STALE_RENDEZVOUS``, see ``trainer.distributed._join_watchdog``), torchrun starts
    again here, at once, instead of the container restarting.

    The node's processes share the pod's stdout and stderr; each of their lines reaches them
    whole, after the process's global rank (``[rank 3] ...``), however the process wrote it
    (an unbuffered ``print`` writes its arguments one at a time): torchrun tees each worker's
    streams through files of its own (removed at the end) and this process puts the pieces
    back together (``contract.TorchrunLines``, which also says in one line what torch prints as
    a traceback when an agent finds the agents' store closed in torchrun's exit barrier).
    """
    log_dir = tempfile.mkdtemp(prefix="ddpjob-torchrun-")
    try:
        rc, codes, received = _run_torchrun(argv, log_dir, worker_env or {})
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    if rc != 0 and signal.SIGTERM in received:
        exit_preempted()
    rc = rc if rc >= 0 else 128 - rc  # killed by a signal: the shell's convention
    return relaunch_exit_code(rc, codes)


def _run_torchrun(
    argv: list[str], log_dir: str, worker_env: dict[str, str]
) -> tuple[int, list[int], list[int]]:
    """torchrun, started again while its workers find their rendezvous over: its exit code, the
    codes its workers recorded and the signals this process forwarded to it."""
    exit_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"ddpjob-exit-{os.getpid()}"
    # The workers' ledger counts start-up from the container's start (this process's), not theirs.
    launched = {LAUNCHED_AT_ENV: repr(process_started_at()), **worker_env}
    received: list[int] = []
    proc: subprocess.Popen | None = None

    def forward(signum: int, frame) -> None:
        received.append(signum)
        if proc is not None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for attempt in range(1, RENDEZVOUS_ATTEMPTS + 1):
        exit_file.unlink(missing_ok=True)
        config_problems_file(str(exit_file)).unlink(missing_ok=True)
        env = {**os.environ, EXIT_FILE_ENV: str(exit_file), **launched}
        proc = subprocess.Popen(
            torchrun_argv(argv, log_dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        pumps = [_pump(proc.stdout, sys.stdout), _pump(proc.stderr, sys.stderr)]
        rc = proc.wait()
        for pump in pumps:
            pump.join(PUMP_JOIN_S)  # the last lines; a worker left behind holds no pipe of ours
        try:
            codes = [int(line) for line in exit_file.read_text().split()]
            exit_file.unlink()
        except (OSError, ValueError):
            codes = []
        _say_config_problems(exit_file)
        if received or not rendezvous_was_stale(codes) or attempt == RENDEZVOUS_ATTEMPTS:
            break
        print(
            f"torchrun's workers found their rendezvous already over; starting torchrun again "
            f"(attempt {attempt + 1} of {RENDEZVOUS_ATTEMPTS})",
            file=sys.stderr,
            flush=True,
        )
    return rc, codes, received


def _pump(source: IO[bytes], sink: TextIO) -> threading.Thread:
    """A thread that copies torchrun's ``source`` to ``sink`` in whole lines, each named by its
    process's rank."""

    def copy() -> None:
        lines, fd = TorchrunLines(), source.fileno()
        while data := os.read(fd, 1 << 16):
            _write(sink, lines.feed(data))
        _write(sink, lines.close())
        source.close()

    thread = threading.Thread(target=copy, name="ddpjob-lines", daemon=True)
    thread.start()
    return thread


def _write(sink: TextIO, lines: list[bytes]) -> None:
    if lines:
        sink.flush()  # what this process printed itself comes first
        sink.buffer.write(b"".join(lines))
        sink.buffer.flush()
