"""Checkpoints that survive preemption and travel: a local dir or S3, atomic by a manifest written
last, saved in the background, read by rank 0 alone and broadcast to the others.

Layout (the same on disk and in a bucket, under ``checkpoint.dir``)::

    step_00000100/state.pt        torch.save of the full training state
    step_00000100/manifest.json   written last: {"step", "objects": {"state.pt": {bytes, crc32}}}

A step is complete when its manifest exists; a reader takes the newest complete step whose
``state.pt`` has the manifest's size and CRC-32 and loads, falls back to older ones when it does
not (reported in ``skipped``), and never sees an upload that was cut off (no manifest yet). A
step is removed manifest first, so it stops being complete before anything of it goes; so is a
step that is written again. ``step_XXXXXXXX.pt`` files of the layout before (renamed into place
whole) are read as complete checkpoints too, and pruned with the others.

A save costs the training step only the copy of the state off the device (into CPU memory,
pinned on CUDA, reused from save to save); a background thread serialises
and writes it, then prunes to the newest ``keep``. A new save first waits for the one before.
The loop learns of finished saves from :meth:`CheckpointManager.completed` and waits for the last
one with :meth:`CheckpointManager.flush` before it exits. A write that fails (after the S3
client's own retries, ``storage.Retries``) is one of them too, with the ``error`` that says
where and what the server answered: the run goes on, and what it left of that step (no manifest:
nothing ever reads it) is removed then or, if the store refuses that too, by the next save that
completes.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import logging
import os
import re
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer import distributed as distributed_
from trainer.checkpoint.broadcast import broadcast_state
from trainer.checkpoint.storage import (
    Retries,
    StorageError,
    Store,
    crc_file,
    describe,
    is_url,
    open_store,
)
from trainer.config import ConfigError
from trainer.contract import GRACE_PERIOD_ENV, KUBERNETES_DEFAULT_GRACE_PERIOD_S

log = logging.getLogger(__name__)

STATE = "state.pt"
MANIFEST = "manifest.json"
FORMAT = "ddpjob-checkpoint/1"
#: The manifest's ``strategy``: a full state written by rank 0 (no key: written before there
#: was another), or rank 0's state.pt beside every rank's shard (trainer.checkpoint.sharded).
DDP, FSDP = "ddp", "fsdp"
_STEP = re.compile(r"step_(\d+)")
_LEGACY = re.compile(r"step_(\d+)\.pt")


def step_name(step: int) -> str:
    return f"step_{step:08d}"


@dataclass(frozen=True)
class Found:
    """A complete checkpoint in a store: a step directory with its manifest, or a legacy file."""

    step: int
    name: str
    objects: tuple[str, ...] = field(default=(), compare=False)

    @property
    def legacy(self) -> bool:
        return self.name.endswith(".pt")


def scan(names: list[str]) -> tuple[list[Found], list[str]]:
    """A store's object names -> its complete checkpoints, newest first (a step directory before
    a legacy file of the same step), and the objects of steps that have no manifest."""
    complete: list[Found] = []
    steps: dict[str, list[str]] = {}
    for name in names:
        top, _, leaf = name.partition("/")
        if not leaf:
            if m := _LEGACY.fullmatch(top):
                complete.append(Found(int(m.group(1)), top, (top,)))
        elif m := _STEP.fullmatch(top):
            steps.setdefault(top, []).append(name)
    incomplete = []
    for top, objects in steps.items():
        if f"{top}/{MANIFEST}" in objects:
            complete.append(Found(int(top[len("step_") :]), top, tuple(sorted(objects))))
        else:
            incomplete += objects
    complete.sort(key=lambda f: (f.step, not f.legacy), reverse=True)
    return complete, sorted(incomplete)


def read(store: Store, name: str, strategy: str = DDP) -> dict[str, Any]:
    """Load checkpoint ``name`` of ``store`` onto CPU (its state.pt: under ``strategy`` fsdp the
    state beside the shards); raise if it is not complete and intact, OtherStrategy if it was
    written under the other strategy."""
    if name.endswith(".pt"):  # a legacy file (or a state.pt named on its own)
        if strategy != DDP:
            raise OtherStrategy({"strategy": DDP})
        return _load(io.BytesIO(store.read_bytes(name)), strategy)
    manifest = read_manifest(store, name)
    if manifest.get("strategy", DDP) != strategy:
        raise OtherStrategy(manifest)
    want = manifest["objects"][STATE]
    path = store.local_path(f"{name}/{STATE}")
    if path is not None:
        size, crc = crc_file(path)
        source: Path | io.BytesIO = path
    else:
        data = store.read_bytes(f"{name}/{STATE}")
        size, crc = len(data), zlib.crc32(data)
        source = io.BytesIO(data)
    if size != want["bytes"]:
        raise ValueError(f"{STATE} has {size} bytes, its manifest says {want['bytes']}")
    if f"{crc:08x}" != want["crc32"]:
        raise ValueError(f"{STATE}'s CRC-32 is {crc:08x}, its manifest says {want['crc32']}")
    return _load(source, strategy)


def read_manifest(store: Store, name: str) -> dict[str, Any]:
    """Checkpoint ``name``'s manifest; raise if it has none (not complete) or it is damaged."""
    try:
        manifest = json.loads(store.read_bytes(f"{name}/{MANIFEST}"))
        int(manifest["objects"][STATE]["bytes"])  # every checkpoint has its state.pt
    except FileNotFoundError:
        raise FileNotFoundError(f"no {MANIFEST}: not a complete checkpoint") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{MANIFEST} is damaged ({describe(e)})") from e
    return manifest


