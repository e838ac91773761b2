"""``run SPEC --local``: the job on this machine, one process per node, with the operator's env.

Each node is ``python -m trainer <args>`` (or the spec's command) started in its own process
group with exactly what the job's operator injects into a pod, plus the spec's env:

- PyTorchJob (training operator v1): MASTER_ADDR=127.0.0.1, a free MASTER_PORT, RANK = node
  rank, WORLD_SIZE = nodes x nproc_per_node, PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE,
  PYTHONUNBUFFERED;
- TrainJob (Trainer v2's torch plugin): only PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
  PET_MASTER_ADDR=127.0.0.1 and a free PET_MASTER_PORT, and PYTHONUNBUFFERED=1 (which render
  puts first in the TrainJob's env).

With nproc_per_node > 1 (and always in a TrainJob) the trainer re-launches itself under
torchrun, as it does in a pod. The command finds the executables the
image would have (``torchrun``, other console scripts of this environment): this interpreter's
own bin directory comes first on PATH, as if its virtualenv were activated.

Rank 0's output drives the progress bar; every node's output is kept in
``runs/<name>/logs/rank-<node>.log``, in whole lines. Where a node runs several processes under
torchrun (the trainer's re-launch, or a spec's own ``torchrun`` command), each line is named by
its process's global rank (``[rank 3] ...``) however the process wrote it: the node's torchrun
tees every worker's output (``PET_TEE``, its files under ``runs/<name>/logs/torchrun-<node>``),
a piece at a time after the worker's rank, and the pieces are put back together here
(``trainer.contract.TorchrunLines``). The first node to exit non-zero fails the job: the others
get SIGTERM (what the kubelet sends), then SIGKILL to their whole process group after the grace
period, and the failing node's exit code and last lines are printed. Ctrl-C or SIGTERM stops
every node the same way (a second Ctrl-C kills at once).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from controller.errors import JobFailed, UserError
from controller.kubeflow import (
    DEFAULT_COMMAND,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_NNODES,
    ENV_NODE_RANK,
    ENV_NPROC_PER_NODE,
)
from controller.progress import Progress
from controller.render.args import trainer_args
from controller.render.trainjob import UNBUFFERED
from controller.spec import JobSpec
from trainer import contract

TAIL_LINES = 20


@dataclass
class Node:
    """One local "pod": its process, its log file and how it ended."""

    index: int
    proc: subprocess.Popen
    log_path: Path
    log: IO[bytes]
    exit_code: int | None = None
    ended_s: float | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    lock: threading.Lock = field(default_factory=threading.Lock)  # its stdout's and stderr's


def torchrun_output_env(logs: Path, node: int) -> dict[str, str]:
    """What makes a torchrun that a node starts tee each worker's output, a piece at a time
    after the worker's global rank (``contract.TORCHRUN_PIECE_PREFIX``), its files beside the
    node's log. (The trainer's own re-launch passes the same as arguments.)"""
    return {
        contract.PET_TEE: "3",
        contract.PET_LOG_DIR: str(logs / f"torchrun-{node}"),
        contract.TORCHRUN_PREFIX_TEMPLATE_ENV: contract.TORCHRUN_PIECE_PREFIX,
    }


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the master binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def operator_env(spec: JobSpec, node: int, master_port: int) -> dict[str, str]:
    """What the job's operator injects into the pod of ``node``, the master on 127.0.0.1.

    A fixed-size PyTorchJob has a Master, and each pod learns its rank from the env. An elastic
    job has Workers only: the operator gives each the c10d rendezvous (worker 0's address) and
    the min:max node range, and torchrun assigns ranks as pods join. A TrainJob gets Trainer
    v2's five ``PET_*`` variables and nothing else (no MASTER_ADDR, RANK or WORLD_SIZE).
    """
    if spec.api == "trainjob":
        return {
            UNBUFFERED["name"]: UNBUFFERED["value"],
            ENV_NNODES: str(spec.nodes),
            ENV_NPROC_PER_NODE: str(spec.nproc_per_node),
            ENV_NODE_RANK: str(node),
            ENV_MASTER_ADDR: "127.0.0.1",  # <name>-node-0-0.<name> on a cluster
            ENV_MASTER_PORT: str(master_port),
        }
    if spec.elastic:
        return {
            "PYTHONUNBUFFERED": "0",
            contract.PET_RDZV_BACKEND: "c10d",
            contract.PET_RDZV_ENDPOINT: f"127.0.0.1:{master_port}",  # <name>-worker-0 on a cluster
            contract.PET_NNODES: f"{spec.elastic.min_nodes}:{spec.elastic.max_nodes}",
            contract.PET_MAX_RESTARTS: str(spec.elastic.max_restarts),
            contract.PET_NPROC_PER_NODE: str(spec.nproc_per_node),
        }
    return {
        # The operator sets "0"; any non-empty value turns buffering off in Python.
        "PYTHONUNBUFFERED": "0",
        contract.MASTER_PORT: str(master_port),
        contract.MASTER_ADDR: "127.0.0.1",  # <name>-master-0 on a cluster
        contract.WORLD_SIZE: str(spec.world_size),
        contract.RANK: str(node),
        contract.PET_NNODES: str(spec.nodes),
        contract.PET_NODE_RANK: str(node),
        contract.PET_NPROC_PER_NODE: str(spec.nproc_per_node),
    }


def spec_env(spec: JobSpec, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The spec's env, and its secret_env read from the caller's environment (or UserError)."""
    environ = os.environ if environ is None else environ
    env = dict(spec.env)
    missing = []
    for name, ref in spec.secret_env.items():
        if name in environ:
            env[name] = environ[name]
        else:
            missing.append(
                f"secret_env.{name}: Secret {ref.secret}/{ref.key} cannot be read locally; "
                f"export {name}=... to run --local"
            )
    if missing:
        raise UserError(missing)
    return env


def grace_s_of(spec: JobSpec, grace_s: float | None) -> float:
    """Seconds between SIGTERM and SIGKILL when a run stops: ``--grace-s``, else the spec's
    ``grace_period_s``, else Kubernetes' default, as a pod gets."""
    if grace_s is not None:
        return grace_s
    return float(spec.grace_period_s or contract.KUBERNETES_DEFAULT_GRACE_PERIOD_S)


def node_env(spec: JobSpec, grace_s: float) -> dict[str, str]:
    """What a node gets beside the launcher's variables: the job's name, API and image (what a
    pod's env says of its job: the MLflow run's name and tags, the metrics' labels; the spec's
    env may set its own), the spec's env and secrets (:func:`spec_env`) and the grace period it
    runs under, for the trainer to measure its checkpoint writes against, as a pod's
    ``DDPJOB_GRACE_PERIOD_S``."""
    job = {
        contract.JOB_NAME_ENV: spec.name,
        contract.JOB_API_ENV: spec.api,
        contract.IMAGE_ENV: spec.image,
    }
    return {**job, **spec_env(spec), contract.GRACE_PERIOD_ENV: f"{grace_s:g}"}


def node_path(environ: dict[str, str] | None = None) -> str:
    """PATH for a node: this interpreter's bin directory first (its venv's console scripts,
    ``torchrun`` among them, as the image has them on PATH), then the caller's PATH."""
    environ = os.environ if environ is None else environ
    here = str(Path(sys.executable).parent)  # not resolved: a venv's python is a symlink
    rest = [p for p in environ.get("PATH", os.defpath).split(os.pathsep) if p and p != here]
    return os.pathsep.join([here, *rest])


@dataclass(frozen=True)
class LocalWorkdir:
    """A shipped workdir unpacked on this machine: the nodes' working directory and the head of
    their PYTHONPATH, as ``/workdir`` is a pod's (``shipped``: its digest and git state)."""

    path: Path
    shipped: Any  # controller.workdir.Shipped

    def env(self, spec: JobSpec, at: str | None = None) -> dict[str, str]:
        """PYTHONPATH and the ``DDPJOB_WORKDIR_*`` variables, as render gives a pod (``at``:
        where the node sees the folder, default :attr:`path`)."""
        from controller.render.workdir import env

        user = [{"name": k, "value": v} for k, v in spec.env.items() if k == "PYTHONPATH"]
        entries = env(self.shipped, user, path=at or str(self.path))
        return {e["name"]: e["value"] for e in entries}


def node_command(spec: JobSpec) -> list[str]:
    """The container's command + args, with this interpreter standing in for ``python``."""
    command = list(spec.command or DEFAULT_COMMAND)
    if command[0] in ("python", "python3"):
        command[0] = sys.executable
    args = spec.args if spec.args is not None else trainer_args(spec.trainer)
    return [*command, *args]


def run_local(
    spec: JobSpec,
    *,
    logs_dir: str | Path | None = None,
    grace_s: float | None = None,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    workdir: LocalWorkdir | None = None,
) -> int:
    """Run ``spec`` here; 0 when every node exits 0, 128+signal when stopped, JobFailed else.
    ``grace_s``: between SIGTERM and SIGKILL (default: :func:`grace_s_of`). ``workdir``: the
    nodes run in it, as a pod runs in its unpacked /workdir."""
    out = out or sys.stdout
    err = err or sys.stderr
    grace_s = grace_s_of(spec, grace_s)
    extra_env = node_env(spec, grace_s)
    if workdir is not None:
        extra_env.update(workdir.env(spec))
    logs = Path(logs_dir) if logs_dir else Path("runs") / spec.name / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = node_command(spec)
    say = _sayer(err)
    say(
        f"run --local {spec.name}: {spec.nodes} node(s) x {spec.nproc_per_node} process(es), "
        f"world size {spec.world_size}, master 127.0.0.1:{port}"
    )
    say(f"logs: {logs}/rank-{{0..{spec.nodes - 1}}}.log")

    runner = _Runner(spec, command, extra_env, port, logs.absolute(), Progress(out))
    runner.cwd = workdir.path if workdir is not None else None
    with _signals_to(runner):
        runner.start()
        runner.wait(grace_s)
    return runner.outcome(say)


class _Runner:
    """Starts the nodes, watches them, stops them; all state of one local run."""

    def __init__(
        self,
        spec: JobSpec,
        command: list[str],
        extra_env: dict[str, str],
        port: int,
        logs: Path,
        progress: Progress,
    ):
        self.spec, self.command, self.extra_env = spec, command, extra_env
        self.port, self.logs, self.progress = port, logs, progress
        self.nodes: list[Node] = []
        self.ended: queue.Queue[int] = queue.Queue()
        self.threads: list[threading.Thread] = []
        self.signalled: int | None = None  # SIGINT/SIGTERM received by us
        self.failed: Node | None = None  # the first node to fail on its own
        self.started_s = time.monotonic()
        self.cwd: Path | None = None  # the nodes' working directory (None: ours)

    # -- start -------------------------------------------------------------------------------

    def start(self) -> None:
        # Launcher variables a caller's shell may carry (e.g. run inside torchrun) would
        # confuse the trainer's launcher detection: the children never inherit them.
        base = contract.without_launcher(dict(os.environ))
        base["PATH"] = node_path()
        for index in range(self.spec.nodes):
            env = {
                **base,
                **operator_env(self.spec, index, self.port),
                **torchrun_output_env(self.logs, index),
                **self.extra_env,
            }
            log_path = self.logs / f"rank-{index}.log"
            log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
            try:
                proc = subprocess.Popen(
                    self.command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    cwd=self.cwd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # its own process group: Ctrl-C reaches us, not it
                )
            except OSError as e:
                log.close()
                self._kill()
                raise UserError(
                    f"command: cannot start {self.command[0]!r} ({e.strerror}; searched "
                    f"{Path(sys.executable).parent} first, then PATH). Check the spec's command"
                ) from None
            node = Node(index, proc, log_path, log)
            self.nodes.append(node)
            self._thread(self._watch, node)
            self._thread(self._pump, node, proc.stdout)
            self._thread(self._pump, node, proc.stderr)

    def _thread(self, target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def _watch(self, node: Node) -> None:
        node.exit_code = _exit_code(node.proc.wait())
        node.ended_s = time.monotonic() - self.started_s
        self.ended.put(node.index)

    def _pump(self, node: Node, stream: IO[bytes]) -> None:
        """One of the node's streams into its log, in whole lines named by rank; rank 0's node's
        also to the console (the progress)."""
        lines, fd = contract.TorchrunLines(), stream.fileno()
        while data := os.read(fd, 1 << 16):
            self._keep(node, lines.feed(data))
        self._keep(node, lines.close())
        stream.close()

    def _keep(self, node: Node, lines: list[bytes]) -> None:
        if not lines:
            return
        with node.lock:
            node.log.write(b"".join(lines))
            node.log.flush()
            if node.index == 0:
                for raw in lines:
                    line = raw.decode("utf-8", errors="replace")
                    node.tail.append(line.rstrip("\n"))
                    self.progress.feed(line)

    # -- watch and stop ----------------------------------------------------------------------

    def wait(self, grace_s: float) -> None:
        """Until every node has ended; the first failure or a signal stops the rest."""
        running = len(self.nodes)
        stop_deadline: float | None = None
        killed = False
        while running:
            try:
                index = self.ended.get(timeout=0.1)
            except queue.Empty:
                index = None
            if index is not None:
                running -= 1
                node = self.nodes[index]
                stopping = stop_deadline is not None
                if node.exit_code and not stopping and self.failed is None:
                    self.failed = node
            if stop_deadline is None and (self.failed or self.signalled):
                self._terminate()
                stop_deadline = time.monotonic() + grace_s
            if (
                stop_deadline is not None
                and not killed
                and (time.monotonic() >= stop_deadline or self.signalled == -1)
            ):
                self._kill()
                killed = True
        for t in self.threads:
            t.join(timeout=5)
        self.progress.close()
        for node in self.nodes:
            node.log.close()

    def _terminate(self) -> None:
        # SIGTERM to the node's main process only, as the kubelet sends it to the container.
        for node in self.nodes:
            if node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    node.proc.send_signal(signal.SIGTERM)

    def _kill(self) -> None:
        # SIGKILL to the whole group, as the runtime kills the container with its children.
        for node in self.nodes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.proc.pid, signal.SIGKILL)

    def on_signal(self, signum: int, frame: Any) -> None:
        # The first Ctrl-C stops gracefully; a second one kills at once.
        self.signalled = -1 if self.signalled else signum

    # -- report ------------------------------------------------------------------------------

    def outcome(self, say: Any) -> int:
        codes = ", ".join(f"{n.index}: {n.exit_code}" for n in self.nodes)
        if self.failed is not None:
            node = self.failed
            tail = list(node.tail) if node.index == 0 else _tail(node.log_path)
            lines = [
                f"rank {node.index} exited with code {node.exit_code}"
                f"{_signal_note(node.exit_code)} after {node.ended_s:.1f}s; stopped the "
                f"other ranks (exit codes {codes})",
                f"last lines of {node.log_path}:",
                *(f"    {line}" for line in tail),
            ]
            raise JobFailed("\n".join(lines))
        if self.signalled:
            signum = signal.SIGINT if self.signalled == -1 else self.signalled
            say(f"stopped by {signal.Signals(signum).name}; exit codes {codes}")
            return 128 + signum
        elapsed = time.monotonic() - self.started_s
        say(f"job succeeded in {elapsed:.1f}s: {len(self.nodes)} node(s) exited 0")
        return 0


@contextlib.contextmanager
def _signals_to(runner: _Runner):
    """Route SIGINT/SIGTERM to the runner while it runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, runner.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _exit_code(returncode: int) -> int:
    # Popen reports death by signal N as -N; shells and Kubernetes say 128 + N.
    return 128 - returncode if returncode < 0 else returncode


def _signal_note(code: int | None) -> str:
    if code is None or code <= 128 or code - 128 not in signal.Signals._value2member_map_:
        return ""
    return f" ({signal.Signals(code - 128).name})"


def _tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return lines[-n:]


def _sayer(err: IO[str]):
    def say(text: str) -> None:
        err.write(text + "\n")
        err.flush()

    return say
