"""Sharded checkpoints (strategy fsdp): every rank writes its own shard, nothing is gathered.

Layout, under ``checkpoint.dir`` as for a full checkpoint (trainer.checkpoint.manager)::

    step_00000100/__0_0.distcp   rank 0's shard of the model, optimizer and EMA (DCP's format)
    step_00000100/__1_0.distcp   rank 1's ...
    step_00000100/.metadata      DCP's index of the shards (rank 0)
    step_00000100/state.pt       rank 0: the rest (step, data position, RNG of every rank, lr
                                 schedule, config, ledger): small
    step_00000100/manifest.json  rank 0, last: every object's bytes and CRC-32, strategy fsdp,
                                 the world size

A save stages each rank's shard in CPU memory (the step pays for that copy) and writes it in the
background through ``torch.distributed.checkpoint`` (``dcp.save``) into the store, every rank at
once, over a gloo group of its own (the loop's collectives go on meanwhile). When ``dcp.save``
returns on every rank, every shard is stored; rank 0 then gathers each rank's list of what it
stored (names, bytes, CRC-32), writes state.pt and the manifest, and prunes. A rank killed
mid-write leaves a step without a manifest: never read, removed at the next start.

A resume is collective: rank 0 picks the newest complete checkpoint and reads its manifest and
state.pt (which it broadcasts); every rank then loads what it needs of the shards into its own
(``dcp.load``: onto another world size too, DCP reshards), each object checked against the
manifest before it is read. A damaged one fails the load on every rank together, and the
checkpoint before it is tried. Every rank reads and writes ``checkpoint.dir``: it must be one
place for all of them (``s3://``, or a volume every pod mounts); the start checks that it is.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import time
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from trainer import distributed as distributed_
from trainer.checkpoint.manager import (
    FSDP,
    MANIFEST,
    STATE,
    CheckpointManager,
    OtherStrategy,
    _first_line,
    _in_background,
    _location_problem,
    read,
    read_manifest,
    scan,
    step_name,
    write_manifest,
)
from trainer.checkpoint.storage import Retries, StorageError, Store, describe, open_store
from trainer.config import ConfigError, TrainConfig, other_model
from trainer.distributed import DistEnv

log = logging.getLogger(__name__)

# DCP warns whenever it runs without a process group; one rank alone is what that means here.
warnings.filterwarnings(
    "ignore", "torch.distributed is disabled, unavailable or uninitialized", UserWarning
)


class ResumeError(RuntimeError):
    """No checkpoint could be loaded after a load that may have filled part of the model."""


#: The parts of the training state that are sharded (DTensors under FSDP): DCP writes them.
SHARDED = ("model", "optimizer", "ema")


class ShardedCheckpointManager(CheckpointManager):
    """Save and find sharded checkpoints in ``location`` (a local dir or ``s3://``).

    Every rank opens the location; its shard's write waits at most ``timeout_s`` for the
    others' (the process group's timeout). Constructing it is collective: every rank proves it can
    write, list, read and delete there and that it sees what rank 0 writes (one place for all),
    rank 0 removes what a killed writer left, and every rank raises the same ConfigError when
    any of that fails.
    """

    def __init__(
        self,
        location: str | os.PathLike,
        keep: int,
        is_main: bool,
        device: torch.device | None = None,
        retries: Retries | None = None,
        timeout_s: float = 600,
    ):
        self._begin(location, keep, is_main, device)
        self._shard_stager: Any = None
        # Rank 0 first: it removes what a killed writer left, temp files included, which
        # would be the other ranks' probes if they wrote theirs meanwhile.
        problems = _gather_problems(self._open(retries) if self.is_main else None)
        if not problems:
            problems = _gather_problems(None if self.is_main else self._open(retries))
        if not problems:
            problems = _gather_problems(self._check_shared())
        if problems:
            raise ConfigError(problems[:1])
        # The background writes' collectives: a group of their own, beside the loop's.
        timeout = datetime.timedelta(seconds=timeout_s)
        self.group = dist.new_group(backend="gloo", timeout=timeout) if _grouped() else None

    def _open(self, retries: Retries | None) -> str | None:
        """This rank opens and probes the location (rank 0 also cleans it); its problem, if any."""
        try:
            store = open_store(self.location, retries)
            store.probe()
            if self.is_main:
                store.remove_partial()
                store.delete(scan(store.list())[1])  # a dead writer's steps
            self.store = store
        except StorageError as e:
            return _location_problem(e)
        return None

    def _check_shared(self) -> str | None:
        """Every rank reads what rank 0 wrote: the location is one place for all ranks."""
        assert self.store is not None
        name = f".ddpjob-shared-{uuid.uuid4().hex}" if self.is_main else None
        if self.is_main:
            self.store.write_bytes(name, name.encode())
        name = distributed_.broadcast_object(name, what="checkpoint location check")
        try:
            seen = self.store.read_bytes(name) == name.encode()
        except (FileNotFoundError, StorageError):
            seen = False
        distributed_.barrier("checkpoint location check")
        if self.is_main:
            self.store.delete([name])
        if seen:
            return None
        return (
            f"checkpoint.dir: rank {dist.get_rank()} does not see what rank 0 writes in "
            f"{self.store.url} (got strategy=fsdp, where every rank writes its shard there and "
            "reads the others' to resume). Use s3://..., or a volume every pod mounts "
            "(ReadWriteMany)"
        )

    # -----------------------------------------------------------------------------------------
    # Saving

    def save(self, step: int, state_dict: Callable[[], dict[str, Any] | None]) -> None:
        """Checkpoint ``step``; collective. ``state_dict`` returns, on every rank, this rank's
        shards of :data:`SHARDED` and, on rank 0, the rest of the state besides. Every rank
        waits for the save before, stages its shard in CPU memory and returns; the write runs
        in the background. Its result comes from :meth:`completed` or :meth:`flush`."""
        started = time.perf_counter()
        self._collect(wait=True)
        state = state_dict()
        assert state is not None
        shards_state = {k: state.pop(k) for k in SHARDED if state.get(k) is not None}
        staged_shards = self._stage_shards(shards_state)
        # Which parts are in the shards: a run that keeps no EMA resumes from one that did.
        rest = {**state, "sharded": sorted(shards_state)}
        staged_rest = self._stager.stage(rest) if self._stager is not None else None
        stall_s = time.perf_counter() - started
        self._inflight = _in_background(self._write, staged_shards, staged_rest, step, stall_s)

    def _stage_shards(self, state: dict[str, Any]) -> dict[str, Any]:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self._shard_stager is None:
            cuda = self.device.type == "cuda"
            # Synchronous: the copy is done when save returns, and the step may go on.
            self._shard_stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda,
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=False,
                )
            )
        return self._shard_stager.stage(state)

    def _write(
        self, staged: dict[str, Any], rest: dict[str, Any] | None, step: int, stall_s: float
    ) -> dict[str, Any] | None:
        """The background half of a save, on every rank: the shards (every rank), then rank 0's
        state.pt and the manifest, once every rank's shard is stored, then pruning."""
        import torch.distributed.checkpoint as dcp

        from trainer.checkpoint import shards

        assert self.store is not None
        store, name = self.store, step_name(step)
        started = time.perf_counter()
        try:
            if self.is_main:  # a step written again is incomplete from now on
                store.delete([f"{name}/{MANIFEST}"])
            _barrier(self.group)
            writer = shards.writer(store, name)
            dcp.save(
                staged, storage_writer=writer, process_group=self.group, no_dist=not _grouped()
            )
            stored = _gather(writer.fs.written, self.group)
            if not self.is_main:
                return None
            objects = {k.rpartition("/")[2]: v for mine in stored for k, v in mine.items()}
            objects[STATE] = store.write(f"{name}/{STATE}", lambda f: torch.save(rest, f))
            write_manifest(store, name, step, FSDP, objects, world_size=len(stored))
            write_s = time.perf_counter() - started
            self._prune()
        except (Exception, dcp.CheckpointException) as e:
            if not self.is_main:
                return None  # rank 0 reports it, and removes what was written
            # Where (the object the store refused, where it says) and what it answered.
            cause = _cause(e)
            where = cause.url if isinstance(cause, StorageError) else store.url_of(name)
            detail = cause.detail if isinstance(cause, StorageError) else _detail(e)
            with contextlib.suppress(Exception):  # a store that refuses writes may refuse this
                store.delete([n for n in store.list() if n.startswith(f"{name}/")])
            return {"step": step, "path": store.url_of(name), "error": f"{where}: {detail}"}
        return {
            "step": step,
            "path": store.url_of(name),
            "stall_s": round(stall_s, 4),
            "write_s": round(write_s, 4),
            "bytes": sum(size for size, _ in objects.values()),
            "shards": len(stored),
        }

    # -----------------------------------------------------------------------------------------
    # Loading

    def load(
        self, resume: str, into: Callable[[], dict[str, Any]] | None = None
    ) -> tuple[dict[str, Any] | None, str | None, list[str]]:
        """On every rank: the state of the checkpoint rank 0 chose, its path, and notes on the
        checkpoints skipped. ``into()`` gives this rank's current shards of :data:`SHARDED`
        (the model's, optimizer's and EMA's state dicts), which the checkpoint's are loaded into
        and returned in the state beside the rest."""
        assert into is not None, "a sharded checkpoint loads into the model's own shards"
        named = resume not in ("auto", "never")
        candidates = self._candidates(resume) if self.is_main else None
        candidates = distributed_.broadcast_object(candidates, what="checkpoint choice")
        skipped: list[str] = []
        current: dict[str, Any] | None = None
        for location, name in candidates:
            store = self.store if location == self.location else open_store(location)
            assert store is not None
            where = store.url_of(name)
            found = self._read_rest(store, name, where, named) if self.is_main else None
            manifest, rest, problem = distributed_.broadcast_object(found, what="checkpoint choice")
            if isinstance(problem, ConfigError):
                raise problem
            if problem is not None:
                skipped.append(problem)
                continue
            current = into() if current is None else current
            held = rest.pop("sharded")
            target = {k: v for k, v in current.items() if k in held}
            problem = self._load_shards(store, name, where, manifest, target)
            if problem is None:
                return {**rest, **target}, where, skipped
            skipped.append(problem)
        if current is not None:  # a load that failed may have filled some of the model's shards
            raise ResumeError(
                f"resume: no checkpoint in {self.location} could be loaded "
                f"({'; '.join(skipped)}). Remove the damaged ones, or start fresh: resume=never"
            )
        return None, None, skipped

    def _candidates(self, resume: str) -> list[tuple[str, str]]:
        """Rank 0: the checkpoints to try, newest first, as ``(location, name)``."""
        if resume == "never":
            return []
        if resume == "auto":
            return [(self.location, found.name) for found in self.list()]
        parent, _, name = resume.rstrip("/").rpartition("/")
        if name == STATE:  # the step's state.pt: the step is meant
            parent, _, name = parent.rpartition("/")
        return [(parent or ".", name)]

    def _read_rest(
        self, store: Store, name: str, where: str, named: bool
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str | ConfigError | None]:
        """Rank 0: checkpoint ``name``'s manifest and its state.pt, checked; or why not: a note
        (damaged: the one before is tried) or a ConfigError (another strategy, or a checkpoint
        the user ``named`` that does not load)."""
        try:
            rest = read(store, name, FSDP)
            manifest = read_manifest(store, name)
        except OtherStrategy as e:
            return None, None, ConfigError([e.problem(where, FSDP)])
        except Exception as e:  # torn, damaged, unreadable: skip it, unless the user named it
            if named:
                line = f"resume: cannot load {_first_line(e)} (got {where})"
                return None, None, ConfigError([line])
            note = f"{where}: unreadable ({_first_line(e)})"
            log.warning("checkpoint %s; trying an older one", note)
            return None, None, note
        return manifest, rest, None

    def _load_shards(
        self,
        store: Store,
        name: str,
        where: str,
        manifest: dict[str, Any],
        target: dict[str, Any],
    ) -> str | None:
        """Every rank: load checkpoint ``name``'s shards into ``target``; None, or the note of a
        damaged checkpoint (every rank learns the same). A state of another shape is a
        ConfigError."""
        import torch.distributed.checkpoint as dcp

        from trainer.checkpoint import shards

        reader = shards.reader(store, name, manifest["objects"])
        try:
            dcp.load(target, storage_reader=reader, no_dist=not _grouped())
        except dcp.CheckpointException as e:
            causes = [exc for exc, _ in e.failures.values()]
            if any(isinstance(c, shards.Damaged | OSError | StorageError) for c in causes):
                note = f"{where}: unreadable ({_detail(e)})"
                if self.is_main:
                    log.warning("checkpoint %s; trying an older one", note)
                return note
            raise other_model(where, _detail(e)) from None
        return None