class OtherStrategy(Exception):
    """A checkpoint written under the other strategy (its ``manifest``): refused, not skipped."""

    def __init__(self, manifest: dict[str, Any]):
        self.strategy = manifest.get("strategy", DDP)
        self.world_size = manifest.get("world_size")
        super().__init__(f"a strategy {self.strategy} checkpoint")

    def problem(self, where: str, ours: str) -> str:
        """The line that refuses it."""
        n = self.world_size
        shards = f" of {n} shard{'s' if n != 1 else ''}" if n else ""
        return (
            f"resume: {where} is a strategy {self.strategy} checkpoint{shards}; this run's "
            f"strategy is {ours} (got strategy={ours}). Resume it with strategy="
            f"{self.strategy}, or start fresh: resume=never or another checkpoint.dir"
        )


#: What a state.pt holds at least, by strategy (under fsdp the model is in the shards).
_REQUIRED = {DDP: ("model", "step"), FSDP: ("step",)}


def _load(source: Path | io.BytesIO, strategy: str = DDP) -> dict[str, Any]:
    # A file is mapped, not read: rank 0 holds no second copy of a large state.
    mmap = isinstance(source, Path)
    state = torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    required = _REQUIRED[strategy]
    if not isinstance(state, dict) or any(k not in state for k in required):
        raise ValueError(f"not a ddpjob checkpoint (no {'/'.join(required)})")
    return state


def read_path(path: str) -> dict[str, Any]:
    """Load the checkpoint at ``path``: a step directory or prefix (``.../step_00000100``, a
    local path or ``s3://``), its ``state.pt``, or a legacy ``step_XXXXXXXX.pt`` file."""
    parent, _, name = path.rstrip("/").rpartition("/")
    store = open_store(parent or ".")
    if name == STATE and _STEP.fullmatch(parent.rpartition("/")[2]):
        parent, _, name = parent.rpartition("/")  # the step's state.pt: check its manifest too
        store = open_store(parent or ".")
    return read(store, name)


def grace_period_s() -> float | None:
    """The pods' termination grace period: ``$DDPJOB_GRACE_PERIOD_S`` (the controller renders
    it), else Kubernetes' default inside a pod, else none (a run on a machine of its own)."""
    raw = os.environ.get(GRACE_PERIOD_ENV)
    if raw:
        return float(raw)
    return KUBERNETES_DEFAULT_GRACE_PERIOD_S if "KUBERNETES_SERVICE_HOST" in os.environ else None


def write_manifest(
    store: Store,
    name: str,
    step: int,
    strategy: str,
    objects: dict[str, tuple[int, int]],
    **extra: Any,
) -> None:
    """Write checkpoint ``name``'s manifest (last: it makes the step complete). ``objects`` are
    the step's other objects, each ``(bytes, crc32)``."""
    manifest = {
        "format": FORMAT,
        "step": step,
        "strategy": strategy,
        "objects": {k: {"bytes": n, "crc32": f"{crc:08x}"} for k, (n, crc) in objects.items()},
        **extra,
    }
    store.write_bytes(f"{name}/{MANIFEST}", json.dumps(manifest, indent=1).encode())


