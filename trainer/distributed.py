"""Who am I in the job: set up and tear down the process group, and the collectives the loop
uses. Which launcher started the process (Kubeflow PyTorchJob, Trainer v2 TrainJob, torchrun,
accelerate, nothing) is read in ``trainer.launch``, without torch.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from trainer.contract import (
    EXIT_PEER_LOST,
    EXIT_STALE_RENDEZVOUS,
    GROUP_RANK,
    GROUP_WORLD_SIZE,
    JOIN_TIMEOUT_ENV,
    LOCAL_RANK,
    MASTER_ADDR,
    MASTER_PORT,
    RANK,
    TORCHELASTIC_RUN_ID,
    WORLD_SIZE,
)
from trainer.launch import record_exit, under_own_static_torchrun

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


def setup(device: str = "auto", backend: str = "auto", timeout_s: int = 600) -> DistEnv:
    """Read the launcher's environment, pick the device, and join the process group if any.

    A process group is created whenever a launcher set WORLD_SIZE, even to 1, so the same code
    path (DDP, collectives) runs on a one-replica cluster job as on eight.
    """
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    launched = WORLD_SIZE in os.environ
    world_size = _env_int(WORLD_SIZE, 1)
    rank = _env_int(RANK, 0)
    # Kubeflow with one process per pod sets no LOCAL_RANK: the only process is local rank 0.
    local_rank = _env_int(LOCAL_RANK, 0)

    if use_cuda:
        dev = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
        # Before init_process_group: NCCL binds each process to the device current at init.
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")

    if launched:
        os.environ.setdefault(MASTER_ADDR, "127.0.0.1")
        os.environ.setdefault(MASTER_PORT, "29500")
        chosen = backend if backend != "auto" else ("nccl" if use_cuda else "gloo")
        # Before the group exists, or teardown() cannot free it: see _import_before_init.
        _import_before_init()
        _join(rank, world_size, chosen, datetime.timedelta(seconds=timeout_s), dev)
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=dev)


#: Under torchrun, how long the group may take to form once the agents have met (seconds).
JOIN_TIMEOUT_S = 180
#: How often a joining worker checks that its agent's store still holds its place (seconds).
PLACE_CHECK_S = 1.0
#: Where torch's agents count themselves into their exit barrier, under the run id
#: (``SimpleElasticAgent._exit_barrier`` and ``elastic.utils.store.barrier``, torch 2.15).
EXIT_BARRIER_MEMBERS_KEY = "torchelastic/agent/terminal_state/num_members"
#: How long the host node's last worker waits for the other agents to enter that barrier, and
#: how often it looks (seconds).
EXIT_ORDER_S, EXIT_ORDER_POLL_S = 60.0, 0.05
#: Without torchrun: the key rank 0 sets in its store once its group has formed, and how often
#: a rank that found it there looks whether that store has gone (seconds).
FORMED_KEY, STALE_STORE_POLL_S = "ddpjob/group_formed", 0.5
#: How long one bare connection to that store may take (seconds).
STORE_ATTEMPT_S = 5.0
#: Where torch's agent keeps each node's ranks, under the run id
#: (``SimpleElasticAgent._assign_worker_ranks``, torch 2.15): a name that is not torch's sends
#: every worker away, which tests/trainer/test_launch.py's TrainJob runs would show.
ASSIGNED_RANKS_KEY = "torchelastic/assigned_ranks/"


def _join(
    rank: int, world_size: int, backend: str, timeout: datetime.timedelta, dev: torch.device
) -> None:
    """Join the process group, watched by :func:`_join_watchdog`. Under this pod's own torchrun
    the join ends with a barrier, and a join that fails because a peer is gone means that the
    rendezvous it came from is over (exit ``EXIT_STALE_RENDEZVOUS``)."""
    placed = _placement_check()
    formed = _join_watchdog(rank, placed)
    own_store = TORCHELASTIC_RUN_ID not in os.environ and world_size > 1
    if own_store and rank > 0:
        _wait_while_the_store_holds_a_formed_group(rank, timeout.total_seconds())
    try:
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=dev if backend == "nccl" else None,
        )
        if placed is not None:
            # Every rank of this group answers now: a group formed around a worker of the last
            # one, still answering from a store that is going away, fails here, before any work.
            dist.barrier()
    except Exception as e:
        if placed is not None and is_peer_lost(e):
            _leave_stale_rendezvous(rank, f"{type(e).__name__}: {str(e)[:200]}")
        raise
    formed.set()
    if own_store and rank == 0:
        _store_client(timeout.total_seconds()).set(FORMED_KEY, "1")


def _join_watchdog(rank: int, placed: Callable[[], bool | None] | None) -> threading.Event:
    """Under torchrun's agent, end the process if the group cannot form; set the returned event
    once it has formed.

    torchrun's static rendezvous has no rounds. ``StaticTCPRendezvous.next_rendezvous`` connects
    to whatever TCPStore answers at the master's address, and ``_assign_worker_ranks`` then
    reads this node's ranks from the key the master's agent wrote for the last group and never
    deletes. A container restarted in place (kill -9, OOM) starts its agent within seconds; if
    the master's agent whose worker is losing this peer still serves the store, the new agent
    reads the old ranks at once and starts its worker. The master's next agent, on a fresh store,
    waits for this node's role, which went to the old one: no group can form.

    So under this pod's own torchrun (``placed``, see :func:`_placement_check`), a worker checks
    that the store answering at MASTER_ADDR:MASTER_PORT holds its node's ranks, first and every
    :data:`PLACE_CHECK_S` until the group forms. Nothing answering, or a store without them,
    means that the round it was started from is over: it exits ``EXIT_STALE_RENDEZVOUS`` and the
    pod's launcher starts torchrun again, whose agent meets the master's current one. Past
    ``$DDPJOB_JOIN_TIMEOUT_S`` (default :data:`JOIN_TIMEOUT_S`) it exits 138 (retryable),
    whatever the cause. (A pod without torchrun has no agent: its worker's wait for its peers is
    the rendezvous itself, which an image pull may make long; its own guard against a store of
    the last group is :func:`_wait_while_the_store_holds_a_formed_group`.)"""
    done = threading.Event()
    if TORCHELASTIC_RUN_ID not in os.environ:
        return done
    limit = float(os.environ.get(JOIN_TIMEOUT_ENV) or JOIN_TIMEOUT_S)
    deadline = time.monotonic() + limit
    if placed is not None and placed() is False:
        _leave_stale_rendezvous(rank, "its node's ranks are not in the store")

    def watch() -> None:
        while not done.wait(PLACE_CHECK_S if placed is not None else limit):
            if placed is not None and placed() is False and not done.is_set():
                _leave_stale_rendezvous(rank, "its node's ranks are not in the store")
            if time.monotonic() >= deadline and not done.is_set():
                # The re-launching parent exits with the worker's code.
                _exit_peer_lost(
                    f"[rank {rank}] the process group did not form within {limit:.0f} s of "
                    "torchrun's rendezvous"
                )

    threading.Thread(target=watch, name="ddpjob-join-watchdog", daemon=True).start()
    return done


def _store_client(timeout_s: float) -> dist.TCPStore:
    """A client of the store at MASTER_ADDR:MASTER_PORT; its constructor waits (at most
    ``timeout_s``) for one to answer."""
    return dist.TCPStore(
        os.environ[MASTER_ADDR], int(os.environ[MASTER_PORT]), is_master=False,
        timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False,
    )  # fmt: skip


def _wait_while_the_store_holds_a_formed_group(rank: int, timeout_s: float) -> None:
    """Without torchrun (a PyTorchJob or TrainJob pod of one process, RANK and WORLD_SIZE set by
    hand), the store is rank 0's own, and rank 0 marks it (:data:`FORMED_KEY`) once its group
    has formed. A rank started again while rank 0 has not yet found its last run gone (a
    container restarted in place within seconds, rank 0 in a checkpoint write or an evaluation)
    would meet that store: gloo would then connect it to a group that is full and fail after
    minutes. Such a rank waits instead until that store has gone (rank 0 exits when it finds its
    peer lost) and joins the next one. Past ``timeout_s`` it exits 138 (retryable).

    Until a store answers, it only opens a bare connection every :data:`STALE_STORE_POLL_S`,
    each to the address the master's name gives then: a master's pod started again has a new
    address, while the name gives the old one for a while (a TCPStore client would keep trying
    that one for its whole timeout, and print a C++ traceback for each failed attempt)."""
    deadline, said = time.monotonic() + timeout_s, False
    while (left := deadline - time.monotonic()) > 0:
        if not _answers(min(left, STORE_ATTEMPT_S)):
            time.sleep(STALE_STORE_POLL_S)
            continue
        try:
            # Asked on a new connection each time: one that the store's end cuts makes noise.
            formed = _store_client(min(left, STORE_ATTEMPT_S)).check([FORMED_KEY])
        except dist.DistError:
            continue  # that store went away while asked: the next one
        if not formed:
            return  # a store whose group is still forming: join it
        if not said:
            said = True
            print(
                f"[rank {rank}] the store at {os.environ[MASTER_ADDR]}:{os.environ[MASTER_PORT]} "
                "belongs to a group that formed before this process started; waiting for rank 0 "
                "to start the next one",
                file=sys.stderr,
                flush=True,
            )
        time.sleep(STALE_STORE_POLL_S)
    _exit_peer_lost(f"[rank {rank}] no new group started within {timeout_s:.0f} s")


def _answers(timeout_s: float) -> bool:
    """Whether something accepts a connection at MASTER_ADDR:MASTER_PORT within ``timeout_s``,
    the name resolved now."""
    try:
        socket.create_connection(
            (os.environ[MASTER_ADDR], int(os.environ[MASTER_PORT])), timeout=timeout_s
        ).close()
        return True
    except OSError:
        return False


def _exit_peer_lost(what: str) -> NoReturn:
    print(
        f"{what}; exiting {EXIT_PEER_LOST} so this container restarts", file=sys.stderr, flush=True
    )
    os._exit(record_exit(EXIT_PEER_LOST))


def _placement_check() -> Callable[[], bool | None] | None:
    """A check that the store which placed this worker's agent still holds its node's ranks:
    True (it does), False (nothing answers there, or a store without them: the round is over),
    None (no answer in time: unknown). None instead of a check where there is nothing to check:
    not this pod's own static torchrun, or torch's fast path, which writes no ranks."""
    if not under_own_static_torchrun() or os.environ.get("TORCH_ELASTIC_WORKER_IDENTICAL") == "1":
        return None
    key = ASSIGNED_RANKS_KEY + os.environ[GROUP_RANK]

    def check() -> bool | None:
        # A bare connection first: a TCPStore client retries a refused one until its timeout.
        if not _answers(10):
            return False
        try:
            return _agent_store(30).check([key])
        except dist.DistError:
            return None

    return check


def _agent_store(timeout_s: float) -> dist.Store:
    """The store of torchrun's agents (the one at MASTER_ADDR:MASTER_PORT, which the node of
    group rank 0 hosts), as the agents see it: under the run's id."""
    return dist.PrefixStore(os.environ[TORCHELASTIC_RUN_ID], _store_client(timeout_s))


