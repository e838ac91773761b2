"""Who am I in the job: read the launcher's environment, set up and tear down the process group.

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
  ``PET_MASTER_PORT``, and no torchrun started. Nothing names this process's rank or the world
  size, so the trainer always re-launches itself under torchrun there, even for one process.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job, and the device it trains on."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0 owns stdout events, checkpoints and TensorBoard."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """A process group exists (even of size 1, when a launcher asked for one)."""
        return dist.is_available() and dist.is_initialized()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw not in (None, "") else default


# Values of nprocPerNode that torchrun resolves itself (e.g. "gpu" = one process per GPU).
_SYMBOLIC_NPROC = ("auto", "gpu", "cpu", "xpu")


def nproc_per_node_from_env() -> str:
    """The operator's ``PET_NPROC_PER_NODE`` ("1" when absent): a count or a torchrun keyword."""
    return os.environ.get("PET_NPROC_PER_NODE", "").strip() or "1"


def needs_torchrun() -> bool:
    """True inside a Kubeflow pod whose processes only torchrun can start or place in the job.

    torchrun sets LOCAL_RANK on each worker, so its children never re-launch again.
    """
    if "LOCAL_RANK" in os.environ:
        return False
    if elastic() or trainjob():
        # Only torchrun speaks the c10d rendezvous (elastic), and only torchrun turns a TrainJob's
        # node rank into global ranks: both even for one process per pod.
        return True
    nproc = nproc_per_node_from_env()
    return int(nproc) > 1 if nproc.isdigit() else nproc in _SYMBOLIC_NPROC


def elastic() -> bool:
    """An elastic PyTorchJob: the operator sets ``PET_RDZV_ENDPOINT`` and no master replica."""
    return bool(os.environ.get("PET_RDZV_ENDPOINT"))


def trainjob() -> bool:
    """A Kubeflow Trainer v2 TrainJob pod: ``PET_MASTER_ADDR`` and no ``WORLD_SIZE`` (the
    PyTorchJob operator sets ``MASTER_ADDR`` and ``WORLD_SIZE`` instead)."""
    return bool(os.environ.get("PET_MASTER_ADDR")) and "WORLD_SIZE" not in os.environ


def _env_first(*names: str, default: str) -> str:
    """The first of ``names`` set to something non-empty, else ``default``."""
    return next((os.environ[n] for n in names if os.environ.get(n)), default)


def torchrun_argv(trainer_args: list[str]) -> list[str]:
    """The torchrun command that turns this pod into ``PET_NPROC_PER_NODE`` trainer processes.

    The launcher's variables are passed explicitly: the PyTorchJob operator sets the master as
    MASTER_ADDR/MASTER_PORT and the node rank also as RANK; a TrainJob sets only the ``PET_*``
    names (which torchrun would read by itself). ``auto`` is torchrun's: one process per GPU,
    or per CPU this process may run on when there is none.
    """
    if elastic():
        # torchrun reads its elastic settings from the operator's PET_* variables itself:
        # PET_NNODES (min:max), PET_RDZV_BACKEND, PET_RDZV_ENDPOINT, PET_NPROC_PER_NODE,
        # PET_MAX_RESTARTS. Nothing to translate.
        return [sys.executable, "-m", "torch.distributed.run", "-m", "trainer", *trainer_args]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        _env_first("PET_NNODES", default="1"),
        "--node-rank",
        _env_first("PET_NODE_RANK", "RANK", default="0"),
        "--nproc-per-node",
        nproc_per_node_from_env(),
        "--master-addr",
        _env_first("MASTER_ADDR", "PET_MASTER_ADDR", default="127.0.0.1"),
        "--master-port",
        _env_first("MASTER_PORT", "PET_MASTER_PORT", default="29500"),
        "-m",
        "trainer",
        *trainer_args,
    ]


def setup(device: str = "auto", backend: str = "auto", timeout_s: int = 600) -> DistEnv:
    """Read the launcher's environment, pick the device, and join the process group if any.

    A process group is created whenever a launcher set WORLD_SIZE, even to 1, so the same code
    path (DDP, collectives) runs on a one-replica cluster job as on eight.
    """
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    launched = "WORLD_SIZE" in os.environ
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    # Kubeflow with one process per pod sets no LOCAL_RANK: the only process is local rank 0.
    local_rank = _env_int("LOCAL_RANK", 0)

    if use_cuda:
        dev = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
        # Before init_process_group: NCCL binds each process to the device current at init.
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")

    if launched:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        chosen = backend if backend != "auto" else ("nccl" if use_cuda else "gloo")
        # Before the group exists, or teardown() cannot free it: see _import_before_init.
        _import_before_init()
        dist.init_process_group(
            backend=chosen,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=dev if chosen == "nccl" else None,
        )
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=dev)


