"""Run the real trainer and SIGKILL it at a chosen point inside a checkpoint write; load afterwards.

``python -m tests.trainer.killpoints run BASE N... -- key=value ...`` runs ``python -m trainer``'s
``main`` once per N, each time in a child forked from this process (so torch is imported once),
checkpointing into ``BASE/N/ckpt``. The operations of a checkpoint's background write are
instrumented from outside (the trainer has no test hooks): every ``write`` of a file (and the
middle of it: half a chunk is on disk), ``fsync``, ``os.replace`` (before and after), and each
``unlink`` and ``rmdir`` (the manifest removed before a step is written again, pruning). Each is
a *point*, numbered from 1 over the whole run and appended to ``BASE/N/log`` as
``point <n> <step> <kind> <object>`` (``state.pt``, ``manifest.json``, a step's directory, or
``-``); at point N the child SIGKILLs itself, so it dies exactly there, as a preempted pod's
trainer would, with its training thread wherever it had got to. N = 0 runs to the end (to count
the points). Before each save the log also gets ``state <step> <fingerprint>``: what that
checkpoint must hold. The trainer's output goes to ``BASE/N/out``; stdout gets
``{N: exit status}`` (-9: killed).

``python -m tests.trainer.killpoints load KEEP DIR...`` is the next pod: a fresh process that opens
each directory as the trainer does and prints, per directory, one JSON line with the checkpoint
``load("auto")`` chose, the fingerprint of every complete checkpoint there, and any other file.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import torch

#: The ledger's writer (trainer/health/ledger.py): its small record beside the checkpoints is none.
LEDGER = "ddpjob-ledger"
#: Checkpoint into this bucket (``s3://name``), not into a local directory.
S3 = "KILLPOINTS_S3" in os.environ


def fingerprint(state: dict[str, Any]) -> str:
    """A hash of the step, the weights and the optimizer state: equal only for the same state."""
    h = hashlib.sha256(str(state["step"]).encode())
    tensors = [*state["model"].items()]
    for i, s in sorted(state["optimizer"]["state"].items()):
        tensors += [(f"opt.{i}.{k}", v) for k, v in sorted(s.items()) if torch.is_tensor(v)]
    for name, t in sorted(tensors):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class _Points:
    """Counts the points inside checkpoint writes and kills the process at the chosen one."""

    def __init__(self, kill_at: int, log: Path):
        self.kill_at, self.n, self.step = kill_at, 0, None
        self.fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def log(self, line: str) -> None:
        os.write(self.fd, f"{line}\n".encode())  # unbuffered: survives the SIGKILL

    def __call__(self, kind: str, name: str = "-") -> None:
        thread = threading.current_thread()
        if self.step is None or thread is threading.main_thread() or thread.name == LEDGER:
            return  # not inside a write (the probe, the start's clean-up, the loop, the ledger)
        self.n += 1
        self.log(f"point {self.n} {self.step} {kind} {name}")
        if self.n == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


class _File:
    """A file being written, with a point before each write and one halfway through it."""

    def __init__(self, f, point: _Points, name: str):
        self.f, self.point, self.name = f, point, name

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        half = len(view) // 2
        self.point("write", self.name)
        self.f.write(view[:half])
        self.point("write_half", self.name)
        self.f.write(view[half:])
        return len(view)

    def __getattr__(self, name: str):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def _final_name(path) -> str:
    """``.../step_00000003/.state.pt.tmp-12`` -> ``state.pt``: the object an operation is for."""
    name = Path(path).name
    return name[1 : name.index(".tmp-")] if ".tmp-" in name else name


def _instrument(point: _Points) -> None:
    import builtins

    from trainer.checkpoint import manager, storage

    def wrap(owner, name: str, kind: str, after: str | None = None, path_arg: int = 0) -> None:
        real = getattr(owner, name)

        def wrapped(*args, **kwargs):
            target = _final_name(args[path_arg]) if len(args) > path_arg else "-"
            point(kind, target)
            out = real(*args, **kwargs)
            if after:
                point(after, target)
            return out

        setattr(owner, name, wrapped)

    real_save, real_write = manager.CheckpointManager.save, manager.CheckpointManager._write

    def save(self, step, state_dict):
        def capture():
            state = state_dict()
            if state is not None:
                point.log(f"state {step} {fingerprint(state)}")
            return state

        return real_save(self, step, capture)

    def write(self, staged, step, stall_s):
        point.step = step
        try:
            return real_write(self, staged, step, stall_s)
        finally:
            point.step = None

    def open_(path, mode="r", *args, **kwargs):
        f = builtins.open(path, mode, *args, **kwargs)  # noqa: SIM115 (the caller closes it)
        return _File(f, point, _final_name(path)) if "w" in mode else f

    manager.CheckpointManager.save = save
    manager.CheckpointManager._write = write
    storage.open = open_  # shadows the builtin for trainer/checkpoint/storage.py alone
    wrap(os, "fsync", "fsync", path_arg=99)  # a file descriptor: no name
    wrap(os, "replace", "replace", after="replaced", path_arg=1)
    wrap(Path, "unlink", "unlink")
    wrap(Path, "rmdir", "rmdir")

    # On S3: a point before and after every request (its object: the key's last part). One
    # request at a time and 5 MiB parts, so that every run makes the same requests in order.
    storage.PART_BYTES, storage.CONCURRENCY = 5 << 20, 1
    real_client = storage.s3_client

    def s3_client(*args, **kwargs):
        client = real_client(*args, **kwargs)

        def before(model, params, context, **_) -> None:
            context["killpoints"] = params.get("Key", "-").rpartition("/")[2] or "-"
            point(f"before:{model.name}", context["killpoints"])

        def after(model, context, **_) -> None:
            point(f"after:{model.name}", context.get("killpoints", "-"))

        client.meta.events.register("provide-client-params.s3.*", before)
        client.meta.events.register("after-call.s3.*", after)
        return client

    storage.s3_client = s3_client


def run(base: Path, kill_points: list[int], trainer_args: list[str]) -> dict[int, int]:
    """One trainer run per kill point, each a child forked from this process (torch is imported
    once, here), checkpointing into ``base/<n>/ckpt`` (or ``$KILLPOINTS_S3/<n>``, an ``s3://``
    bucket); returns each child's exit status the way subprocess reports it (``-9``: SIGKILL)."""
    import trainer.train  # noqa: F401  (what every child needs, imported before the forks)
    from trainer.__main__ import main

    # torch.optim imports torch._dynamo on first use: ~2 s of CPU that every child would repeat.
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])

    statuses = {}
    for n in kill_points:
        # A child may use CUDA (a GPU host's RNG state) only if this parent never did.
        assert not torch.cuda.is_initialized(), "CUDA cannot be used again in a forked child"
        d = base / str(n)
        d.mkdir(parents=True)
        pid = os.fork()
        if pid == 0:  # the child: instrument, train, and (unless killed) exit with main's code
            out = os.open(d / "out", os.O_WRONLY | os.O_CREAT)
            os.dup2(out, 1)
            os.dup2(out, 2)
            _instrument(_Points(n, d / "log"))
            code = 1
            try:
                where = f"{os.environ['KILLPOINTS_S3']}/{n}" if S3 else d / "ckpt"
                code = main([*trainer_args, f"checkpoint.dir={where}"])
            finally:
                sys.stdout.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        statuses[n] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return statuses