def _grouped() -> bool:
    return dist.is_available() and dist.is_initialized()


def _gather_problems(mine: str | None) -> list[str]:
    """Every rank's problem (None: none), on every rank, in rank order."""
    if not _grouped():
        return [mine] if mine else []
    every: list[str | None] = [None] * dist.get_world_size()
    with distributed_.COLLECTIVES.inside("checkpoint location check"):
        dist.all_gather_object(every, mine)
    return [p for p in every if p]


def _barrier(group: Any) -> None:
    if group is not None:
        dist.barrier(group=group)


def _gather(obj: Any, group: Any) -> list[Any]:
    """Every rank's ``obj`` on rank 0 (``group``'s), in rank order; ``[obj]`` without a group."""
    if group is None:
        return [obj]
    out: list[Any] | None = [None] * dist.get_world_size(group) if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0, group=group)
    return out or []


def _cause(e: BaseException) -> BaseException:
    """What failed: the first rank's exception in DCP's CheckpointException, else ``e``."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        return min(failures.items())[1][0]
    return e


def _detail(e: BaseException) -> str:
    """One line for a save's or load's failure: DCP's CheckpointException names each rank's."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, (cause, _) = min(failures.items())
        return f"rank {rank}: {describe(cause)}"
    return describe(e)


def checkpoint_manager(cfg: TrainConfig, env: DistEnv) -> CheckpointManager:
    """The checkpoint manager of the run's strategy (collective): this module's, every rank
    writing its shard, under fsdp; rank 0 writing the whole state under ddp."""
    retries = Retries(cfg.checkpoint.max_attempts, cfg.checkpoint.retry_mode)
    dir_, keep = cfg.checkpoint.dir, cfg.checkpoint.keep
    if cfg.strategy == "fsdp":
        return ShardedCheckpointManager(
            dir_, keep, env.is_main, env.device, retries=retries, timeout_s=cfg.timeout_s
        )
    return CheckpointManager(dir_, keep, env.is_main, env.device, retries=retries)