def leave_after_the_other_agents() -> None:
    """Under this pod's own torchrun, after a run that ended well: the worker of local rank 0
    on the node that hosts the agents' store waits (at most :data:`EXIT_ORDER_S`) until every
    other node's agent has entered torchrun's exit barrier.

    The barrier is the agents' last use of that store, and the host's agent leaves the barrier
    and exits the moment the last agent enters it. When that last agent is another node's,
    its wait for the barrier's end can find the store already closed, and it prints a
    ``DistNetworkError`` traceback after a run that succeeded. The host's agent enters only once
    all its workers have ended, so with this worker the last to end, the host's agent enters
    last: the others are waiting by then, and the store tells them before it closes."""
    if not under_own_static_torchrun() or os.environ.get(LOCAL_RANK) != "0":
        return
    nodes = int(os.environ.get(GROUP_WORLD_SIZE) or 1)
    if os.environ.get(GROUP_RANK) != "0" or nodes < 2:
        return
    deadline = time.monotonic() + EXIT_ORDER_S
    try:
        store = _agent_store(EXIT_ORDER_S)
        while store.add(EXIT_BARRIER_MEMBERS_KEY, 0) < nodes - 1:
            if time.monotonic() > deadline:
                return
            time.sleep(EXIT_ORDER_POLL_S)
    except dist.DistError as e:  # the store is gone: nothing left to put in order
        log.info("exit: torchrun's store did not answer (%s)", e)


