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
  ``PET_MASTER_PORT``, and no torchrun started. Nothing names this process's rank or the world
  size, so the trainer always re-launches itself under torchrun there, even for one process.
"""

from __future__ import annotations

import contextlib
import os
import sys

from trainer.contract import (
    EXIT_FILE_ENV,
    EXIT_STALE_RENDEZVOUS,
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
    WORLD_SIZE,
)

# Values of nprocPerNode that torchrun resolves itself (e.g. "gpu" = one process per GPU).
_SYMBOLIC_NPROC = ("auto", "gpu", "cpu", "xpu")

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
    if elastic() or trainjob():
        # Only torchrun speaks the c10d rendezvous (elastic), and only torchrun turns a TrainJob's
        # node rank into global ranks: both even for one process per pod.
        return True
    nproc = nproc_per_node_from_env()
    return int(nproc) > 1 if nproc.isdigit() else nproc in _SYMBOLIC_NPROC


def elastic() -> bool:
    """An elastic PyTorchJob: the operator sets ``PET_RDZV_ENDPOINT`` and no master replica."""
    return bool(os.environ.get(PET_RDZV_ENDPOINT))


def trainjob() -> bool:
    """A Kubeflow Trainer v2 TrainJob pod: ``PET_MASTER_ADDR`` and no ``WORLD_SIZE`` (the
    PyTorchJob operator sets ``MASTER_ADDR`` and ``WORLD_SIZE`` instead)."""
    return bool(os.environ.get(PET_MASTER_ADDR)) and WORLD_SIZE not in os.environ


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