class CheckpointManager:
    """Save and find checkpoints in ``location`` (a local dir or ``s3://bucket/prefix``).

    Only rank 0 touches the location. Constructing it is collective: rank 0 proves it can write,
    list, read and delete there (then removes what a killed writer left), and every rank raises
    the same ConfigError when it cannot.
    """

    def __init__(
        self,
        location: str | os.PathLike,
        keep: int,
        is_main: bool,
        device: torch.device | None = None,
        retries: Retries | None = None,
    ):
        self._begin(location, keep, is_main, device)
        problem = None
        if is_main:
            try:
                store = open_store(self.location, retries)
                store.probe()
                store.remove_partial()
                _, incomplete = scan(store.list())
                store.delete(incomplete)  # a dead writer's steps: never complete, never read
                self.store = store
            except StorageError as e:
                problem = [_location_problem(e)]
        # Every rank must learn it, or the others would wait for rank 0 at the next collective.
        problem = distributed_.broadcast_object(problem)
        if problem:
            raise ConfigError(problem)

    def _begin(
        self, location: str | os.PathLike, keep: int, is_main: bool, device: torch.device | None
    ) -> None:
        """The state of a manager with no save yet; rank 0's staging memory."""
        self.location = str(location)
        self.keep, self.is_main = keep, is_main
        self.device = device or torch.device("cpu")
        self.store: Store | None = None
        self._stager = _Staging(self.device) if is_main else None
        self._inflight: Future | None = None
        self._done: list[dict[str, Any]] = []
        self._warned_slow = False
        self.grace_period_s = grace_period_s()

    @property
    def url(self) -> str | None:
        return self.store.url if self.store is not None else None

    def list(self) -> list[Found]:
        """Complete checkpoints, newest first (rank 0)."""
        assert self.store is not None, "only rank 0 reads the checkpoint location"
        return scan(self.store.list())[0]

    # -----------------------------------------------------------------------------------------
    # Saving

    def save(self, step: int, state_dict: Callable[[], dict[str, Any] | None]) -> None:
        """Checkpoint ``step``; collective (``state_dict`` is, and returns the state on rank 0).

        Rank 0 waits for the save before, copies the state off the device and returns; the
        write runs in the background. Its result comes from :meth:`completed` or :meth:`flush`.
        """
        started = time.perf_counter()
        if self.is_main:
            self._collect(wait=True)  # and the staged copy is free to be written over
        state = state_dict()
        if not self.is_main:
            return
        assert state is not None, "rank 0 must return the state to save"
        staged = self._stager.stage(state)
        stall_s = time.perf_counter() - started
        self._inflight = _in_background(self._write, staged, step, stall_s)

    def completed(self) -> list[dict[str, Any]]:
        """The saves that finished since the last call (rank 0; empty elsewhere), in order: a
        complete one as the ``checkpoint`` event's fields, a failed one as ``{"step", "path",
        "error"}`` (``error``: where and what the store answered)."""
        self._collect(wait=False)
        done, self._done = self._done, []
        return done

    def flush(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Wait for the save in flight (at most ``timeout_s``: then it is left running); then
        as :meth:`completed`."""
        self._collect(wait=True, timeout_s=timeout_s)
        return self.completed()

    def close(self) -> list[dict[str, Any]]:
        """Wait for the save in flight; as :meth:`flush`."""
        return self.flush()

    def _write(self, staged: dict[str, Any], step: int, stall_s: float) -> dict[str, Any]:
        """The background half of a save: the state, then its manifest, then pruning."""
        assert self.store is not None
        store, name = self.store, step_name(step)
        started = time.perf_counter()
        try:
            store.delete([f"{name}/{MANIFEST}"])  # a step written again is incomplete meanwhile
            size, crc = store.write(f"{name}/{STATE}", lambda f: torch.save(staged, f))
            write_manifest(store, name, step, DDP, {STATE: (size, crc)})
            write_s = time.perf_counter() - started
            self._prune()
        except Exception as e:
            # Where (the object the store refused, where it says) and what it answered.
            where = e.url if isinstance(e, StorageError) else store.url_of(name)
            detail = e.detail if isinstance(e, StorageError) else describe(e)
            with contextlib.suppress(Exception):  # a store that refuses writes may refuse this
                store.delete([f"{name}/{STATE}"])
            return {"step": step, "path": store.url_of(name), "error": f"{where}: {detail}"}
        return {
            "step": step,
            "path": store.url_of(name),
            "stall_s": round(stall_s, 4),
            "write_s": round(write_s, 4),
            "bytes": size,
        }

    def _prune(self) -> None:
        """Keep the newest ``keep``; each older step goes manifest first. What a failed write
        left and could not remove (a store that refused its writes refused the delete too) goes
        as well: no write is under way but this one, which is complete."""
        assert self.store is not None
        complete, incomplete = scan(self.store.list())
        for old in complete[self.keep :]:
            if old.legacy:
                self.store.delete([old.name])
                continue
            manifest = f"{old.name}/{MANIFEST}"
            self.store.delete([manifest])
            self.store.delete([o for o in old.objects if o != manifest])
        self.store.delete(incomplete)

    def _collect(self, wait: bool, timeout_s: float | None = None) -> None:
        inflight = self._inflight
        if inflight is None or not (wait or inflight.done()):
            return
        try:
            result = inflight.result(timeout=timeout_s)
        except TimeoutError:
            return
        self._inflight = None
        if result is None:  # a rank that wrote its shard: rank 0 reports the checkpoint
            return
        self._done.append(result)
        limit = self.grace_period_s
        if "error" in result:
            return
        if limit is not None and result["write_s"] > limit and not self._warned_slow:
            self._warned_slow = True
            log.warning(
                "checkpoint: writing step %d took %.1f s, longer than the pods' grace period "
                "(%.0f s): a preempted pod is killed before its last checkpoint is complete, and "
                "resumes from an older one. Raise grace_period_s in the job spec.",
                result["step"],
                result["write_s"],
                limit,
            )

    # -----------------------------------------------------------------------------------------
    # Loading

    def resolve(self, resume: str) -> tuple[str | None, dict[str, Any] | None, list[str]]:
        """Rank 0: the checkpoint to resume from (its URL or path), its state, and notes on the
        checkpoints skipped. ``never`` -> nothing; ``auto`` -> the newest intact one here;
        anything else names one that must load."""
        if resume == "never":
            return None, None, []
        if resume != "auto":
            try:
                return resume, read_path(resume), []
            except OtherStrategy as e:
                raise ConfigError([e.problem(resume, DDP)]) from None
            except Exception as e:  # the user named it: say so, do not fall back
                raise ConfigError([f"resume: cannot load {_first_line(e)} (got {resume})"]) from e
        assert self.store is not None
        skipped = []
        for found in self.list():
            where = self.store.url_of(found.name)
            try:
                return where, read(self.store, found.name), skipped
            except OtherStrategy as e:  # not damaged: written by a run of the other strategy
                raise ConfigError([e.problem(where, DDP)]) from None
            except Exception as e:  # torn, damaged, unreadable: all mean "skip it"
                note = f"{where}: unreadable ({_first_line(e)})"
                log.warning("checkpoint %s; trying an older one", note)
                skipped.append(note)
        return None, None, skipped

    def load(
        self, resume: str, into: Callable[[], dict[str, Any]] | None = None
    ) -> tuple[dict[str, Any] | None, str | None, list[str]]:
        """On every rank: the state rank 0 chose (rank 0 reads it; the others receive it by
        broadcast, so only rank 0 needs to reach the location), its path, and skipped notes.
        (``into``: what a sharded checkpoint loads into; a whole one brings its own tensors.)"""
        where, state, skipped, problem = None, None, [], None
        if self.is_main:
            try:
                where, state, skipped = self.resolve(resume)
            except ConfigError as e:
                problem = e.problems  # every rank must learn it, or the others would hang
        where, skipped, problem = distributed_.broadcast_object((where, skipped, problem))
        if problem:
            raise ConfigError(problem)
        if where is None:
            return None, None, skipped
        return broadcast_state(state), where, skipped


class _Staging:
    """Copies a state off the device into CPU tensors that are kept from save to save (pinned
    on CUDA, where the copies then run asynchronously until one synchronisation). Plain values
    are deep-copied. (torch.distributed.checkpoint's stager does the same, but importing it
    costs every run seconds of CPU at start.)"""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.buffers: dict[int, torch.Tensor] = {}

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        slots = itertools.count()

        def copy(obj: Any) -> Any:
            if isinstance(obj, torch.Tensor):
                i, src = next(slots), obj.detach()
                buf = self.buffers.get(i)
                if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                    pin = self.cuda and src.is_cuda
                    buf = self.buffers[i] = torch.empty(src.shape, dtype=src.dtype, pin_memory=pin)
                return buf.copy_(src, non_blocking=self.cuda)
            if isinstance(obj, dict):
                return {k: copy(v) for k, v in obj.items()}
            if isinstance(obj, list):
                return [copy(v) for v in obj]
            if isinstance(obj, tuple):
                return tuple(copy(v) for v in obj)
            return deepcopy(obj)

        staged = copy(state)
        if self.cuda:
            torch.cuda.current_stream().synchronize()  # the copies are done before the step goes on
        return staged


def _in_background(fn: Callable[..., Any], *args: Any) -> Future:
    """Run ``fn(*args)`` in a daemon thread; its outcome in a Future. (A daemon: a run that
    exits early never waits on a stuck write; the paths that must wait call ``flush``.)"""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as e:
            future.set_exception(e)

    threading.Thread(target=run, name="ddpjob-checkpoint-writer", daemon=True).start()
    return future


def _location_problem(e: StorageError) -> str:
    if is_url(e.url):
        hint = (
            "Check the bucket name, the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) "
            "and, for an S3-compatible server, AWS_ENDPOINT_URL"
        )
    else:
        hint = "Use a writable directory (on a cluster, a volume mounted there)"
    return f"checkpoint.dir: cannot write, read and delete in {e.url} ({e.detail}). {hint}"


def _first_line(e: BaseException, limit: int = 160) -> str:
    text = str(e).strip().splitlines()
    line = f"{type(e).__name__}: {text[0] if text else ''}"
    return line if len(line) <= limit else line[: limit - 3] + "..."
