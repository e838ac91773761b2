"""Helpers to run the real trainer as real processes: standalone, torchrun, Kubeflow-style env."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from trainer.contract import parse_event, without_launcher

if TYPE_CHECKING:
    from trainer.train import Trainer

REPO = Path(__file__).resolve().parents[2]
TEST_TASK = "tests.trainer.tasks:build"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank_group(monkeypatch):
    """A 1-rank gloo group: what torchrun or a one-replica PyTorchJob gives a single process."""
    for k, v in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }.items():
        monkeypatch.setenv(k, v)
    from trainer import distributed

    env = distributed.setup("cpu", "gloo", 60)
    try:
        yield env
    finally:
        distributed.teardown()


def base_env(**extra: str) -> dict[str, str]:
    """The parent's env minus any launcher variables, plus ``extra``."""
    env = without_launcher(dict(os.environ))
    env |= {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}
    return env


def trainer_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainer", *args]


def torchrun_cmd(nproc: int, *args: str, python: str = sys.executable) -> list[str]:
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "trainer",
        *args,
    ]


def kubeflow_env(nproc_per_node: int, world_size: int, rank: int = 0) -> dict[str, str]:
    """What the PyTorchJob operator injects into the master pod (no LOCAL_RANK)."""
    return base_env(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        PET_NNODES=str(world_size // nproc_per_node),
        PET_NODE_RANK=str(rank),
        PET_NPROC_PER_NODE=str(nproc_per_node),
    )


# What Kubeflow Trainer v2's torch plugin injects into a TrainJob's `node` container, and nothing
# else: no MASTER_ADDR, RANK, WORLD_SIZE or LOCAL_RANK, and no torchrun started.
TRAINJOB_VARS = {
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
}


def trainjob_envs(nnodes: int, nproc_per_node: str) -> list[dict[str, str]]:
    """The env of each of a TrainJob's ``nnodes`` pods (``PET_MASTER_ADDR`` is rank 0's pod)."""
    port = str(free_port())
    envs = [
        base_env(
            PET_NNODES=str(nnodes),
            PET_NPROC_PER_NODE=nproc_per_node,
            PET_NODE_RANK=str(node),
            PET_MASTER_ADDR="127.0.0.1",
            PET_MASTER_PORT=port,
        )
        for node in range(nnodes)
    ]
    for env in envs:  # exactly the five, nothing else a launcher would set
        launcher = set(env) - set(without_launcher(env))
        assert launcher == TRAINJOB_VARS, launcher
    return envs


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str

    @property
    def events(self) -> list[dict]:
        return parse_events(self.stdout)

    def of(self, name: str) -> list[dict]:
        return [e for e in self.events if e["event"] == name]


def parse_events(stdout: str) -> list[dict]:
    return [e for line in stdout.splitlines() if (e := parse_event(line)) is not None]


def run(
    cmd: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cpus: set[int] | None = None,
) -> Result:
    """Run ``cmd`` to the end; ``cpus`` pins it (and its children) to those CPUs."""
    p = subprocess.run(
        cmd,
        cwd=REPO,
        env=env or base_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    return Result(p.returncode, p.stdout, p.stderr)


#: What :func:`start` started during the current test (stopped after it, see below).
_STARTED: list[subprocess.Popen] = []


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """``python -m trainer args`` started with ``env``, its output piped as text; a test that
    fails before it has waited for the process leaves nothing running (:func:`_stop_started`)."""
    proc = subprocess.Popen(
        trainer_cmd(*args),
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _STARTED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def _stop_started():
    """After each test, what it started and left running (a test that failed mid-run):
    SIGTERM (the trainer checkpoints and passes it on to torchrun's workers), then SIGKILL of it
    and every process below it, found before the SIGTERM (torchrun's workers lead sessions of
    their own: only their parents name them)."""
    yield
    running = [p for p in _STARTED if p.poll() is None]
    _STARTED.clear()
    for proc in running:
        tree: list[psutil.Process] = []
        with contextlib.suppress(psutil.NoSuchProcess):
            tree = psutil.Process(proc.pid).children(recursive=True)
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        for child in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        proc.kill()
        proc.wait()


def run_pods(
    envs: list[dict[str, str]],
    args: list[str],
    timeout: float = 180,
    cwds: list[Path] | None = None,
) -> list[Result]:
    """Start ``python -m trainer args`` once per env, all at once (the pods of one job), each in
    its own working directory if ``cwds`` says so."""
    procs = [
        subprocess.Popen(
            trainer_cmd(*args),
            cwd=cwd,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for env, cwd in zip(envs, cwds or [REPO] * len(envs), strict=True)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        results.append(Result(p.returncode, out, err))
    return results


def follow_pods(
    envs: list[dict[str, str]],
    args: list[str],
    on_event: Callable[[dict[str, Any], list[subprocess.Popen]], None],
    timeout: float = 300,
    started: Callable[[list[subprocess.Popen]], None] | None = None,
) -> list[Result]:
    """As :func:`run_pods`, and each event rank 0's pod (the first) prints is handed to
    ``on_event`` (with the pods' processes) as it comes: a test acts on what the job says.
    ``started`` sees the processes first, as soon as they exist."""
    procs = [
        subprocess.Popen(trainer_cmd(*args), cwd=REPO, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for env in envs
    ]  # fmt: skip
    if started is not None:
        started(procs)
    ends: dict[int, tuple[str, str]] = {}

    def drain(i: int) -> None:
        ends[i] = procs[i].communicate(timeout=timeout)

    drains = [threading.Thread(target=drain, args=(i,)) for i in range(1, len(procs))]
    err0: list[str] = []
    drains.append(threading.Thread(target=lambda: err0.append(procs[0].stderr.read())))
    for t in drains:
        t.start()
    lines = []
    for line in procs[0].stdout:
        lines.append(line)
        event = parse_event(line)
        if event is not None:
            on_event(event, procs)
    procs[0].wait(timeout=timeout)
    for t in drains:
        t.join(timeout=timeout)
    results = [Result(procs[0].returncode, "".join(lines), err0[0])]
    return results + [Result(procs[i].returncode, *ends[i]) for i in range(1, len(procs))]


# These tests mean CPU and gloo: on a GPU host `auto` would put every rank of a one-host job on
# the GPUs (two ranks on one GPU fail under NCCL), and GPU numerics differ from what they pin.
CPU = {"device": "cpu", "backend": "gloo"}


def common_args(tmp: Path, **overrides) -> list[str]:
    """A fast run of the test task on CPU, checkpointing into ``tmp``."""
    args = {
        **CPU,
        "task": TEST_TASK,
        "max_steps": 8,
        "batch_size": 8,
        "log_every": 2,
        "checkpoint.dir": str(tmp / "ckpt"),
        "progress": "never",
        "lr": 0.01,
        "eval_batches": 2,
    }
    args |= overrides
    return [f"{k}={v}" for k, v in args.items()]


def checkpoints(ckpt_dir: Path) -> list[Path]:
    """The step directories in a local ``checkpoint.dir``, oldest first."""
    return sorted(p for p in ckpt_dir.glob("step_*") if p.is_dir())


def read_checkpoint(path: Path) -> dict:
    """A checkpoint's state (a step directory, checked against its manifest, or a .pt file)."""
    from trainer.checkpoint.manager import read_path

    return read_path(str(path))


@pytest.fixture(scope="session")
def moto():
    """moto's S3 server, one for the session (tests/trainer/s3.py)."""
    from tests.trainer.s3 import MotoServer

    with MotoServer() as server:
        yield server


@pytest.fixture
def s3(moto, monkeypatch) -> str:
    """A new bucket on moto's server, and this process's environment pointed at the server:
    the bucket's ``s3://`` URL."""
    for name, value in moto.env.items():
        monkeypatch.setenv(name, value)
    return moto.create_bucket(f"ckpt-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def ckpt_tmp(tmp_path: Path) -> Path:
    return tmp_path


# What every rank started by ``spawn_ranks`` imports first: torch, torch._dynamo (DDP's
# constructor reads its config), the trainer and these helpers.
_RANK_PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch.distributed.nn.functional",
    "trainer.train",
    __name__,
]


def spawn_ranks(fn: Callable[..., None], args: tuple, nprocs: int = 2) -> None:
    """``mp.spawn(fn, args, nprocs)``, each rank a fresh process forked from a server that has
    imported what every rank imports (forkserver): that server starts once per test process,
    and a rank then starts in a fraction of the seconds the imports take a new interpreter."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(_RANK_PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver")


def one_of_two_ranks(rank: int, port: int, settings: dict[str, Any]) -> Trainer:
    """Rank ``rank`` of a 2-rank gloo group in this process (a worker of ``spawn_ranks``), and its
    Trainer for ``settings``; the caller tears the group down."""
    from trainer import distributed
    from trainer.config import build_config
    from trainer.tasks import load_task
    from trainer.telemetry.events import Reporter
    from trainer.train import Trainer

    os.environ |= {
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    cfg = build_config(settings)
    env = distributed.setup("cpu", "gloo", 60)
    try:
        return Trainer(
            cfg, env, load_task(cfg.task, cfg.task_args), Reporter(False, 0, "never", None)
        )
    except BaseException:
        distributed.teardown()
        raise


def lines_by_rank(lines: list[str], line: re.Pattern[str]) -> dict[int, list[int]]:
    """What each rank printed of ``lines`` that match ``line`` whole: its first group names the
    rank the line is named after, its second the rank that printed it (the same), its third a
    count (the step), gathered by rank. Fails on a line that does not match."""
    whole = [line.fullmatch(x) for x in lines]
    assert all(whole), [x for x, m in zip(lines, whole, strict=True) if not m][:3]
    by_rank: dict[int, list[int]] = {}
    for m in whole:
        assert m[1] == m[2], m[0][:100]  # the name is the rank that printed it
        by_rank.setdefault(int(m[1]), []).append(int(m[3]))
    return by_rank
