"""A task plug-in for the tests (``task=tests.trainer.tasks:build``): tiny, fast, observable.

A small MLP classifies random vectors. Each sample carries its dataset index and the DataLoader
worker that loaded it, and in train mode the task appends what it saw to
``record_dir/rank<R>.jsonl`` (one line per micro-batch: the indices, the workers, the autocast
dtype, whether torch's deterministic algorithms are on), so a test can compare the exact sample
order of two runs. It can scale the loss (and so the gradients) and give the model a layer its
forward never uses. It can also inject faults on chosen micro-batch calls: a NaN loss, an fp16
gradient overflow, or a sleep to slow a run down; and on one rank: a hang (a long sleep at one
call, in :func:`hang_here`), a slower step (a sleep at every call, and a longer one at the
first), or a slow checkpoint (a sleep while its state is read, in :func:`slow_state_dict`). With
``chatter``, every rank prints a long line at every step, in pieces (:data:`CHATTER`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, get_worker_info


class Samples(Dataset):
    """``(x, y, index, worker)``, ``worker`` the id of the DataLoader worker (-1: main process)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, offset: int):
        self.x, self.y, self.offset = x, y, offset

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        info = get_worker_info()
        return self.x[i], self.y[i], self.offset + i, -1 if info is None else info.id


class WithSpare(nn.Module):
    """A model plus a layer that its forward never calls: that layer gets no gradient."""

    def __init__(self, model: nn.Module, spare: nn.Module):
        super().__init__()
        self.model, self.spare = model, spare

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class RecordingTask:
    def __init__(
        self,
        n: int = 256,
        dim: int = 8,
        hidden: int = 16,
        classes: int = 4,
        dropout: float = 0.0,
        record_dir: str | None = None,
        nan_calls: tuple[int, ...] = (),
        nan_ranks: tuple[int, ...] | None = None,
        overflow_calls: tuple[int, ...] = (),
        sleep_s: float = 0.0,
        hang_rank: int | None = None,
        hang_call: int = 0,
        hang_s: float = 0.0,
        hang_release: str | None = None,
        slow_rank: int | None = None,
        slow_s: float = 0.0,
        slow_first_s: float = 0.0,
        slow_state_rank: int | None = None,
        slow_state_s: float = 0.0,
        loss_scale: float = 1.0,
        unused_layer: bool = False,
        chatter: int = 0,
    ):
        self.n, self.dim, self.hidden, self.classes, self.dropout = n, dim, hidden, classes, dropout
        self.record_dir = Path(record_dir) if record_dir else None
        self.nan_calls = set(nan_calls)
        self.nan_ranks = None if nan_ranks is None else set(nan_ranks)
        self.overflow_calls = set(overflow_calls)
        self.sleep_s = sleep_s
        self.loss_scale, self.unused_layer = loss_scale, unused_layer
        self.chatter = chatter
        self.calls = 0
        self.rank = int(os.environ.get("RANK", "0"))
        self.hang_s = hang_s if hang_rank == self.rank else 0.0
        self.hang_call, self.hang_release = hang_call, hang_release
        self.slow_s = slow_s if slow_rank == self.rank else 0.0
        self.slow_first_s = slow_first_s if slow_rank == self.rank else 0.0
        self.slow_state_s = slow_state_s if slow_state_rank == self.rank else 0.0

    def build_model(self) -> nn.Module:
        model = nn.Sequential(
            nn.Linear(self.dim, self.hidden),
            nn.ReLU(),
            nn.Dropout(self.dropout),
            nn.Linear(self.hidden, self.classes),
        )
        if self.slow_state_s:
            seconds = self.slow_state_s
            model.register_state_dict_pre_hook(lambda *_: slow_state_dict(seconds))
        return WithSpare(model, nn.Linear(self.dim, self.classes)) if self.unused_layer else model

    def build_datasets(self):
        g = torch.Generator().manual_seed(0)
        w = torch.randn(self.dim, self.classes, generator=g)

        def make(n: int, offset: int) -> Samples:
            x = torch.randn(n, self.dim, generator=g)
            return Samples(x, (x @ w).argmax(dim=1), offset)

        return make(self.n, 0), make(64, self.n)

    def loss(self, model: nn.Module, batch):
        x, y, ids, workers = batch
        logits = model(x)
        loss = F.cross_entropy(logits, y) * self.loss_scale
        if model.training:
            self.calls += 1
            if self.record_dir is not None:
                self.record_dir.mkdir(parents=True, exist_ok=True)
                record = {
                    "ids": ids.tolist(),
                    "workers": sorted(set(workers.tolist())),
                    "dtype": str(logits.dtype),
                    "deterministic": torch.are_deterministic_algorithms_enabled(),
                    "cublas_workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                }
                with open(self.record_dir / f"rank{self.rank}.jsonl", "a") as f:
                    f.write(json.dumps(record) + "\n")
            if self.calls in self.nan_calls and (
                self.nan_ranks is None or self.rank in self.nan_ranks
            ):
                loss = loss * float("nan")
            if self.calls in self.overflow_calls:
                # d(loss)/d(logits) = 1 per element: times fp16's loss scale (65536) it
                # overflows fp16 (max 65504) in backward, while the loss itself stays finite.
                loss = loss + logits.sum()
            if self.chatter:
                # A long line in pieces: unbuffered, print writes each argument on its own.
                print(CHATTER, self.rank, self.calls, *["x" * 50] * self.chatter)
            if self.sleep_s:
                time.sleep(self.sleep_s)
            if self.slow_s:
                time.sleep(self.slow_s)
            if self.slow_first_s and self.calls == 1:
                time.sleep(self.slow_first_s)
            if self.hang_s and self.calls == self.hang_call:
                hang_here(self.hang_s, self.hang_release)
        return loss, {"accuracy": (logits.argmax(1) == y).float().mean()}


def hang_here(seconds: float, release: str | None = None) -> None:
    """Where a hung rank is: the ``stuck`` events name this function and its sleep. It says when
    it started on stderr (``HANGS``), for a test that times how soon the hang is named. It ends
    after ``seconds``, or as soon as the file ``release`` exists (a test that ends the hang
    once it has been named)."""
    print(f"{HANGS} {time.time():.3f}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (release and os.path.exists(release)):
        time.sleep(min(0.05, seconds))


#: What a task with ``chatter`` prints first in each line it prints at every training step.
CHATTER = "CHATTER"
#: What :func:`hang_here` prints first, then the time (seconds since the epoch).
HANGS = "hang_here: hanging from"


def slow_state_dict(seconds: float) -> None:
    """A checkpoint that takes ``seconds`` longer to read the model's state on this rank."""
    time.sleep(seconds)


def build(**kwargs) -> RecordingTask:
    for key in ("nan_calls", "nan_ranks", "overflow_calls"):
        if kwargs.get(key) is not None:
            kwargs[key] = tuple(kwargs[key])
    return RecordingTask(**kwargs)
