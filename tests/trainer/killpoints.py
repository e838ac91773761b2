"""Run the real trainer and SIGKILL it at a chosen point inside a checkpoint write; load afterwards.

``python -m tests.trainer.killpoints run BASE N... -- key=value ...`` runs ``python -m trainer``'s
``main`` once per N, each time in a child forked from this process (so torch is imported once),
checkpointing into ``BASE/N/ckpt``. The operations of ``CheckpointManager.save`` are
instrumented from outside (the trainer has no test hooks): every ``write`` of the checkpoint file
(and the middle of it: half a chunk is on disk), ``fsync``, ``os.replace`` (before and after) and
the pruning ``unlink``. Each is a *point*, numbered from 1 over the whole run and appended to
``BASE/N/log`` as ``point <n> <step> <kind>``; at point N the child SIGKILLs itself, so it dies
exactly there, as a preempted pod's trainer would. N = 0 runs to the end (to count the points).
Before each save the log also gets ``state <step> <fingerprint>``: what that checkpoint must
hold. The trainer's output goes to ``BASE/N/out``; stdout gets ``{N: exit status}`` (-9: killed).

``python -m tests.trainer.killpoints load KEEP DIR...`` is the next pod: a fresh process that opens
each directory as the trainer does and prints, per directory, one JSON line with the checkpoint
``load("auto")`` chose and the fingerprint of every checkpoint file there.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch


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
    """Counts the points inside ``save`` and kills the process at the chosen one."""

    def __init__(self, kill_at: int, log: Path):
        self.kill_at, self.n, self.step = kill_at, 0, None
        self.fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def log(self, line: str) -> None:
        os.write(self.fd, f"{line}\n".encode())  # unbuffered: survives the SIGKILL

    def __call__(self, kind: str) -> None:
        if self.step is None:  # not inside a save
            return
        self.n += 1
        self.log(f"point {self.n} {self.step} {kind}")
        if self.n == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


class _File:
    """The checkpoint's temp file, with a point before each write and one halfway through it."""

    def __init__(self, f, point: _Points):
        self.f, self.point = f, point

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        half = len(view) // 2
        self.point("write")
        self.f.write(view[:half])
        self.point("write_half")
        self.f.write(view[half:])
        return len(view)

    def __getattr__(self, name: str):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def _instrument(point: _Points) -> None:
    import builtins

    from trainer import checkpoint

    def wrap(owner, name: str, kind: str, after: str | None = None) -> None:
        real = getattr(owner, name)

        def wrapped(*args, **kwargs):
            point(kind)
            out = real(*args, **kwargs)
            if after:
                point(after)
            return out

        setattr(owner, name, wrapped)

    real_save = checkpoint.CheckpointManager.save

    def save(self, state, step):
        point.log(f"state {step} {fingerprint(state)}")
        point.step = step
        try:
            return real_save(self, state, step)
        finally:
            point.step = None

    def open_(path, mode="r", *args, **kwargs) -> _File:
        return _File(builtins.open(path, mode, *args, **kwargs), point)

    checkpoint.CheckpointManager.save = save
    checkpoint.open = open_  # shadows the builtin for trainer/checkpoint.py alone
    wrap(os, "fsync", "fsync")
    wrap(os, "replace", "replace", after="replaced")
    wrap(Path, "unlink", "unlink")


def run(base: Path, kill_points: list[int], trainer_args: list[str]) -> dict[int, int]:
    """One trainer run per kill point, each a child forked from this process (torch is imported
    once, here), checkpointing into ``base/<n>/ckpt``; returns each child's exit status the way
    subprocess reports it (``-9``: SIGKILL)."""
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
                code = main([*trainer_args, f"checkpoint.dir={d / 'ckpt'}"])
            finally:
                sys.stdout.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        statuses[n] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return statuses


def load(keep: int, directories: list[str]) -> None:
    from trainer.checkpoint import CheckpointManager, read

    for d in directories:
        mgr = CheckpointManager(d, keep=keep, is_main=True)  # as a restarted trainer opens it
        state, path, skipped = mgr.load("auto")
        files = {}
        for p in mgr.list():
            try:
                files[p.name] = fingerprint(read(p))
            except Exception as e:  # a torn file under a checkpoint name: the test fails on it
                files[p.name] = f"unreadable: {type(e).__name__}: {e}"
        chosen = state and {"name": path.name, "step": state["step"], "fp": fingerprint(state)}
        leftovers = sorted(p.name for p in Path(d).iterdir() if p.name not in files)
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