def load(keep: int, directories: list[str]) -> None:
    from trainer.checkpoint.manager import CheckpointManager, read
    from trainer.health.ledger import RECORD

    for d in directories:
        mgr = CheckpointManager(d, keep=keep, is_main=True)  # as a restarted trainer opens it
        state, path, skipped = mgr.load("auto")
        files, kept = {}, set()
        for found in mgr.list():
            kept |= set(found.objects)
            try:
                files[found.name] = fingerprint(read(mgr.store, found.name))
            except Exception as e:  # a damaged checkpoint that counts as complete: the test fails
                files[found.name] = f"unreadable: {type(e).__name__}: {e}"
        fp = state and fingerprint(state)
        chosen = state and {"name": Path(path).name, "step": state["step"], "fp": fp}
        leftovers = sorted(set(mgr.store.list()) - kept - {RECORD})
        if d.startswith("s3://"):
            uploads = mgr.store.client.list_multipart_uploads(
                Bucket=mgr.store.bucket, Prefix=f"{mgr.store.prefix}/"
            )
            leftovers += [f"open upload {u['Key']}" for u in uploads.get("Uploads", [])]
        else:
            leftovers += [str(p.relative_to(d)) for p in Path(d).rglob("*") if p.is_dir()]
            leftovers = [x for x in leftovers if not any(k.startswith(f"{x}/") for k in kept)]
        print(
            json.dumps(
                {"dir": d, "chosen": chosen, "skipped": skipped, "files": files, "other": leftovers}
            ),
            flush=True,
        )


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "run":
        base, *points = rest[: rest.index("--")]
        statuses = run(Path(base), [int(n) for n in points], rest[rest.index("--") + 1 :])
        print(json.dumps(statuses))
        sys.exit(0)
    keep, *dirs = rest
    load(int(keep), dirs)