def _leave_stale_rendezvous(rank: int, why: str) -> NoReturn:
    print(
        f"[rank {rank}] torchrun's agent was placed by a rendezvous that is over ({why}; store "
        f"{os.environ[MASTER_ADDR]}:{os.environ[MASTER_PORT]}); exiting {EXIT_STALE_RENDEZVOUS} "
        "so that torchrun starts again and joins the current one",
        file=sys.stderr,
        flush=True,
    )
    os._exit(record_exit(EXIT_STALE_RENDEZVOUS))


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
    first, the defaults hold None and the group dies in ``teardown``. docs/benchmarks.md has the
    backtrace and the figures; ``tests/trainer/test_teardown.py`` holds it.
    """
    import torch.distributed.nn.functional  # noqa: F401


def teardown() -> None:
    """Destroy the process group and wait for its threads; safe when there is none (``finally``).

    With no reference left, destroying the group joins gloo's threads here, with the GIL
    released, instead of leaving them running while the interpreter shuts down (see
    ``_import_before_init``). So the caller lets go of what holds the group first: a DDP module
    (its ``process_group``), and with it the trainer, and the frames of a traceback that went
    through them (``python -m trainer``'s ``train``). A reference still held keeps the threads
    alive: said once.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    _forget_device_meshes()
    gc.collect()  # a sharded model and its FSDP state refer to each other: only gc frees them
    group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    if group() is not None:
        log.warning(
            "the process group outlived destroy_process_group (something still references "
            "it); its threads may abort the process at exit"
        )


def _forget_device_meshes() -> None:
    """Empty DTensor's caches, which keep every device mesh they have seen (and so its process
    groups) for the life of the process: strategy fsdp's sharded parameters are DTensors on a
    mesh of the job's ranks. Nothing when no DTensor was made."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    from torch.distributed.tensor import _collective_utils, _redistribute, debug

    debug._clear_sharding_prop_cache()
    _redistribute._gen_transform_infos.cache_clear()
    _redistribute.clear_redistribute_planner_cache()
    _collective_utils.MeshTopoInfo.build_from_mesh.cache_clear()


class Collectives:
    """Which collective this process's loop is in, by what it is for (``name``), read by the
    watchdog (``trainer.health.watchdog``) from its own thread. torch's Flight Recorder knows a
    collective's sequence number and op; this knows the gradient all-reduce from the
    evaluation's. Set around each collective below, and by the gradient all-reduce's comm hook
    (``StepFlags``) until the step reads its flags (``trainer.parts.step``)."""

    def __init__(self) -> None:
        self.name: str | None = None

    @contextlib.contextmanager
    def inside(self, name: str) -> Iterator[None]:
        outer, self.name = self.name, name
        try:
            yield
        finally:
            self.name = outer

    def enter(self, name: str) -> None:
        """In ``name`` until :meth:`leave` (for a collective that a hook starts)."""
        if self.name is None:
            self.name = name

    def leave(self) -> None:
        self.name = None


#: This process's: the loop runs on one thread, and so do its collectives.
COLLECTIVES = Collectives()

#: The gradient all-reduce's name in ``stuck`` events.
GRADIENT_ALL_REDUCE = "gradient all-reduce"


def barrier(what: str = "barrier") -> None:
    """Wait for every rank; a no-op without a process group."""
    if dist.is_available() and dist.is_initialized():
        with COLLECTIVES.inside(what):
            dist.barrier()


def _multi_rank() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(t: torch.Tensor, what: str = "all-reduce") -> torch.Tensor:
    """Sum a tensor over ranks in place and return it (identity for a single rank)."""
    if _multi_rank():
        with COLLECTIVES.inside(what):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_floats(values: list[float], what: str = "all-gather") -> list[list[float]]:
    """Every rank's ``values`` (the same length on each), in rank order: one small collective
    on the CPU, or on the GPU under NCCL."""
    if not _multi_rank():
        return [list(values)]
    on = torch.device("cuda", torch.cuda.current_device()) if _nccl() else torch.device("cpu")
    mine = torch.tensor(values, dtype=torch.float64, device=on)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    with COLLECTIVES.inside(what):
        dist.all_gather(out, mine)
    return [t.tolist() for t in out]


def _nccl() -> bool:
    return dist.get_backend() == "nccl"


def broadcast_tensors(tensors: list[torch.Tensor], what: str = "broadcast") -> None:
    """Overwrite ``tensors`` with rank 0's, in place: one broadcast per dtype and device (a
    no-op for a single rank)."""
    if not _multi_rank():
        return
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for same in groups.values():
        flat = torch.cat([t.reshape(-1) for t in same])
        with COLLECTIVES.inside(what):
            dist.broadcast(flat, src=0)
        for t, part in zip(same, flat.split([t.numel() for t in same]), strict=True):
            t.copy_(part.view_as(t))


def broadcast_object(obj: Any, what: str = "object broadcast") -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    with COLLECTIVES.inside(what):
        dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any, what: str = "object gather") -> list[Any] | None:
    """Every rank's ``obj`` as a list on rank 0 (None elsewhere)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    rank = dist.get_rank()
    out: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    with COLLECTIVES.inside(what):
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
        #: Called when the step's last bucket is ready: this rank's share of the step is done
        #: and only the wait for its peers is left (``trainer.health.stragglers``).
        self.on_last_bucket: Callable[[], None] | None = None

    def hook(self, _state, bucket):
        """DDP's mean all-reduce (what ``allreduce_hook`` does), with the flags in the last
        bucket. DDP waits for every bucket before ``backward()`` returns, so the reduced flags
        are in ``values`` by then. (No annotations: DDP inspects them and this module's are
        strings under ``from __future__ import annotations``.)"""
        self.calls += 1
        COLLECTIVES.enter(GRADIENT_ALL_REDUCE)
        world = dist.get_world_size()
        grads = bucket.buffer()
        if not bucket.is_last():
            fut = dist.all_reduce(grads.div_(world), async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])
        self.rounds += 1
        if self.on_last_bucket is not None:
            self.on_last_bucket()
        n = grads.numel()
        packed = torch.cat([grads.div_(world), self.values.to(grads.dtype)])

        def unpack(f):
            out = f.value()[0]
            self.values.copy_(out[n:])
            return out[:n]

        return dist.all_reduce(packed, async_op=True).get_future().then(unpack)