# What a collective raises when another rank died (gloo closes the socket; the TCPStore on the
# master goes away; NCCL aborts or times out). The process itself is healthy: retrying helps.
_PEER_LOST_TEXT = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "connection refused",
    "socket timeout",
    "timed out",
    "nccl communicator was aborted",
)


def is_peer_lost(exc: BaseException) -> bool:
    """True when ``exc`` means another rank of the job is gone rather than a bug here."""
    if isinstance(exc, dist.DistError):  # DistBackendError, DistNetworkError, DistStoreError
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(t in text for t in _PEER_LOST_TEXT)


def _import_before_init() -> None:
    """Import the torch modules that capture the default process group when imported late.

    ``torch.distributed.nn.functional`` gives ten functions the default argument
    ``group=group.WORLD``, evaluated when the module is imported. DDP's constructor imports
    ``torch._dynamo`` lazily, which imports that module (through fsdp and _shard), so a module
    first imported *after* ``init_process_group`` holds the default group in those defaults for
    the life of the process (torch 2.8 and 2.15 alike). ``destroy_process_group`` then cannot
    free it: gloo's worker threads (and rank 0's TCPStore thread) run on into interpreter
    shutdown, and a worker that drops the last reference to a tensor Python still owns (a
    barrier holds the all-reduce works queued before it) must take the GIL. CPython 3.11 ends
    such a thread with ``pthread_exit``; its forced unwind meets a ``noexcept`` destructor and
    the process dies with "terminate called without an active exception" (SIGABRT). Imported
    first, the defaults hold None and the group dies in ``teardown``. docs/testing.md has the
    backtrace and the figures; ``tests/trainer/test_teardown.py`` holds it.
    """
    import torch.distributed.nn.functional  # noqa: F401


def teardown() -> None:
    """Destroy the process group and wait for its threads; safe when there is none (``finally``).

    With no reference left, destroying the group joins gloo's threads here, with the GIL
    released, instead of leaving them running while the interpreter shuts down (see
    ``_import_before_init``). A reference someone else still holds keeps them alive: said once.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    if group() is not None:
        log.warning(
            "the process group outlived destroy_process_group (something still references "
            "it); its threads may abort the process at exit"
        )


def barrier() -> None:
    """Wait for every rank; a no-op without a process group."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _multi_rank() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks in place and return it (identity for a single rank)."""
    if _multi_rank():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` as a list on rank 0 (None elsewhere)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    rank = dist.get_rank()
    out: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


class StepFlags:
    """DDP communication hook state: the step's ``[loss, stop]`` rides in the last gradient bucket.

    Every rank must learn the global loss (to skip a NaN step together) and whether any rank was
    told to stop (to checkpoint together). A collective of its own costs a round trip per step
    (about 5-7% of a small model's step on CPU); packed into the gradient all-reduce DDP does
    anyway, it costs two floats. ``calls``/``rounds`` count hook calls and all-reduce rounds.
    """

    def __init__(self, device: torch.device):
        self.values = torch.zeros(2, device=device)
        self.calls = 0
        self.rounds = 0

    def hook(self, _state, bucket):
        """DDP's mean all-reduce (what ``allreduce_hook`` does), with the flags in the last
        bucket. DDP waits for every bucket before ``backward()`` returns, so the reduced flags
        are in ``values`` by then. (No annotations: DDP inspects them and this module's are
        strings under ``from __future__ import annotations``.)"""
        self.calls += 1
        world = dist.get_world_size()
        grads = bucket.buffer()
        if not bucket.is_last():
            fut = dist.all_reduce(grads.div_(world), async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])
        self.rounds += 1
        n = grads.numel()
        packed = torch.cat([grads.div_(world), self.values.to(grads.dtype)])

        def unpack(f):
            out = f.value()[0]
            self.values.copy_(out[n:])
            return out[:n]

        return dist.all_reduce(packed, async_op=True).get_future().then(unpack)
